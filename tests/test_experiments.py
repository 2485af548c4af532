"""Tests of qkmlp.experiments: matched widths, statistics, determinism, the runner and CLI."""
from __future__ import annotations

import json
import math

import pytest
import torch

from qkmlp.costs import parameter_count
from qkmlp.experiments import (
    FAMILIES, TASKS, TinyTransformer, choose_lr, compare, detectable_difference, get_family, hidden_width, holm,
    kv_budget, load_results, make_layer, mean_sd, paired_comparison, rerun, run_cell, run_grid, save_results,
    sign_test, strip_provenance, summary, t_interval, t_test, tuned_lr,
)
from qkmlp.experiments.__main__ import main
from qkmlp.experiments.tasks import digits_data, modadd_data, recall_data


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
    sg = make_layer("symgated2-silu", 8, 8, 400)
    assert type(sg).__name__ == "SymmetrizedGatedMLP" and sg.rank == 2


def test_symmetrised_family_is_swap_invariant_and_not_even():
    from qkmlp.symmetry import relative_change, swapped
    torch.manual_seed(0)
    x = torch.randn(64, 8)
    layer = make_layer("symgated1-silu", 8, 8, 200)
    assert relative_change(layer, swapped(layer), x) < 1e-6
    # unlike sigma(ab), the symmetrised gated form is not even in x
    assert not torch.allclose(layer(-x), layer(x), atol=1e-3)


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


def test_t_test_matches_scipy_paired_test():
    from scipy.stats import ttest_rel
    a = [0.3, 0.1, 0.5, 0.2, 0.45, 0.33]
    b = [0.2, 0.15, 0.3, 0.1, 0.4, 0.2]
    assert t_test([x - y for x, y in zip(a, b)]) == pytest.approx(ttest_rel(a, b).pvalue, rel=1e-9)
    assert t_test([0.0, 0.0, 0.0]) == 1.0 and t_test([1.0, 1.0]) == 0.0
    assert paired_comparison(a, b)["t_p"] == pytest.approx(ttest_rel(a, b).pvalue, rel=1e-9)


def test_holm_against_its_definition():
    # the definition: sort, multiply the i-th smallest by (m - i), running maximum, cap at 1
    import random
    rng = random.Random(0)
    for _ in range(50):
        m = rng.randint(1, 12)
        p = [rng.random() ** 3 for _ in range(m)]
        order = sorted(range(m), key=lambda i: p[i])
        ref = [0.0] * m
        for k, i in enumerate(order):
            ref[i] = min(1.0, max((m - j) * p[order[j]] for j in range(k + 1)))
        assert holm(p) == pytest.approx(ref)
    # a textbook case: 0.01, 0.04, 0.03 -> 0.03, 0.06, 0.06
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    with pytest.raises(ValueError, match="p-values"):
        holm([0.5, 1.5])


def test_detectable_difference_has_the_stated_power():
    # Monte Carlo: paired t-tests at the detectable difference reject in ~80 % of draws
    import numpy as np
    from scipy.stats import t as student_t
    n, sd, alpha = 10, 0.7, 0.01
    delta = detectable_difference(sd, n, alpha=alpha, power=0.8)
    rng = np.random.default_rng(0)
    d = rng.normal(delta, sd, size=(40000, n))
    tstat = d.mean(1) / (d.std(1, ddof=1) / np.sqrt(n))
    power = np.mean(np.abs(tstat) > student_t.ppf(1 - alpha / 2, n - 1))
    assert power == pytest.approx(0.8, abs=0.01)
    # more seeds, smaller detectable difference; zero spread, zero
    assert detectable_difference(sd, 40, alpha=alpha) < delta / 1.9
    assert detectable_difference(0.0, 5) == 0.0
    # a strict level with few seeds needs a large non-centrality (scipy's lower tail underflows)
    assert 1.45 < detectable_difference(1.0, 10, alpha=0.05 / 12) < 1.6
    with pytest.raises(ValueError, match="n must"):
        detectable_difference(1.0, 1)


# --- data ----------------------------------------------------------------------------------

def test_modadd_data_is_a_partition_with_correct_labels():
    p = 7
    xtr, ytr, xva, yva, xte, yte = modadd_data(p, (0.5, 0.25, 0.25), seed=3)
    assert (len(ytr), len(yva), len(yte)) == (25, 12, 12)
    x, y = torch.cat([xtr, xva, xte]), torch.cat([ytr, yva, yte])
    a, b = x[:, :p].argmax(1), x[:, p:].argmax(1)
    assert len({(int(i), int(j)) for i, j in zip(a, b)}) == p * p
    assert torch.equal(y, (a + b) % p)


