"""qkmlp.pretrained.retrain on a tiny random Llama (float64, byte tokens): the arms against
the plain formula written on the Hugging Face model's own weights, the schedule against
its formula, training, checkpoints, the grid's resume and parts, assembly, and the
code-version guard (a tiny run compared with a stored reference).

``python tests/test_retrain.py --write-reference`` rewrites the reference after a
deliberate change of the training numerics (bump ``CODE_VERSION`` first).
"""
from __future__ import annotations

import copy
import json
import math
import random
import sys
import threading
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

transformers = pytest.importorskip("transformers", reason="transformers is pinned in requirements.txt")
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from qkmlp.pretrained import retrain as R  # noqa: E402
from qkmlp.pretrained.retrain import core, grid as G  # noqa: E402
from byte_tokenizer import ByteTokenizer  # noqa: E402
from numerics_tolerance import ABS_TOL, REL_TOL, perturbed_retrain_runs  # noqa: E402

F64 = torch.float64
REFERENCE = Path(__file__).with_name("retrain_reference.json")


def tiny_llama(seed=0):
    """A 3-layer Llama with every weight drawn here (not by transformers' initialiser, so
    the reference run does not move with it); gate and up rows large enough that σ bends."""
    cfg = LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      hidden_act="silu", tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).to(F64).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g, dtype=F64))
            else:
                scale = 1.0 if ("gate_proj" in name or "up_proj" in name) else 0.3
                p.copy_(scale * torch.randn(p.shape, generator=g, dtype=F64) / math.sqrt(p.shape[-1]))
    return model


def _words(seed, n):
    rng = random.Random(seed)
    vocab = ["the", "king", "shall", "come", "to", "thee", "def", "return", "self", "x", "and", "none", "of"]
    return " ".join(rng.choice(vocab) for _ in range(n)) + "\n"


TEXTS = {"train_a": _words(1, 600), "train_b": _words(2, 600), "val_a": _words(3, 200), "val_b": _words(4, 200),
         "held_a": _words(5, 200), "held_b": "zzz qqq " * 100}


def tiny_cfg(**kw):
    base = dict(arm_blocks=[["gated", "symmetrized", "symmetric"], ["swapped"]], seeds=[0, 1], tune_seeds=[100],
                lrs=[1e-3, 1e-2], lr_extensions=1, steps=6, tune_steps=4, batch_size=4, seq_len=16,
                train_texts=["train_a", "train_b"], validation_texts=["val_a", "val_b"],
                heldout_texts=["held_a", "held_b"], main_text="held_b", n_windows=3, eval_every=3,
                eval_early=[1], eval_batch=2, gen_tokens=3, checkpoint_every=2, dtype="float64")
    base.update(kw)
    return G.config("smoke", **base)


def tiny_data(cfg):
    return core.TextData(ByteTokenizer(), TEXTS, train=cfg["train_texts"], heldout=cfg["heldout_texts"],
                         validation=cfg["validation_texts"], n_windows=cfg["n_windows"], seq_len=cfg["seq_len"])


def run_kwargs(cfg, **kw):
    out = dict(batch_size=cfg["batch_size"], warmup_frac=cfg["warmup_frac"], final_frac=cfg["final_frac"],
               weight_decay=cfg["weight_decay"], betas=cfg["betas"], grad_clip=cfg["grad_clip"],
               trainable=cfg["trainable"], eval_every=cfg["eval_every"], eval_early=cfg["eval_early"],
               eval_batch=cfg["eval_batch"])
    out.update(kw)
    return out


# --- the plain formulas, on the Hugging Face MLP's own weights ----------------------------

class PlainMLP(nn.Module):
    def __init__(self, mlp, arm):
        super().__init__()
        self.gate, self.up, self.down = (copy.deepcopy(getattr(mlp, n).weight) for n in ("gate_proj", "up_proj", "down_proj"))
        self.arm = arm

    def forward(self, x):
        a, b = x @ self.gate.T, x @ self.up.T
        h = {"gated": F.silu(a) * b, "symmetrized": 0.5 * (F.silu(a) * b + F.silu(b) * a),
             "symmetric": F.silu(a * b), "swapped": F.silu(b) * a, "identity": a * b}[self.arm]
        return h @ self.down.T


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny ops on a busy 2-core machine: one thread (two spin-wait for each other)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, 256, (3, 12), generator=torch.Generator().manual_seed(7))


