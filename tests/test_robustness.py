"""qkmlp.pretrained.robustness on a tiny random Llama (byte tokens): the context scores
against plain per-token losses, the random sets against the stated draw."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers", reason="transformers is pinned in requirements.txt")

from byte_tokenizer import ByteTokenizer  # noqa: E402
from test_retrain import tiny_llama  # noqa: E402

from qkmlp.pretrained import robustness as R  # noqa: E402
from qkmlp.pretrained.heldout import heldout_windows, window_losses  # noqa: E402
from qkmlp.pretrained.surgery import gated_mlps  # noqa: E402
from qkmlp.pretrained.units import pair_distance  # noqa: E402


class BosBytes(ByteTokenizer):
    bos_token_id = 1

    def convert_ids_to_tokens(self, i):
        return "<bos>"


TEXT = "the king shall come to thee and none of it, said the fool. " * 40


def plain_nll(model, ids):
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits.double()
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1),
                           reduction="none").reshape(ids.shape[0], -1)


def test_token_losses_average_to_window_losses():
    torch.set_num_threads(1)
    model, tok = tiny_llama(), BosBytes()
    ids = heldout_windows(tok, 3, 24, TEXT, bos=True)
    per = R.token_losses(model, ids)
    assert per.shape == (3, 23)
    torch.testing.assert_close(per.mean(1), window_losses(model, ids), rtol=1e-6, atol=1e-9)


def test_context_scores_are_the_plain_losses_of_the_stated_tokens():
    torch.set_num_threads(1)
    model, tok = tiny_llama(), BosBytes()
    out = R.context_costs(model, tok, TEXT, n_windows=2, long=40, short=10)
    ids = heldout_windows(tok, 2, 40, TEXT, bos=True)
    per = plain_nll(model, ids)
    assert out["base"]["first"] == pytest.approx(per[:, :10].mean(1).tolist(), rel=1e-5)
    assert out["base"]["last_in_context"] == pytest.approx(per[:, -10:].mean(1).tolist(), rel=1e-5)
    fresh = torch.cat([torch.ones(2, 1, dtype=torch.long), ids[:, -10:]], dim=1)
    assert out["base"]["last_fresh"] == pytest.approx(plain_nll(model, fresh).mean(1).tolist(), rel=1e-5)
    assert set(out["kinds"]) == {"none", "swap", "rescale:-1"}
    # removing every MLP changes the scores (so the comparison above could fail)
    assert out["kinds"]["none"]["first"] != pytest.approx(out["base"]["first"], rel=1e-3)
    with pytest.raises(ValueError, match="short < long"):
        R.context_costs(model, tok, TEXT, long=10, short=10)


def test_random_sets_swap_the_closest_units_and_the_stated_draws():
    torch.set_num_threads(1)
    model, tok = tiny_llama(), BosBytes()
    ids = heldout_windows(tok, 2, 16, TEXT, bos=True)
    out = R.random_sets(model, ids, [1], share=0.25, draws=3, seed=5)
    row = out["layers"][1]
    assert set(row) == {"closest", "random_0", "random_1", "random_2"}
    # recompute one draw independently: the second randperm of a generator seeded 5
    g = gated_mlps(model)[1]
    gen = torch.Generator().manual_seed(5)
    torch.randperm(48, generator=gen)
    units = torch.randperm(48, generator=gen)[:12]
    from qkmlp.pretrained.surgery import mlps_replaced, replace_mlps
    from qkmlp.pretrained.units import partially_swapped

    all_g = gated_mlps(model)
    old = replace_mlps(model, dict(enumerate(all_g)))
    try:
        with mlps_replaced(model, {1: partially_swapped(all_g[1], units)}):
            want = window_losses(model, ids).tolist()
    finally:
        replace_mlps(model, old)
    assert row["random_1"] == pytest.approx(want, rel=1e-9)
    assert row["closest"] != pytest.approx(out["base"], rel=1e-6)
    assert pair_distance(g).argsort()[:12].tolist() == pair_distance(all_g[1]).argsort()[:12].tolist()


def test_the_docstring_states_the_stored_runs_wall_time():
    import json
    import re
    from pathlib import Path

    said = re.search(r"took (\d+) s of wall time, one torch thread on a\s+two-core (AMD EPYC)", R.__doc__)
    assert said, "robustness's docstring no longer states the stored run's wall time"
    meta = json.loads((Path(__file__).parents[1] / "book/data/pretrained/robustness.json").read_text())["meta"]
    assert round(meta["wall_s"], -1) == int(said.group(1))
    m = meta["machine"]
    assert (m["torch_threads"], m["cpu_count"], m["cpu"]) == (1, 2, said.group(2))