def test_digits_split_is_a_partition():
    xtr, _, xva, _, xte, _ = digits_data(0)
    assert len(xtr) + len(xva) + len(xte) == 1797
    rows = {tuple(r.tolist()) for r in torch.cat([xtr, xva, xte])}
    assert len(rows) > 1700          # (a few digits images are exact duplicates)
    with pytest.raises(ValueError, match="empty split"):
        digits_data(0, fracs=(1.0, 0.0, 0.0))


def test_one_test_split_for_every_seed_disjoint_from_every_tuning_split():
    # the tuning seeds (100, 101, ...) and evaluation seeds (0, 1, ...) share one test set, and no
    # seed's validation or training examples are test examples (they were 16-26 % before)
    p = 23
    pairs = lambda x: {(int(i), int(j)) for i, j in zip(x[:, :p].argmax(1), x[:, p:].argmax(1))}
    tests, held = [], set()
    for seed in (0, 1, 7, 100, 101):
        xtr, _, xva, _, xte, _ = modadd_data(p, (0.6, 0.2, 0.2), seed)
        tests.append(pairs(xte))
        held |= pairs(xtr) | pairs(xva)
        assert len(pairs(xtr) | pairs(xva) | pairs(xte)) == p * p
    assert all(t == tests[0] for t in tests) and not (held & tests[0])
    a, b = modadd_data(p, (0.6, 0.2, 0.2), 0), modadd_data(p, (0.6, 0.2, 0.2), 1)
    assert pairs(a[2]) != pairs(b[2])                       # training and validation still vary by seed
    d0, d1 = digits_data(0), digits_data(100)
    assert torch.equal(d0[5], d1[5])                        # the same test labels in the same order
    shift = d0[4] - d1[4]                                   # the same images, centred on other training means
    assert torch.allclose(shift, shift[:1].expand_as(shift), atol=1e-6) and shift.abs().max() > 0


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


@pytest.mark.parametrize("frozen", [False, True])
def test_recall_frozen_embeddings_keeps_the_token_vectors(frozen, monkeypatch):
    import qkmlp.experiments.tasks as tasks
    made = []

    class Spy(tasks.TinyTransformer):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            made.append((self, self.tok.weight.detach().clone(), self.pos.weight.detach().clone()))

    monkeypatch.setattr(tasks, "TinyTransformer", Spy)
    cfg = {**TASKS["recall"].config("quick"), "lr": 1e-2, "frozen_embeddings": frozen}
    run_cell("recall", {"family": "gated1-silu", "m_kv": 4}, 0, cfg)
    model, tok0, pos0 = made[0]
    assert torch.equal(model.tok.weight, tok0) == frozen
    assert not torch.equal(model.pos.weight, pos0)             # the rest still trains


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
    return {k: v for k, v in rec.items() if k not in ("wall_s", "host")}


def _quick(task, **extra):
    return {**TASKS[task].quick, "lr": 1e-2, **extra}


@pytest.mark.parametrize("task", list(TASKS))
def test_run_cell_is_deterministic_on_cpu(task):
    t = TASKS[task]
    cell = t.cells(t.quick)[1]
    a = run_cell(task, cell, seed=4, config=_quick(task))
    b = run_cell(task, cell, seed=4, config=_quick(task))
    assert _strip(a) == _strip(b)
    c = run_cell(task, cell, seed=5, config=_quick(task))
    assert c["curve"]["train_loss"] != a["curve"]["train_loss"]
    for key in ("val_loss", "test_loss", "best_step", "stopped", "steps", t.metric):
        assert key in a
    assert a["best_val_loss"] == min(a["curve"]["val_loss"])


def test_run_cell_needs_a_learning_rate():
    with pytest.raises(ValueError, match="lr"):
        run_cell("digits", {"family": "kv-relu"}, 0, TASKS["digits"].quick)


def test_symmetric_identity_and_bilinear_train_identically():
    # σ = identity: σ(ab) = ab = σ(a)b, and both layers draw the same initial weights
    a = run_cell("digits", {"family": "sym1-identity"}, 0, _quick("digits"))
    b = run_cell("digits", {"family": "gated1-identity"}, 0, _quick("digits"))
    assert a["curve"]["train_loss"] == pytest.approx(b["curve"]["train_loss"], rel=1e-5)


def test_swap_change_zero_for_symmetric_forms_and_large_for_gated():
    cfg = _quick("teacher")
    runs = {f: run_cell("teacher", {"teacher": "kv-relu", "family": f}, 0, cfg)
            for f in ("sym1-silu", "symgated1-silu", "gated1-silu", "kv-relu")}
    for f in ("sym1-silu", "symgated1-silu"):
        assert runs[f]["swap_init"] < 1e-5 and runs[f]["swap_trained"] < 1e-5
    assert runs["gated1-silu"]["swap_init"] > 1e-2 and runs["gated1-silu"]["swap_trained"] > 1e-2
    assert runs["kv-relu"]["swap_init"] is None