@pytest.mark.parametrize("arm", list(R.ARMS))
def test_each_arm_at_step_zero_is_the_plain_formula_on_the_trained_weights(arm, ids):
    hf = tiny_llama()
    ref = copy.deepcopy(hf)
    for layer in ref.model.layers:
        layer.mlp = PlainMLP(layer.mlp, arm)
    model = copy.deepcopy(hf)
    layers = R.build_arm(model, arm)
    params = core.set_trainable(model, "mlp")
    with torch.no_grad():
        got = model(input_ids=ids, use_cache=False).logits
        want = ref(input_ids=ids, use_cache=False).logits
        plain_hf = hf(input_ids=ids, use_cache=False).logits
    assert torch.allclose(got, want, rtol=0, atol=1e-12), (got - want).abs().max()
    # the arms differ from the model (so the comparison above could fail), the control does not
    diff = (got - plain_hf).abs().max()
    assert (diff < 1e-12) if arm == "gated" else (diff > 1e-3), diff
    assert {id(p) for p in params} == {id(p) for m in layers for p in m.parameters()}
    assert all(p.requires_grad for p in params) and len(params) == 3 * 3
    assert not any(p.requires_grad for n, p in model.named_parameters() if ".mlp." not in n)


def test_unknown_arm_and_trainable_are_refused():
    with pytest.raises(ValueError, match="unknown arm 'sym'.*gated"):
        R.build_arm(tiny_llama(), "sym")
    with pytest.raises(ValueError, match="trainable must be 'mlp' or 'all'"):
        core.set_trainable(tiny_llama(), "attention")
    with pytest.raises(ValueError, match="unknown config keys"):
        tiny_cfg(step=3)
    with pytest.raises(ValueError, match="control 'gated'"):
        tiny_cfg(arm_blocks=[["symmetric"]])


def test_windows_mix_the_training_texts_and_follow_the_seed():
    cfg = tiny_cfg()
    data = tiny_data(cfg)
    s0, s0b, s1 = (R.draw_starts(data, s, 50, 4) for s in (0, 0, 1))
    assert torch.equal(s0, s0b) and not torch.equal(s0, s1)
    assert (s0[:, :2, 0] == 0).all() and (s0[:, 2:, 0] == 1).all()
    for i, name in enumerate(("train_a", "train_b")):
        n = data.train[name].numel()
        assert s0[:, 2 * i:2 * i + 2, 1].min() >= 0 and s0[:, 2 * i:2 * i + 2, 1].max() <= n - cfg["seq_len"]
    b = core.batch_at(data, s0, 3)
    t, s = s0[3, 2].tolist()
    assert torch.equal(b[2], torch.tensor(list(TEXTS["train_b"].encode()))[s:s + 16])
    with pytest.raises(ValueError, match="multiple of the number of training texts"):
        R.draw_starts(data, 0, 5, 3)


def test_eval_points():
    assert R.eval_points(500, 50, [10, 25]) == [0, 10, 25, 50, 100, 150, 200, 250, 300, 350, 400, 450, 500]
    assert R.eval_points(7, 3) == [0, 3, 6, 7]


def test_schedule_and_clipping_follow_their_formulas():
    cfg = tiny_cfg()
    steps, lr, warm = 20, 0.01, 2                     # warm-up = round(0.1 * 20) steps
    rec = R.train_run(tiny_llama(), tiny_data(cfg), arm="gated", seed=0, lr=lr, steps=steps,
                      **run_kwargs(cfg, warmup_frac=0.1, grad_clip=0.05))
    for t, got in enumerate(rec["lr_per_step"]):      # linear warm-up over 2 steps, cosine to 10 %
        if t < warm:
            want = lr * (t + 1) / warm
        else:
            want = lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (t - warm) / (steps - warm))))
        assert got == pytest.approx(want, rel=1e-12)
    assert max(rec["grad_norm"]) > 0.05                   # the clip is active in this run


