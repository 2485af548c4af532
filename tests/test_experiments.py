"""Tests of qkmlp.experiments: matched widths, statistics, determinism, the runner and CLI."""
from __future__ import annotations

import json
import math

import pytest
import torch

from qkmlp.costs import parameter_count
from qkmlp.experiments import (
    FAMILIES, TASKS, TinyTransformer, compare, get_family, hidden_width, kv_budget, load_results,
    make_layer, mean_sd, paired_comparison, rerun, run_cell, run_grid, save_results, sign_test, summary,
    t_interval,
)
from qkmlp.experiments.__main__ import main
from qkmlp.experiments.tasks import modadd_data, recall_data


# --- families -------------------------------------------------------------------------

def test_shazeer_two_thirds_rule():
    # d_in = d_out: a rank-1 two-projection layer gets 2/3 of the key-value width
    assert hidden_width("gated1-silu", 16, 16, kv_budget(16, 16, 30)) == 20
    assert hidden_width("sym1-relu", 16, 16, kv_budget(16, 16, 30)) == 20
    assert hidden_width("gated2-silu", 16, 16, kv_budget(16, 16, 50)) == 20   # 2/(2r+1) = 2/5
    assert hidden_width("kv-gelu", 16, 16, kv_budget(16, 16, 30)) == 30


@pytest.mark.parametrize("name", list(FAMILIES))
@pytest.mark.parametrize("d_in,d_out,m_kv", [(64, 10, 28), (46, 23, 64), (16, 16, 32), (32, 32, 8)])
def test_parameter_counts_match_budget(name, d_in, d_out, m_kv):
    budget = kv_budget(d_in, d_out, m_kv)
    layer = make_layer(name, d_in, d_out, budget)
    per_unit = get_family(name).rows_per_slot * d_in + d_out
    assert layer.d_model == d_in and layer.d_out == d_out
    assert abs(parameter_count(layer) - budget) <= per_unit / 2 + 1e-9


def test_family_kinds_build_the_right_layers():
    f = get_family("gated1-silu")
    layer = make_layer(f, 8, 8, 200)
    assert type(layer).__name__ == "GatedMLP" and layer.rank == 1 and layer.activation.name == "silu"
    assert type(make_layer("sym4-silu", 8, 8, 400)).__name__ == "SymmetricBilinearMLP"
    assert type(make_layer("kv-relu", 8, 8, 200)).__name__ == "KeyValueMLP"


def test_bad_family_and_budget():
    with pytest.raises(ValueError, match="unknown family"):
        get_family("swiglu")
    with pytest.raises(ValueError, match="budget"):
        hidden_width("kv-relu", 4, 4, 0)
    with pytest.raises(ValueError, match="m_kv"):
        kv_budget(4, 4, -1)


# --- statistics --------------------------------------------------------------------------

def test_sign_test_exact_values():
    assert sign_test([1, 2, 3, 4, 5]) == pytest.approx(2 / 32)          # the floor at n = 5
    assert sign_test([1, -1]) == 1.0
    assert sign_test([0, 0]) == 1.0
    # 8 positive of 9 non-zero: 2 * (1 + 9) / 512
    assert sign_test([1] * 8 + [-1, 0]) == pytest.approx(2 * 10 / 512)


def test_t_interval_against_table():
    # mean 2, sd 1, n = 3: t_{0.975, 2} = 4.302653 (standard table)
    lo, hi = t_interval([1.0, 2.0, 3.0])
    half = 4.302653 / math.sqrt(3)
    assert lo == pytest.approx(2 - half, rel=1e-5) and hi == pytest.approx(2 + half, rel=1e-5)
    with pytest.raises(ValueError, match="at least 2"):
        t_interval([1.0])