def test_choose_lr_takes_the_lowest_mean_validation_loss():
    runs = [{"family": "A", "lr": lr, "seed": s, "val_loss": v}
            for lr, vals in ((0.1, (1.0, 3.0)), (0.3, (1.5, 1.6)), (1.0, (0.5, float("nan"))))
            for s, v in zip((100, 101), vals)]
    row = choose_lr(runs, {"family": "A"}, [0.1, 0.3, 1.0])
    assert row["lr"] == 0.3 and not row["at_edge"]                 # 1.0 has a non-finite run: +inf
    assert row["val_loss_by_lr"]["0.1"] == pytest.approx(2.0)
    assert choose_lr(runs[:2], {"family": "A"}, [0.1])["lr"] == 0.1
    with pytest.raises(KeyError, match="no tuning runs"):
        choose_lr(runs, {"family": "B"}, [0.1])


def test_run_grid_tunes_then_evaluates_saves_and_compares(tmp_path):
    res = run_grid("digits", seeds=range(3), quick=True, progress=False)
    meta = res["meta"]
    for key in ("qkmlp_version", "git_commit", "git_uncommitted_changes", "hardware", "wall_s", "versions",
                "device", "seeds", "tune_seeds", "lrs"):
        assert key in meta
    assert {"numpy", "scikit-learn", "torch", "scipy"} <= set(meta["versions"])
    assert len(res["runs"]) == 2 * 3
    # each cell tried the config's two rates, plus up to two past an edge where the best sat
    tried = [len(row["val_loss_by_lr"]) for row in res["tuning"]]
    assert all(2 <= k <= 4 for k in tried) and len(res["tune_runs"]) == sum(tried)
    for row in res["tuning"]:           # the chosen rate is the one with the lowest tuning validation loss
        tune = {r["lr"]: r["val_loss"] for r in res["tune_runs"] if r["family"] == row["family"]}
        assert row["lr"] == min(tune, key=tune.get)
        assert all(r["lr"] == row["lr"] for r in res["runs"] if r["family"] == row["family"])
    path = save_results(res, tmp_path / "digits.json")
    back = load_results(path)
    assert tuned_lr(back, {"family": "kv-relu"}) == res["tuning"][0]["lr"]
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


def test_run_grid_rejects_bad_seeds():
    with pytest.raises(ValueError, match="seeds must not be empty"):
        run_grid("digits", seeds=[], quick=True, progress=False)
    with pytest.raises(ValueError, match="disjoint"):
        run_grid("digits", seeds=[100], quick=True, progress=False)
    with pytest.raises(ValueError, match="sizes"):
        run_grid("digits", size="huge", progress=False)
    with pytest.raises(ValueError, match="shared cache"):
        run_grid("digits", quick=True, progress=False, rank=0, world=2)


def test_a_config_may_list_its_seeds_and_those_are_the_seeds_run(monkeypatch):
    import qkmlp.experiments.runner as runner
    ran, real = [], runner.run_cell
    monkeypatch.setattr(runner, "run_cell", lambda *a, **k: ran.append((a[2], a[3]["lr"])) or real(*a, **k))
    res = run_grid("digits", quick=True, progress=False, cells=[{"family": "kv-relu"}],
                   config={"seeds": [7, 9], "lrs": [1e-2]})
    assert res["meta"]["seeds"] == [7, 9] and sorted(r["seed"] for r in res["runs"]) == [7, 9]
    assert sorted(ran) == [(7, 1e-2), (9, 1e-2), (100, 1e-2)]     # two evaluation runs, one tuning run
    with pytest.raises(ValueError, match="disjoint"):
        run_grid("digits", quick=True, progress=False, config={"seeds": [100]})


