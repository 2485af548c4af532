"""qkmlp.experiments.unrounded: a grid file's losses replaced by its per-run records' own,
checked on the stored 24,000-step grid (the records are read here directly, by name)."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from scipy import stats

from qkmlp.experiments import load_results, unrounded
from qkmlp.runbase.stats import wilcoxon_test

EXP = Path(__file__).resolve().parents[1] / "book" / "data" / "experiments"
FOLDER = EXP / "runs" / "lm-compute_24000-8f817f1703c2"


def _record(family, seed):
    (path,) = FOLDER.glob(f"eval_{family}_lr*_s{seed}.json")
    return json.loads(path.read_text())


def test_the_values_are_the_records_and_round_to_the_file():
    grid = load_results(EXP / "lm_compute_24000.json")
    out = unrounded(grid, FOLDER)
    assert grid["runs"][0]["test_loss"] == round(grid["runs"][0]["test_loss"], 4)     # the file is rounded
    for r, u in zip(grid["runs"], out["runs"]):
        rec = _record(r["family"], r["seed"])
        assert u["test_loss"] == rec["test_loss"] and u["val_loss"] == rec["val_loss"]
        assert abs(u["test_loss"] - r["test_loss"]) <= 5e-5
    assert grid["runs"][0]["test_loss"] != out["runs"][0]["test_loss"]               # the input is untouched


def test_rounding_moves_the_exact_wilcoxon_p_of_the_symmetric_layer():
    # the declaration lm24k-twenty-seeds states 0.025 from the file and 0.027 from the records
    grid = load_results(EXP / "lm_compute_24000.json")

    def diffs(res):
        v = {(r["family"], r["seed"]): r["test_loss"] for r in res["runs"]}
        return [v["gated1-silu", s] - v["sym1-silu", s] for s in range(20, 30)]

    rounded, full = diffs(grid), diffs(unrounded(grid, FOLDER))
    assert len(set(abs(x) for x in rounded)) < 10 == len(set(abs(x) for x in full))   # rounding ties a pair
    assert f"{wilcoxon_test(rounded):.3f}" == "0.025"                                 # exact with the tie
    # without ties scipy's exact test is an independent computation of the same p
    assert f"{wilcoxon_test(full):.3f}" == f"{stats.wilcoxon(full, method='exact').pvalue:.3f}" == "0.027"


def test_a_missing_or_disagreeing_record_is_refused(tmp_path):
    grid = load_results(EXP / "lm_compute_24000.json")
    with pytest.raises(FileNotFoundError, match="no folder of run records"):
        unrounded(grid, tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="no record eval_"):
        unrounded(grid, tmp_path)
    bad = copy.deepcopy(grid)
    bad["runs"][3]["test_loss"] += 1e-3
    with pytest.raises(ValueError, match="does not round to"):
        unrounded(bad, FOLDER)