def test_training_lowers_the_controls_loss_on_its_own_windows():
    cfg = tiny_cfg()
    data = tiny_data(cfg)
    model = tiny_llama()
    starts = R.draw_starts(data, 99, 8, 4)
    fixed = torch.cat([core.batch_at(data, starts, t) for t in range(8)])

    def loss(m):
        with torch.no_grad():
            logits = m(input_ids=fixed, use_cache=False).logits[:, :-1]
            return float(F.cross_entropy(logits.reshape(-1, 256), fixed[:, 1:].reshape(-1)))

    before = loss(model)
    rec = R.train_run(model, data, arm="gated", seed=0, lr=3e-3, steps=40, **run_kwargs(cfg))
    after = loss(model)
    assert after < before - 0.3, (before, after)
    assert sum(rec["train_loss"][-5:]) < sum(rec["train_loss"][:5])
    assert rec["curve"]["step"] == [0, 1, 3, 6, 9, 12, 15, 18, 21, 24, 27, 30, 33, 36, 39, 40]
    v = rec["curve"]["validation"]["val_a"]
    assert v[0] is not None and v[-1] is not None and all(x is None for x in v[1:-1])
    assert rec["val_loss"] == pytest.approx((sum(rec["windows_after"]["val_a"]) / 3
                                             + sum(rec["windows_after"]["val_b"]) / 3) / 2)


def _numbers(rec):
    return {k: v for k, v in rec.items() if k not in ("wall_s", "cpu_s", "resumed_at", "date_utc", "host")}


def test_a_run_stopped_at_a_checkpoint_resumes_to_the_same_record(tmp_path):
    cfg = tiny_cfg()
    data = tiny_data(cfg)
    kw = run_kwargs(cfg, checkpoint_every=2)
    whole = R.train_run(tiny_llama(), data, arm="symmetrized", seed=3, lr=5e-3, steps=9, **kw)
    ckpt = tmp_path / "run.pt"
    with pytest.raises(core.Interrupted):
        R.train_run(tiny_llama(), data, arm="symmetrized", seed=3, lr=5e-3, steps=9, checkpoint=ckpt, key="k",
                    stop_after=5, **kw)
    assert ckpt.exists()
    resumed = R.train_run(tiny_llama(), data, arm="symmetrized", seed=3, lr=5e-3, steps=9, checkpoint=ckpt,
                          key="k", **kw)
    assert resumed["resumed_at"] == [4] and not ckpt.exists()
    assert _numbers(resumed) == _numbers(whole)
    # a checkpoint of another run (another key) is not used
    with pytest.raises(core.Interrupted):
        R.train_run(tiny_llama(), data, arm="symmetrized", seed=3, lr=5e-3, steps=9, checkpoint=ckpt, key="k",
                    stop_after=5, **kw)
    other = R.train_run(tiny_llama(), data, arm="symmetrized", seed=4, lr=5e-3, steps=9, checkpoint=ckpt,
                        key="other", **kw)
    assert other["resumed_at"] == []


class Counter:
    def __init__(self, fail=False):
        self.calls, self.fail = 0, fail

    def __call__(self):
        if self.fail:
            raise AssertionError("the model was needed: a job was trained")
        self.calls += 1
        return tiny_llama(), ByteTokenizer()


def tiny_grid(cfg, folder, factory=None, **kw):
    sha = {n: G.hashlib.sha256(s.encode()).hexdigest() for n, s in TEXTS.items()}
    return G.Grid(cfg, factory or Counter(), TEXTS, model_id="tiny", texts_sha=sha, records=folder,
                  log=lambda m: None, **kw)


@pytest.fixture(scope="module")
def grid_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("records")
    g = tiny_grid(tiny_cfg(), folder)
    g.run()
    return folder, g


def test_grid_runs_tuning_then_every_arm_and_seed(grid_folder):
    folder, g = grid_folder
    files = sorted(p.name for p in folder.glob("*.json"))
    tune = [f for f in files if f.startswith("tune-")]
    main = [f for f in files if f.startswith("main-")]
    assert len(main) == 4 * 2 and all(g.key in f for f in files)
    recs = [json.loads((folder / f).read_text()) for f in tune]
    by_lr = {r["lr"]: r["val_loss"] for r in recs}
    # two rates are both edges, so the winner of [1e-3, 1e-2] adds one more past it (ratio 10)
    first = min((1e-3, 1e-2), key=by_lr.get)
    extra = 1e-4 if first == 1e-3 else 0.1
    assert sorted(by_lr) == sorted([1e-3, 1e-2, extra])
    best = min(by_lr, key=by_lr.get)
    chosen = {json.loads((folder / f).read_text())["lr"] for f in main}
    assert chosen == {best}
    control = json.loads(g.path("main", "gated", best, 0).read_text())
    for n in ("held_a", "held_b"):               # step 0 of the control = transformers alone
        assert control["heldout_transformers"][n] == pytest.approx(control["windows_before"][n], abs=1e-12)
    assert control["loss_before"] == pytest.approx(sum(control["windows_before"]["held_b"]) / 3)
    assert control["loss_after"] == pytest.approx(sum(control["windows_after"]["held_b"]) / 3)
    assert control["code_version"] == G.CODE_VERSION and len(control["generations"]) == 3
    sym = json.loads(g.path("main", "symmetric", best, 0).read_text())
    assert sym["loss_before"] != control["loss_before"]