@pytest.mark.slow
def test_parts_with_a_shared_cache_equal_one_process_and_resume(tmp_path, monkeypatch):
    # two independent processes share the jobs through a cache folder; part 1 writes the file
    import subprocess
    import sys
    one = run_grid("modadd", quick=True, progress=False)
    cmd = [sys.executable, "-m", "qkmlp.experiments", "--task", "modadd", "--quick", "--no-progress",
           "--cache", str(tmp_path / "cache"), "--out", str(tmp_path / "out")]
    procs = [subprocess.Popen(cmd + ["--part", f"{k}/2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for k in (2, 1)]
    for p in procs:
        _, err = p.communicate(timeout=1200)
        assert p.returncode == 0, err[-2000:]
    merged = load_results(tmp_path / "out" / "modadd_quick.json")
    assert [strip_provenance(r) for r in merged["runs"]] == [strip_provenance(r) for r in save_load(one)["runs"]]
    assert merged["tuning"] == save_load(one)["tuning"]
    assert {r["rank"] for r in merged["runs"]} <= {0, 1}     # who ran what depends on timing (work stealing)
    assert not list((tmp_path / "cache").rglob("*.claim"))     # every claim released with its record
    # resume: every record is in the cache, so nothing trains again
    import qkmlp.experiments.runner as runner

    def no_training(*a, **k):
        raise AssertionError("a cached run was trained again")

    monkeypatch.setattr(runner, "run_cell", no_training)
    again = run_grid("modadd", quick=True, progress=False, cache=tmp_path / "cache")
    assert again["meta"]["runs_computed_here"] == 0
    assert [strip_provenance(r) for r in save_load(again)["runs"]] == [strip_provenance(r) for r in merged["runs"]]


def test_a_part_alone_takes_over_the_other_parts_jobs(tmp_path):
    # part 1 of 2 with no part 2 running: it finishes its share, then runs part 2's jobs
    # (before work stealing it waited for ever); the grid equals a one-process grid
    one = run_grid("modadd", quick=True, progress=False)
    alone = run_grid("modadd", quick=True, progress=False, cache=tmp_path, rank=0, world=2, poll_s=0.01)
    assert [strip_provenance(r) for r in save_load(alone)["runs"]] == \
        [strip_provenance(r) for r in save_load(one)["runs"]]
    assert {r["rank"] for r in alone["runs"] + alone["tune_runs"]} == {0}
    assert alone["meta"]["runs_computed_here"] == len(one["runs"]) + len(one["tune_runs"])


def test_every_stored_grid_is_what_its_command_runs_now():
    # `python -m qkmlp.experiments --task T --size S` must regenerate each stored file: the
    # stored config is the task's current config for that size (the seeds may have been
    # given on the command line: the stored seeds are those the current config runs)
    from pathlib import Path
    from qkmlp.experiments import get_task
    files = sorted((Path(__file__).resolve().parents[1] / "book" / "data" / "experiments").glob("*.json"))
    assert len(files) >= 8
    for path in files:
        res = json.loads(path.read_text())
        meta = res["meta"]
        now = json.loads(json.dumps(get_task(meta["task"]).config(meta["size"])))
        assert {k: v for k, v in res["config"].items() if k != "seeds"} == \
            {k: v for k, v in now.items() if k != "seeds"}, path.name
        seeds = list(range(now["seeds"])) if isinstance(now["seeds"], int) else now["seeds"]
        assert meta["seeds"] == seeds, path.name
        assert path.name == f"{meta['task']}.json" if meta["size"] == "default" else \
            path.name == f"{meta['task']}_{meta['size']}.json"


def save_load(results):
    """The results as they read back from a file (floats rounded to 5 digits)."""
    import tempfile
    from pathlib import Path
    with tempfile.TemporaryDirectory() as d:
        return load_results(save_results(results, Path(d) / "r.json"))


def test_toy_tasks_follow_the_schedule(monkeypatch):
    # a toy task's schedule and warm-up used to be ignored without a word: the rate each
    # optimizer step used must be the plain formula (linear warm-up, then a cosine down to
    # 0.1 lr at max_steps), and a bad schedule name must fail
    used = []
    step = torch.optim.Adam.step

    def spy(self, *a, **k):
        used.append(self.param_groups[0]["lr"])
        return step(self, *a, **k)

    monkeypatch.setattr(torch.optim.Adam, "step", spy)
    cell, lr = {"family": "kv-relu"}, 1e-2
    cfg = _quick("digits", schedule="cosine", warmup_frac=0.5, patience=10**6, lr=lr)
    n, warm = cfg["max_steps"], int(0.5 * cfg["max_steps"])
    run_cell("digits", cell, 0, cfg)
    plain = [lr * (i + 1) / warm if i < warm
             else lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (i - warm) / (n - warm))))
             for i in range(n)]
    assert len(used) == n and used == pytest.approx(plain, rel=1e-12)
    used.clear()
    run_cell("digits", cell, 0, _quick("digits", patience=10**6, lr=lr))
    assert used == [lr] * n                              # the default stays constant
    with pytest.raises(ValueError, match="schedule must be one of"):
        run_cell("digits", cell, 0, _quick("digits", schedule="linear-ish"))


def test_unknown_config_keys_are_refused():
    cell = {"family": "kv-relu"}
    with pytest.raises(ValueError, match=r"no config keys \['optimzer'\]"):
        run_cell("digits", cell, 0, _quick("digits", optimzer="sgd"))
    with pytest.raises(ValueError, match=r"no config keys \['lr_drops'\]"):   # the LM loop has no drops
        run_grid("lm", quick=True, config={"lr_drops": 1}, progress=False)
    # every stored size of every task passes its own check
    for t in TASKS.values():
        for size in t.sizes:
            t.check_config({**t.config(size), "lr": 1e-3})