def test_paired_comparison_sees_a_consistent_shift_and_not_noise():
    base = [0.1, -0.3, 0.2, 0.05, -0.1, 0.4, -0.2, 0.0]
    shifted = [b + 1.0 + 0.01 * i for i, b in enumerate(base)]
    res = paired_comparison(shifted, base)
    assert res["significant"] and res["wins"] == 8 and res["ci"][0] > 0.9
    noise = paired_comparison([0.1, -0.1, 0.2, -0.2], [0.0, 0.0, 0.0, 0.0])
    assert not noise["significant"] and noise["wins"] == 2 and noise["losses"] == 2
    with pytest.raises(ValueError, match="paired"):
        paired_comparison([1, 2], [1, 2, 3])
    with pytest.raises(ValueError, match="finite"):
        paired_comparison([1, float("nan")], [1, 2])
    assert mean_sd([2.0]) == (2.0, 0.0)


# --- data ----------------------------------------------------------------------------------

def test_modadd_data_is_a_partition_with_correct_labels():
    p = 7
    xtr, ytr, xte, yte = modadd_data(p, 0.5, seed=3)
    x, y = torch.cat([xtr, xte]), torch.cat([ytr, yte])
    a, b = x[:, :p].argmax(1), x[:, p:].argmax(1)
    assert len({(int(i), int(j)) for i, j in zip(a, b)}) == p * p
    assert torch.equal(y, (a + b) % p)


def test_recall_data_places_subject_relation_and_query():
    S, R, V, Fi, L = 5, 3, 4, 2, 6
    table = torch.randint(0, V, (S, R), generator=torch.Generator().manual_seed(0))
    tok, ans = recall_data(S, R, V, Fi, L, 200, table, seed=1)
    assert tok.shape == (200, L) and bool((tok[:, -1] == S + R + Fi).all())
    body = tok[:, :-1]
    is_s, is_r = body < S, (body >= S) & (body < S + R)
    assert bool((is_s.sum(1) == 1).all()) and bool((is_r.sum(1) == 1).all())
    s = body[is_s]
    r = body[is_r] - S
    assert torch.equal(ans, table[s, r])
    with pytest.raises(ValueError, match="table"):
        recall_data(S, R, V, Fi, L, 10, table[:2], seed=0)


def test_tiny_transformer_last_position_equals_full_attention():
    torch.manual_seed(0)
    ffn = make_layer("gated1-silu", 8, 8, 64)
    model = TinyTransformer(10, 5, 8, 4, ffn)
    tok = torch.randint(0, 10, (3, 5))
    # reference: the whole block computed at every position with torch's attention kernel
    h = model.tok(tok) + model.pos(torch.arange(5))
    a = model.ln1(h)
    att = torch.nn.functional.scaled_dot_product_attention(model.q(a), model.k(a), model.v(a))
    h = h + model.o(att)
    h = h + model.ffn(model.ln2(h))
    ref = model.head(model.ln_f(h))[:, -1]
    torch.testing.assert_close(model(tok), ref, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="long"):
        model(tok.float())


# --- runs --------------------------------------------------------------------------------

def _strip(rec):
    return {k: v for k, v in rec.items() if k != "wall_s"}


@pytest.mark.parametrize("task", list(TASKS))
def test_run_cell_is_deterministic_on_cpu(task):
    t = TASKS[task]
    cell = t.cells(t.quick)[1]
    a = run_cell(task, cell, seed=4, config=t.quick)
    b = run_cell(task, cell, seed=4, config=t.quick)
    assert _strip(a) == _strip(b)
    c = run_cell(task, cell, seed=5, config=t.quick)
    assert c["curve"]["train_loss"] != a["curve"]["train_loss"]


def test_symmetric_identity_and_bilinear_train_identically():
    # σ = identity: σ(ab) = ab = σ(a)b, and both layers draw the same initial weights
    cfg = TASKS["digits"].quick
    a = run_cell("digits", {"family": "sym1-identity"}, 0, cfg)
    b = run_cell("digits", {"family": "gated1-identity"}, 0, cfg)
    assert a["curve"]["train_loss"] == pytest.approx(b["curve"]["train_loss"], rel=1e-5)