def test_resuming_from_the_records_trains_nothing_and_gives_the_same_results(grid_folder, tmp_path):
    folder, g = grid_folder
    before = {p.name: p.read_bytes() for p in folder.glob("*.json")}
    again = tiny_grid(tiny_cfg(), folder, factory=Counter(fail=True))
    again.run()
    assert again.computed == [] and {p.name: p.read_bytes() for p in folder.glob("*.json")} == before
    a = G.assemble(g, command="x")
    b = G.assemble(again, command="x")
    assert a["runs"] == b["runs"] and a["tuning"] == b["tuning"]
    # a fresh process in another folder with one main record deleted retrains that one alone
    copy_dir = tmp_path / "copy"
    copy_dir.mkdir()
    for name, data in before.items():
        (copy_dir / name).write_bytes(data)
    victim = sorted(copy_dir.glob("main-symmetric-*-s1-*.json"))[0]
    old = json.loads(victim.read_text())
    victim.unlink()
    counter = Counter()
    third = tiny_grid(tiny_cfg(), copy_dir, factory=counter)
    third.run()
    assert third.computed == [str(victim)] and counter.calls == 1
    assert _numbers(json.loads(victim.read_text())) == _numbers(old)


def test_parts_share_the_work_and_give_the_same_records(grid_folder, tmp_path):
    folder, _ = grid_folder
    grids = [tiny_grid(tiny_cfg(), tmp_path, part=(k, 2), poll_s=0.05) for k in (1, 2)]
    errors = []

    def go(g):
        try:
            g.run()
        except Exception as e:          # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=go, args=(g,)) for g in grids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and not any(t.is_alive() for t in threads)
    assert grids[0].computed and grids[1].computed
    assert not set(grids[0].computed) & set(grids[1].computed)
    for p in folder.glob("*.json"):
        assert _numbers(json.loads((tmp_path / p.name).read_text())) == _numbers(json.loads(p.read_text()))


def test_assemble_reads_the_records_and_names_what_is_missing(grid_folder, tmp_path):
    folder, g = grid_folder
    res = G.assemble(g, command="cmd")
    assert [(r["arm"], r["seed"]) for r in res["runs"]] == [
        ("gated", 0), ("symmetrized", 0), ("symmetric", 0), ("gated", 1), ("symmetrized", 1), ("symmetric", 1),
        ("swapped", 0), ("swapped", 1)]
    assert res["meta"]["missing"] == [] and res["meta"]["code_version"] == G.CODE_VERSION
    assert res["texts"]["held_b"]["sha256"] == G.hashlib.sha256(TEXTS["held_b"].encode()).hexdigest()
    assert res["tuning"]["lr"] == res["runs"][0]["lr"]
    for name in [p.name for p in folder.glob("*.json")]:
        (tmp_path / name).write_bytes((folder / name).read_bytes())
    next(tmp_path.glob("main-swapped-*-s1-*.json")).unlink()
    partial = tiny_grid(tiny_cfg(), tmp_path, factory=Counter(fail=True))
    with pytest.raises(FileNotFoundError, match="1 main records missing"):
        G.assemble(partial)
    res = G.assemble(partial, allow_missing=True)
    assert len(res["runs"]) == 7 and len(res["meta"]["missing"]) == 1
    next(tmp_path.glob("tune-*.json")).unlink()
    with pytest.raises(FileNotFoundError, match="records missing"):
        G.assemble(partial, allow_missing=True)


def test_choose_lr():
    runs = [{"lr": 1e-4, "val_loss": 2.0}, {"lr": 1e-4, "val_loss": 2.2}, {"lr": 3e-4, "val_loss": 2.05},
            {"lr": 3e-4, "val_loss": 2.05}, {"lr": 1e-3, "val_loss": float("nan")}, {"lr": 1e-3, "val_loss": 1.0}]
    c = G.choose_lr(runs, [1e-4, 3e-4, 1e-3])
    assert c["lr"] == 3e-4 and not c["at_edge"] and c["val_loss_by_lr"][repr(1e-3)] == math.inf
    assert G.choose_lr(runs[:4], [1e-4, 3e-4]) == {"lr": 3e-4, "val_loss_by_lr": {"0.0001": 2.1, "0.0003": 2.05},
                                                    "at_edge": True}