def test_device_checks():
    with pytest.raises(ValueError, match="device"):
        run_cell("digits", {"family": "kv-relu"}, 0, _quick("digits"), device="meta")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="cuda"):
            run_cell("digits", {"family": "kv-relu"}, 0, _quick("digits"), device="cuda")


def test_cli_writes_json(tmp_path):
    assert main(["--task", "modadd", "--quick", "--seeds", "2", "--out", str(tmp_path), "--no-progress"]) == 0
    data = json.loads((tmp_path / "modadd_quick.json").read_text())
    assert data["meta"]["seeds"] == [0, 1] and data["meta"]["command"].endswith("--no-progress")
    assert len(data["runs"]) == 4 and data["meta"]["size"] == "quick"


@pytest.mark.parametrize("argv,message", [
    (["--task", "nope"], "unknown task"),
    (["--task", "digits", "--seeds", "0"], "--seeds must be >= 1"),
    (["--task", "digits", "--size", "huge"], "sizes"),
    (["--task", "digits", "--part", "3/2", "--cache", "x"], "--part must be"),
    (["--task", "digits", "--part", "1/2"], "needs --cache"),
])
def test_cli_bad_options_give_clear_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu_roughly():
    cfg = _quick("teacher")
    cell = {"teacher": "kv-relu", "family": "gated1-silu"}
    a = run_cell("teacher", cell, 0, cfg, device="cpu")
    b = run_cell("teacher", cell, 0, cfg, device="cuda")
    assert b["test_loss"] == pytest.approx(a["test_loss"], rel=1e-3)


def test_digits_bias_appends_a_constant_and_breaks_parity():
    xtr, _, _, _, xte, _ = digits_data(0, bias=True)
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
    from qkmlp.book.ch08_report import gain
    acc = gain(_fake("test_acc", True, [0.9, 0.8, 0.95], [0.8, 0.7, 0.9]), {"family": "A"}, {"family": "B"})
    loss = gain(_fake("test_loss", False, [0.1, 0.2, 0.1], [0.3, 0.5, 0.2]), {"family": "A"}, {"family": "B"})
    for r in (acc, loss):
        assert r["mean_diff"] > 0 and r["wins"] == 3 and r["losses"] == 0
    assert loss["mean_diff"] == pytest.approx((0.2 + 0.3 + 0.1) / 3)
    assert loss["diffs"] == pytest.approx([0.2, 0.3, 0.1])


def test_gain_on_a_second_metric_keeps_its_direction():
    # a task scored by accuracy, compared by its test loss: lower loss must count as better
    from qkmlp.book.ch08_report import gain
    res = _fake("test_acc", True, [0.9, 0.8, 0.95], [0.8, 0.7, 0.9])
    for r, (a, b) in zip(res["runs"], [(0.1, 0.3), (0.2, 0.5), (0.1, 0.2)] * 2):
        r["test_loss"] = a if r["family"] == "A" else b
    g = gain(res, {"family": "A"}, {"family": "B"}, metric="test_loss")
    assert g["mean_diff"] == pytest.approx((0.2 + 0.3 + 0.1) / 3) and g["wins"] == 3
    with pytest.raises(ValueError, match="_acc' or '_loss'"):
        gain(res, {"family": "A"}, {"family": "B"}, metric="swap_trained")


def test_holm_family_adds_corrected_p_and_detectable_difference():
    from qkmlp.book.ch08_report import gain, holm_family
    res = _fake("test_acc", True, [0.9, 0.8, 0.95, 0.85, 0.9], [0.8, 0.7, 0.9, 0.8, 0.85])
    rows = [gain(res, {"family": "A"}, {"family": "B"}), gain(res, {"family": "B"}, {"family": "A"})]
    holm_family(rows)
    assert rows[0]["p_holm"] == pytest.approx(min(1.0, 2 * rows[0]["t_p"]))      # both tests have the same p
    assert rows[0]["survives"] == (rows[0]["p_holm"] < 0.05)
    assert rows[0]["mde"] == pytest.approx(detectable_difference(rows[0]["sd_diff"], 5, alpha=0.025))
    with pytest.raises(ValueError, match="at least one"):
        holm_family([])