def test_swap_change_zero_for_symmetric_and_large_for_gated():
    cfg = TASKS["teacher"].quick
    sym = run_cell("teacher", {"teacher": "kv-relu", "family": "sym1-silu"}, 0, cfg)
    gated = run_cell("teacher", {"teacher": "kv-relu", "family": "gated1-silu"}, 0, cfg)
    kv = run_cell("teacher", {"teacher": "kv-relu", "family": "kv-relu"}, 0, cfg)
    assert sym["swap_init"] < 1e-5 and sym["swap_trained"] < 1e-5
    assert gated["swap_init"] > 1e-2 and gated["swap_trained"] > 1e-2
    assert kv["swap_init"] is None


def test_run_grid_save_load_and_compare(tmp_path):
    res = run_grid("digits", seeds=range(3), quick=True, progress=False)
    meta = res["meta"]
    for key in ("qkmlp_version", "git_commit", "hardware", "wall_s", "torch_version", "device", "seeds"):
        assert key in meta
    assert len(res["runs"]) == 2 * 3
    path = save_results(res, tmp_path / "digits.json")
    back = load_results(path)
    rows = summary(back)
    assert {r["family"] for r in rows} == {"kv-relu", "gated1-silu"} and all(r["n"] == 3 for r in rows)
    cmp = compare(back, {"family": "gated1-silu"}, {"family": "kv-relu"})
    assert cmp["n"] == 3 and cmp["seeds"] == [0, 1, 2]
    with pytest.raises(FileNotFoundError, match="python -m qkmlp.experiments"):
        load_results(tmp_path / "missing.json")
    # a stored run reproduces (to its 5-digit rounding); a tampered one does not
    rows = rerun(back, [{"family": "gated1-silu"}], seeds=[1])
    assert len(rows) == 1 and rows[0]["rel_diff"] < 1e-4
    back["runs"] = [dict(r, test_loss=2 * r["test_loss"]) if r["seed"] == 1 else r for r in back["runs"]]
    assert rerun(back, [{"family": "gated1-silu"}], seeds=[1])[0]["rel_diff"] > 0.4
    with pytest.raises(KeyError, match="one stored run"):
        rerun(back, [{"family": "gated1-silu"}], seeds=[7])


def test_device_checks():
    with pytest.raises(ValueError, match="device"):
        run_cell("digits", {"family": "kv-relu"}, 0, TASKS["digits"].quick, device="meta")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="cuda"):
            run_cell("digits", {"family": "kv-relu"}, 0, TASKS["digits"].quick, device="cuda")


def test_cli_writes_json(tmp_path, capsys):
    assert main(["--task", "modadd", "--quick", "--seeds", "2", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "modadd.json").read_text())
    assert data["meta"]["seeds"] == [0, 1] and data["meta"]["command"].endswith("--out " + str(tmp_path))
    assert len(data["runs"]) == 4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu_roughly():
    cfg = TASKS["teacher"].quick
    cell = {"teacher": "kv-relu", "family": "gated1-silu"}
    a = run_cell("teacher", cell, 0, cfg, device="cpu")
    b = run_cell("teacher", cell, 0, cfg, device="cuda")
    assert b["test_loss"] == pytest.approx(a["test_loss"], rel=1e-3)


def test_digits_bias_appends_a_constant_and_breaks_parity():
    from qkmlp.experiments.tasks import digits_data
    xtr, _, xte, _ = digits_data(0, bias=True)
    assert xtr.shape[1] == 65 and bool((xtr[:, -1] == 1).all()) and bool((xte[:, -1] == 1).all())
    # without a constant coordinate the symmetric form is even in x, the gated form is not
    torch.manual_seed(0)
    x = torch.randn(16, 8)
    sym, gated = make_layer("sym1-silu", 8, 3, 100), make_layer("gated1-silu", 8, 3, 100)
    torch.testing.assert_close(sym(-x), sym(x))
    assert not torch.allclose(gated(-x), gated(x))
    xb = torch.cat([x, torch.ones(16, 1)], 1)
    sym_b = make_layer("sym1-silu", 9, 3, 100)
    assert not torch.allclose(sym_b(torch.cat([-x, torch.ones(16, 1)], 1)), sym_b(xb))