def test_the_run_key_covers_the_code_version_and_every_numeric_setting(monkeypatch):
    cfg = tiny_cfg()
    k = G.run_key(cfg, "tiny", {"a": "0"})
    assert G.run_key({**cfg, "seeds": [5], "lrs": [1.0], "checkpoint_every": 9}, "tiny", {"a": "0"}) == k
    for change in ({"steps": 7}, {"warmup_frac": 0.1}, {"n_windows": 4}, {"betas": [0.9, 0.99]}):
        assert G.run_key({**cfg, **change}, "tiny", {"a": "0"}) != k
    assert G.run_key(cfg, "tiny", {"a": "1"}) != k and G.run_key(cfg, "other", {"a": "0"}) != k
    monkeypatch.setattr(G, "CODE_VERSION", G.CODE_VERSION + 1)
    assert G.run_key(cfg, "tiny", {"a": "0"}) != k


# --- the guard against a change of the numerics without a CODE_VERSION bump ---------------

def reference_runs() -> dict:
    cfg = tiny_cfg()
    data = tiny_data(cfg)
    out = {}
    for arm in ("gated", "symmetric"):
        rec = R.train_run(tiny_llama(), data, arm=arm, seed=11, lr=4e-3, steps=8, **run_kwargs(cfg))
        out[arm] = {k: rec[k] for k in ("train_loss", "grad_norm", "lr_per_step", "curve", "windows_after",
                                        "val_loss")}
    return out


def _close(a, b, path=""):
    if isinstance(a, dict):
        assert set(a) == set(b), path
        for k in a:
            _close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{path}[{i}]")
    elif a is None or b is None:
        assert a is b, path
    else:
        # REL_TOL covers the rounding of every kernel set torch may pick (measured:
        # tests/numerics_tolerance.py) and is far below a real change of the numerics
        assert a == pytest.approx(b, rel=REL_TOL, abs=ABS_TOL), path


def test_training_numerics_match_the_reference_of_this_code_version():
    ref = json.loads(REFERENCE.read_text())
    assert ref["code_version"] == G.CODE_VERSION, (
        f"tests/retrain_reference.json is for CODE_VERSION {ref['code_version']}, the code says "
        f"{G.CODE_VERSION}: run `python tests/test_retrain.py --write-reference`")
    try:
        _close(reference_runs(), ref["runs"])
    except AssertionError as e:
        raise AssertionError(
            f"the training numerics changed ({e}) but CODE_VERSION is still {G.CODE_VERSION}: bump it in "
            "qkmlp/pretrained/retrain/grid.py (so stored records are not reused) and run "
            "`python tests/test_retrain.py --write-reference`") from None


@pytest.mark.parametrize("change", ["adamw_eps", "warmup"])
def test_a_deliberate_change_of_the_numerics_trips_the_guard(change):
    """Another AdamW epsilon, one more warm-up step: the guard's tolerance is tight enough to
    see them (a change that only reorders a reduction is what another CPU does and is not
    seen, by design: tests/numerics_tolerance.py)."""
    ref = json.loads(REFERENCE.read_text())["runs"]
    with pytest.raises(AssertionError):
        _close(perturbed_retrain_runs(change), ref)


if __name__ == "__main__":
    if sys.argv[1:] == ["--write-reference"]:
        torch.set_num_threads(1)
        REFERENCE.write_text(json.dumps({"code_version": G.CODE_VERSION, "torch": torch.__version__,
                                         "runs": reference_runs()}, indent=1) + "\n")
        print(f"wrote {REFERENCE}")
    else:
        sys.exit("usage: python tests/test_retrain.py --write-reference")


# --- the distance-matched control (chapter 11) --------------------------------------------

PLAIN_FORMS = {"gated": lambda a, b: F.silu(a) * b, "swap": lambda a, b: F.silu(b) * a,
               "symmetric": lambda a, b: F.silu(a * b)}


class PlainUnits(nn.Module):
    """Form ``mode`` in the given units and ``elsewhere`` in the others, on the HF MLP's own
    weights: "gated" σ(a)·b, "swap" σ(b)·a, "symmetric" σ(a·b)."""

    def __init__(self, mlp, units, mode="swap", elsewhere="gated"):
        super().__init__()
        self.gate, self.up, self.down = (copy.deepcopy(getattr(mlp, n).weight) for n in ("gate_proj", "up_proj", "down_proj"))
        self.mask = torch.zeros(self.gate.shape[0], dtype=torch.bool)
        self.mask[list(units)] = True
        self.mode, self.elsewhere = PLAIN_FORMS[mode], PLAIN_FORMS[elsewhere]

    def forward(self, x):
        a, b = x @ self.gate.T, x @ self.up.T
        return torch.where(self.mask, self.mode(a, b), self.elsewhere(a, b)) @ self.down.T