def test_shazeer_table_and_orderings():
    from qkmlp.book.ch08_report import ordering_agreement, shazeer_rows, shazeer_table1
    SHAZEER_TABLE1 = shazeer_table1()
    assert SHAZEER_TABLE1["gated1-silu"] == (1.944, 0.010, 1.636) and SHAZEER_TABLE1["kv-relu"][2] == 1.677
    fams = list(SHAZEER_TABLE1)
    # a fake grid that reproduces Shazeer's 65k-step means exactly (plus seed noise)
    runs = [{"family": f, "seed": s, "test_loss": SHAZEER_TABLE1[f][0] + 0.001 * ((s * 7 + i) % 3)}
            for i, f in enumerate(fams) for s in range(4)]
    res = {"meta": {"metric": "test_loss", "higher_is_better": False, "seeds": [0, 1, 2, 3]},
           "config": {"families": fams}, "runs": runs}
    rows = {r["family"]: r for r in shazeer_rows(res)}
    assert rows["gated1-silu"]["shazeer_65k"] == pytest.approx(1.944 - 1.997)
    assert rows["gated1-silu"]["diff"] == pytest.approx(1.944 - 1.997, abs=0.003)
    agree = ordering_agreement(res)
    assert agree["n"] == 28 and agree["kendall_tau"] > 0.9
    assert agree["agree"] >= 26                # only pairs closer than the noise may flip
    # the pairs Shazeer resolved (difference > 2 x root-sum-square of his run spreads): 18
    assert agree["resolved"] == 18 and agree["resolved_agree"] == 18
    flipped = {**res, "runs": [dict(r, test_loss=-r["test_loss"]) for r in runs]}
    assert ordering_agreement(flipped)["kendall_tau"] < -0.9


def test_parity_floor_zero_for_even_teachers_positive_otherwise():
    from qkmlp.experiments.tasks import parity_floor
    n = (32, 16, 32)
    assert parity_floor("sym1-silu", 4, 4, n, 0) < 1e-10
    assert parity_floor("gated1-identity", 4, 4, n, 0) < 1e-10
    assert parity_floor("kv-relu", 4, 4, n, 0) > 0.05
    assert parity_floor("symgated1-silu", 4, 4, n, 0) > 0.01          # the symmetrised form is not even


def test_report_plots_run():
    from qkmlp.book import figures
    from qkmlp.book.ch08_report import (gain, holm_family, plateau_rows, plot_cross_table, plot_paired,
                                          plot_val_curves, swap_rows)
    res = {t: run_grid(t, seeds=range(3), quick=True, progress=False) for t in ("digits", "teacher")}
    rows = holm_family([gain(res["digits"], {"family": "gated1-silu"}, {"family": "kv-relu"})])
    (f1, a1), (f2, a2), (f3, a3) = figures.panels(3)
    plot_paired(rows, a1, scale=100, unit="points")
    plot_val_curves(res["digits"], a2, ["kv-relu", "gated1-silu"])
    plot_cross_table(res["teacher"], a3)
    assert "<img" in figures.row_html(f1, f2, f3)
    plat = plateau_rows(res["digits"])
    assert [r["family"] for r in plat] == ["kv-relu", "gated1-silu"] and all(r["n"] == 3 for r in plat)
    assert swap_rows({"digits": res["digits"]}, ["gated1-silu"])[0]["n"] == 3


def test_run_shifts_pairs_runs_by_cell_and_seed():
    from qkmlp.book.ch08_report import run_shifts

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


def test_late_gain():
    from qkmlp.experiments.runner import late_gain
    assert late_gain([0, 20, 40, 60, 80, 100], [5, 4, 3, 2, 1.5, 1.2]) == pytest.approx(1.5 - 1.2)
    assert late_gain([0, 20, 40, 60, 80, 100], [5, 4, 1, 2, 2, 2]) == 0.0


def test_compacting_a_stored_record_keeps_it():
    # a record read back from a results file (rounded, curve already compacted) must come
    # out of the grid unchanged, late_gain included (it was computed from the full curve)
    from qkmlp.experiments.runner import _compact_curve, _round
    steps = list(range(0, 6001, 50))
    rec = {"family": "kv-relu", "curve": {"val_step": steps,
                                          "val_loss": [2 + 1 / (1 + s / 500) + 1e-7 * (s % 3) for s in steps]}}
    once = json.loads(json.dumps(_round(_compact_curve(rec))))
    assert len(once["curve"]["val_step"]) == 41 and once["late_gain"] > 0
    assert _compact_curve(once) == once
    fresh = _compact_curve({k: v for k, v in once.items() if k != "late_gain"})
    assert fresh["late_gain"] != once["late_gain"]     # recomputed from the 41 rounded points