# --- report ------------------------------------------------------------------------------

def _fake(metric, higher, a_vals, b_vals):
    runs = [{"family": f, "seed": s, metric: v} for f, vals in (("A", a_vals), ("B", b_vals))
            for s, v in enumerate(vals)]
    return {"meta": {"metric": metric, "higher_is_better": higher}, "runs": runs}


def test_gain_is_oriented_so_positive_means_better():
    from qkmlp.experiments.report import format_rows, gain
    acc = gain(_fake("test_acc", True, [0.9, 0.8, 0.95], [0.8, 0.7, 0.9]), {"family": "A"}, {"family": "B"})
    loss = gain(_fake("test_loss", False, [0.1, 0.2, 0.1], [0.3, 0.5, 0.2]), {"family": "A"}, {"family": "B"})
    for r in (acc, loss):
        assert r["mean_diff"] > 0 and r["wins"] == 3 and r["losses"] == 0
    assert loss["mean_diff"] == pytest.approx((0.2 + 0.3 + 0.1) / 3)
    assert "A vs B" in format_rows([acc, loss])


def test_parity_floor_zero_for_even_teachers_positive_otherwise():
    from qkmlp.experiments.tasks import parity_floor
    assert parity_floor("sym1-silu", 4, 4, 32, 32, 0) < 1e-10
    assert parity_floor("gated1-identity", 4, 4, 32, 32, 0) < 1e-10
    assert parity_floor("kv-relu", 4, 4, 32, 32, 0) > 0.05


def test_report_plots_run(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from qkmlp.experiments.report import plot_cross_table, plot_curves, plot_final, plot_recall, plot_swap, swap_rows
    res = {t: run_grid(t, seeds=range(2), quick=True, progress=False) for t in ("digits", "teacher", "recall")}
    fig, axes = plt.subplots(1, 5)
    plot_final(res["digits"], axes[0])
    plot_curves(res["digits"], axes[1], ["kv-relu", "gated1-silu"])
    plot_cross_table(res["teacher"], axes[2])
    plot_recall(res["recall"], axes[3], ["kv-relu", "gated1-silu"])
    rows = swap_rows({"digits": res["digits"]}, ["gated1-silu"])
    assert rows[0]["n"] == 2
    plot_swap(rows, axes[4])
    plt.close(fig)


def test_run_shifts_pairs_runs_by_cell_and_seed():
    from qkmlp.experiments.report import run_shifts

    def res(vals, config=None):
        runs = [{"family": f, "m_kv": 6, "seed": s, "acc": v} for (f, s), v in vals.items()]
        return {"config": config or {"steps": 1}, "meta": {"metric": "acc"}, "runs": runs}

    before = res({("a", 0): 0.5, ("a", 1): 0.7, ("b", 0): 0.2})
    after = res({("b", 0): 0.25, ("a", 1): 0.7, ("a", 0): 0.4})       # other order
    shifts = run_shifts(before, after)
    assert shifts == pytest.approx({((("family", "a"), ("m_kv", 6)), 0): 0.1,
                                    ((("family", "a"), ("m_kv", 6)), 1): 0.0,
                                    ((("family", "b"), ("m_kv", 6)), 0): 0.05})
    with pytest.raises(ValueError, match="configurations differ"):
        run_shifts(before, res({("a", 0): 0.5}, config={"steps": 2}))
    with pytest.raises(ValueError, match="same cells and seeds"):
        run_shifts(before, res({("a", 0): 0.5}))