def test_partially_swapped_arm_is_the_plain_formula_with_fixed_nested_units(ids):
    hf = tiny_llama()
    m = hf.config.intermediate_size
    units = {}
    for f in (0.25, 0.5):
        ref = copy.deepcopy(hf)
        units[f] = []
        for i, layer in enumerate(ref.model.layers):
            # the draw the declaration states: randperm(m) from a generator seeded with the layer index
            u = torch.randperm(m, generator=torch.Generator().manual_seed(i))[:round(f * m)].tolist()
            units[f].append(set(u))
            layer.mlp = PlainUnits(layer.mlp, u)
        model = copy.deepcopy(hf)
        R.build_arm(model, core.partial_swap_arm(f))
        with torch.no_grad():
            got = model(input_ids=ids, use_cache=False).logits
            want = ref(input_ids=ids, use_cache=False).logits
            plain = hf(input_ids=ids, use_cache=False).logits
        assert torch.allclose(got, want, rtol=0, atol=1e-12), (got - want).abs().max()
        assert (got - plain).abs().max() > 1e-3
        assert all(len(u) == round(f * m) for u in units[f])
    assert all(a < b for a, b in zip(units[0.25], units[0.5]))       # nested
    assert units[0.5][0] != units[0.5][1]                              # drawn per layer
    # exchanging the swapped units back gives the control exactly
    from qkmlp.pretrained.surgery import gated_mlps
    g = gated_mlps(hf)[1]
    h = core.partially_swapped(g, 0.5, 1)
    back = core.partially_swapped(h, 0.5, 1)
    assert torch.equal(back.query_weight, g.query_weight) and torch.equal(back.key_weight, g.key_weight)
    assert type(h) is type(g) and h.activation.name == g.activation.name


def test_partial_swap_arm_names_are_checked():
    assert core.partial_swap_arm(0.2304) == "swapped-f0.230"
    for bad in (0.0, 1.0, -0.1, 0.0004, 1.2):
        with pytest.raises(ValueError, match="fraction must lie in"):
            core.partial_swap_arm(bad)
    with pytest.raises(ValueError, match="unknown arm"):
        R.build_arm(tiny_llama(), "swapped-f0.2")
    assert tiny_cfg(arm_blocks=[["gated", "swapped-f0.125"]])["arm_blocks"] == [["gated", "swapped-f0.125"]]
    # is_arm, which config and build_arm ask: arms and partial-swap names in, anything else out
    assert all(core.is_arm(a) for a in ("gated", "symmetric", "swapped-f0.230", "swapped-f0.812+L1U83+L4U2"))
    assert not any(core.is_arm(a) for a in ("sym", "swapped-f0.2", "swapped-f1.000", "swapped-f0.230+L1",
                                          "swapped-f0.500+L4U2+L1U83", ""))


def test_match_fraction_finds_the_start_of_a_target_arm():
    from qkmlp.pretrained.retrain.matching import match_fraction, start_loss

    cfg = tiny_cfg()
    data = tiny_data(cfg)
    model = tiny_llama()
    full = start_loss(model, data, "swapped")["mean"]
    none = start_loss(model, data, "gated")["mean"]
    assert full > none + 0.01
    target = none + 0.4 * (full - none)
    got = match_fraction(model, data, target, eval_batch=2)
    # recomputed independently: the start of the returned fraction; the bisection ended on
    # two neighbouring thousandths either side of the target; the fraction returned is the
    # closest to the target of every fraction evaluated (here the start is not monotone in
    # f, and an earlier evaluation can beat the final bracket)
    f = got["fraction"]
    assert abs(start_loss(model, data, core.partial_swap_arm(f))["mean"] - got["start"]) < 1e-12
    evals = {e["fraction"]: e["start"] for e in got["evaluations"]}
    assert any(round(b - a, 3) == 0.001 and evals[a] < target <= evals[b] for a in evals for b in evals)
    assert f == min(sorted(evals), key=lambda k: abs(evals[k] - target))
    with pytest.raises(ValueError, match="outside the starts"):
        match_fraction(model, data, full + 10.0)
