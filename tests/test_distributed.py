"""The rank-r layers under DDP and FSDP2 (``fully_shard``): two CPU processes (gloo).

Each process trains a residual block ``y = mlp(x); y += x`` (the in-place residual of a
transformer block) on its half of a batch; the averaged gradients and the weights after
two SGD steps must equal those of one process training on the whole batch. On the
shards, what needs the full weights (``to_linear``, ``to_dense``, the views of an unevenly
sharded weight) raises naming the fix, and works after ``unshard()``.
"""
import os
import socket
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from conftest import RANK_R
from qkmlp import GatedMLP, SymmetricBilinearMLP

D, M, N, STEPS, LR = 6, 5, 8, 2, 0.1
CASES = [(cls, rank) for cls in RANK_R for rank in (1, 2)]


class Block(nn.Module):
    """A residual block with the in-place add that FSDP2 must survive."""

    def __init__(self, mlp):
        super().__init__()
        self.mlp = mlp

    def forward(self, x):
        y = self.mlp(x)
        y += x
        return y


def _make(cls, rank):
    torch.manual_seed(0)
    return Block(cls(D, M, rank=rank, dtype=torch.float64))


def _data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(STEPS, N, 3, D, generator=g, dtype=torch.float64)


def _train(model, xs, full=lambda t: t):
    """SGD on mean squared output; returns the gradients of the first step and the final weights."""
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    first = None
    for x in xs:
        opt.zero_grad()
        model(x).square().mean().backward()
        if first is None:
            first = {n: full(p.grad).clone() for n, p in model.named_parameters()}
        opt.step()
    return first, {n: full(p.detach()).clone() for n, p in model.named_parameters()}


def _worker(rank, world, port, errfile):
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        torch.set_num_threads(1)
        dist.init_process_group("gloo", rank=rank, world_size=world)
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        from torch.nn.parallel import DistributedDataParallel as DDP

        mesh = init_device_mesh("cpu", (world,))
        xs = _data()
        mine = xs[:, rank * N // world:(rank + 1) * N // world]
        for cls, r in CASES:
            want_g, want_w = _train(_make(cls, r), xs)
            got_g, got_w = _train(DDP(_make(cls, r)), mine)
            for n in want_g:
                torch.testing.assert_close(got_g["module." + n], want_g[n], msg=f"DDP {cls.__name__} r{r} grad {n}")
                torch.testing.assert_close(got_w["module." + n], want_w[n], msg=f"DDP {cls.__name__} r{r} {n}")
            model = _make(cls, r)
            fully_shard(model.mlp, mesh=mesh)
            fully_shard(model, mesh=mesh)
            got_g, got_w = _train(model, mine, full=lambda t: t.full_tensor())
            for n in want_g:
                torch.testing.assert_close(got_g[n], want_g[n], msg=f"FSDP2 {cls.__name__} r{r} grad {n}")
                torch.testing.assert_close(got_w[n], want_w[n], msg=f"FSDP2 {cls.__name__} r{r} {n}")
            _sharded_errors_name_the_fix(model.mlp, got_w)
        dist.destroy_process_group()
    except BaseException:
        with open(f"{errfile}.{rank}", "w") as f:
            f.write(traceback.format_exc())
        raise


def _sharded_errors_name_the_fix(layer, full):
    """On FSDP2 shards, what needs the full weights raises naming the fix; after
    ``unshard()`` it works and gives what the full weights give."""
    fix = r"needs the full weights.*unshard first.*full state dict"
    if layer.rank > 1 and layer.d_hidden % 2:   # (m·r, d) in two shards cannot unflatten to (m, r, d)
        with pytest.raises(RuntimeError, match=r"layer.query " + fix):
            layer.query
    if isinstance(layer, GatedMLP):
        with pytest.raises(RuntimeError, match=r"GatedMLP.to_linear\(\) " + fix):
            layer.to_linear()
    if isinstance(layer, SymmetricBilinearMLP):
        with pytest.raises(RuntimeError, match=r"to_dense\(\) " + fix):
            layer.to_dense()
    layer.unshard()
    try:
        q = full["mlp.query_weight"].view(layer.d_hidden, layer.rank, layer.d_model)
        assert torch.equal(layer.query, q)
        if isinstance(layer, GatedMLP):
            gate, up, down = layer.to_linear()
            assert torch.equal(gate.weight, full["mlp.query_weight"])
            assert torch.equal(up.weight, full["mlp.key_weight"])
            assert torch.equal(down.weight, full["mlp.value"].repeat_interleave(layer.rank, 0).T)
    finally:
        layer.reshard()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="torch.distributed with gloo is not available")
def test_ddp_and_fully_shard_match_one_process(tmp_path):
    errfile = str(tmp_path / "err")
    try:
        mp.spawn(_worker, args=(2, _free_port(), errfile), nprocs=2, join=True)
    except Exception as e:
        logs = "\n".join(p.read_text() for p in sorted(tmp_path.glob("err.*")))
        pytest.fail(f"a worker failed: {e}\n{logs}")