def test_tuning_extends_the_grid_past_an_edge(monkeypatch):
    import math as _m

    def fake_run(cell, seed, cfg, device, progress=None):      # validation loss smallest at lr = 1e-4
        return {"val_loss": (_m.log10(cfg["lr"]) + 4) ** 2, "test_loss": 1.0, "test_acc": 0.5}

    monkeypatch.setattr(TASKS["digits"], "run", fake_run)
    res = run_grid("digits", quick=True, progress=False, config={"lrs": [3e-3, 1e-2]})
    row = res["tuning"][0]
    tried = sorted(float(k) for k in row["val_loss_by_lr"])
    assert tried == pytest.approx([3e-3 / (10 / 3) ** 2, 3e-3 / (10 / 3), 3e-3, 1e-2], rel=1e-2)
    assert row["lr"] == min(tried) and row["at_edge"]            # two extensions, still at the edge: flagged
    assert len(res["tune_runs"]) == 2 * 4 and all(r["lr"] == row["lr"] for r in res["runs"])
    res = run_grid("digits", quick=True, progress=False, config={"lrs": [3e-5, 1e-4, 3e-4]})
    assert [r["lr"] for r in res["tuning"]] == [1e-4, 1e-4] and len(res["tune_runs"]) == 6   # interior: no extension


def test_a_larger_budget_reuses_the_runs_that_stopped_early_and_equals_a_fresh_grid(tmp_path, monkeypatch):
    # with a constant rate and no warmup, a run that stopped before a 30-step budget is the
    # same run under a 60-step one: only the runs that hit the budget train again, and the
    # grid equals one trained from scratch at 60 steps
    import qkmlp.experiments.runner as runner
    cfg = {"max_steps": 30, "eval_every": 5, "patience": 2, "lrs": [1e-3, 3e-2]}
    small = run_grid("teacher", quick=True, progress=False, config=cfg, cache=tmp_path)
    early = [r for r in small["runs"] + small["tune_runs"] if r["stopped"] != "budget"]
    hit = [r for r in small["runs"] + small["tune_runs"] if r["stopped"] == "budget"]
    assert early and hit, "the quick config should have runs of both kinds"
    fresh = run_grid("teacher", quick=True, progress=False, config={**cfg, "max_steps": 60})
    calls = []
    real = runner.run_cell
    monkeypatch.setattr(runner, "run_cell", lambda *a, **k: calls.append(a[:3]) or real(*a, **k))
    big = run_grid("teacher", quick=True, progress=False, cache=tmp_path,
                   config={**cfg, "max_steps": 60, "reuse_budgets": [30]})
    assert [strip_provenance(r) for r in save_load(big)["runs"]] == [strip_provenance(r) for r in save_load(fresh)["runs"]]
    assert save_load(big)["tuning"] == save_load(fresh)["tuning"]
    reused = [r for r in big["runs"] + big["tune_runs"] if r.get("reused_from_budget") == 30]
    assert reused and all(r["stopped"] != "budget" for r in reused)
    assert big["meta"]["runs_reused_from_budgets_here"] == len(reused)
    assert big["meta"]["runs_computed_here"] == len(calls) == len(big["runs"]) + len(big["tune_runs"]) - len(reused)
    # no run that hit the 30-step budget was reused
    hit_keys = {(runner.cell_key(r), r["seed"], r["lr"]) for r in hit}
    assert not hit_keys & {(runner.cell_key(r), r["seed"], r["lr"]) for r in reused}


def test_reuse_budgets_refuses_a_schedule_that_depends_on_the_budget():
    with pytest.raises(ValueError, match="constant learning rate"):
        run_grid("lm", quick=True, progress=False, config={"reuse_budgets": [4]})
    with pytest.raises(ValueError, match="multiples of eval_every"):
        run_grid("teacher", quick=True, progress=False, config={"reuse_budgets": [7]})
    with pytest.raises(ValueError, match="smaller than max_steps"):
        run_grid("teacher", quick=True, progress=False, config={"reuse_budgets": [30]})


def test_records_carry_the_code_that_trained_them_and_the_cache_is_keyed_on_its_version(tmp_path, monkeypatch):
    import subprocess

    import qkmlp.experiments.runner as runner

    rec = run_cell("modadd", TASKS["modadd"].cells(TASKS["modadd"].quick)[0], seed=0, config=_quick("modadd"))
    here = subprocess.run(["git", "-C", runner.__file__.rsplit("/", 1)[0], "rev-parse", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    assert rec["git_commit"] == (here or "unknown") and rec["code_version"] == runner.RUN_CODE_VERSION
    assert isinstance(rec["git_dirty"], (bool, type(None)))
    assert {"git_commit", "git_dirty", "code_version"}.isdisjoint(strip_provenance(rec))
    # a grid's records land in a folder named by the config hash, which includes the code version
    run_grid("modadd", quick=True, progress=False, cache=tmp_path)
    first = {p.name for p in tmp_path.iterdir()}
    assert len(first) == 1 and all(json.loads(p.read_text())["code_version"] == runner.RUN_CODE_VERSION
                                   for p in next(tmp_path.iterdir()).glob("*.json"))
    monkeypatch.setattr(runner, "RUN_CODE_VERSION", runner.RUN_CODE_VERSION + 1)
    calls = []
    real = runner.run_cell
    monkeypatch.setattr(runner, "run_cell", lambda *a, **k: calls.append(1) or real(*a, **k))
    run_grid("modadd", quick=True, progress=False, cache=tmp_path)
    assert len({p.name for p in tmp_path.iterdir()} - first) == 1     # a new folder: nothing reused
    assert calls                                                      # every run trained again


def test_wilcoxon_matches_scipy_without_ties_and_a_brute_force_with_them():
    import itertools

    import numpy as np
    from scipy.stats import rankdata, wilcoxon

    from qkmlp.runbase.stats import wilcoxon_test

    rng = np.random.default_rng(0)
    for n in (2, 5, 10, 12):
        for _ in range(10):
            d = list(rng.normal(0.3, 1.0, n))
            assert wilcoxon_test(d) == pytest.approx(wilcoxon(d, method="exact").pvalue, abs=1e-12)
    for _ in range(10):                            # ties and zeros: the exact conditional distribution
        d = [float(x) for x in np.round(rng.normal(0.3, 1.0, 8), 1)] + [0.0]
        nz = [x for x in d if x != 0]
        r = rankdata(np.abs(nz))
        w = r[np.array(nz) > 0].sum()
        sums = [sum(ri for ri, s in zip(r, signs) if s) for signs in itertools.product((0, 1), repeat=len(nz))]
        c = r.sum() / 2
        want = np.mean([abs(s - c) >= abs(w - c) - 1e-12 for s in sums])
        assert wilcoxon_test(d) == pytest.approx(want, abs=1e-12)
    assert wilcoxon_test([0.0, 0.0]) == 1.0
    assert wilcoxon_test([1.0] * 10) == pytest.approx(2 / 2 ** 10)


def test_tost_is_the_interval_inside_the_margin():
    import numpy as np

    from qkmlp.runbase.stats import tost

    rng = np.random.default_rng(1)
    for _ in range(200):
        d = list(rng.normal(rng.uniform(-0.01, 0.01), 0.004, 10))
        margin = float(rng.uniform(0.002, 0.012))
        lo, hi = t_interval(d, 0.90)
        assert (tost(d, margin) < 0.05) == (-margin < lo and hi < margin)
    with pytest.raises(ValueError, match="margin"):
        tost([0.1, 0.2], 0.0)


def test_tau_bootstrap_point_values_match_kendall_and_the_ordering_counts():
    from pathlib import Path

    from qkmlp.book.ch08_report import ordering_agreement, tau_bootstrap

    data = Path(__file__).parent.parent / "book" / "data" / "experiments"
    short, long = load_results(data / "lm.json"), load_results(data / "lm_long_all.json")
    out = tau_bootstrap(short, long, n_boot=300)
    for grid, key in ((short, "tau"), (long, "tau_other")):
        agree = ordering_agreement(grid)
        assert out["all"][key] == pytest.approx(agree["kendall_tau"], abs=1e-12)     # scipy's, no ties here
        res = agree["resolved"]
        assert out["resolved"][key] == pytest.approx((2 * agree["resolved_agree"] - res) / res)
    for k in ("all", "resolved"):
        lo, hi = out[k]["ci_change"]
        assert lo <= out[k]["change"] <= hi and out[k]["ci"][0] <= out[k]["tau"] <= out[k]["ci"][1]


def test_twenty_seed_size_shares_the_24000_step_grid_and_its_records():
    """compute_24000_twenty adds seeds 30-39 to compute_24000: same run config (so the same
    folder of records and the stored tuning runs), same rates tried, seeds 20-39."""
    from qkmlp.experiments.runner import _config_hash
    from qkmlp.experiments.tasks import get_task

    t = get_task("lm")
    a, b = t.config("compute_24000"), t.config("compute_24000_twenty")
    assert b["seeds"] == list(range(20, 40)) and a["seeds"] == list(range(20, 30))
    assert b["records_of"] == "compute_24000"
    drop = ("seeds", "records_of")
    assert {k: v for k, v in a.items() if k not in drop} == {k: v for k, v in b.items() if k not in drop}
    run_keys = ("seeds", "lrs", "tune_seeds", "families", "lr_extensions", "records_of")
    assert _config_hash("lm", {k: v for k, v in b.items() if k not in run_keys}) == "8f817f1703c2"


def test_run_records_say_which_cpu_computed_them():
    from qkmlp.experiments.runner import run_cell

    from qkmlp.experiments.tasks import get_task

    rec = run_cell("digits", {"family": "kv-relu"}, 0, {**get_task("digits").quick, "lr": 0.01})
    m = rec["machine"]
    assert m["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert m["torch_threads"] == torch.get_num_threads() and m["torch"] == torch.__version__
    assert isinstance(m["cpu"], str) and m["cpu"] and "numpy" in m
