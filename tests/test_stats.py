"""qkmlp.runbase.stats, the one statistics module of the pipelines and the book, against
scipy and against brute force."""
from __future__ import annotations

import itertools
import random

import pytest

from qkmlp.runbase.stats import holm, holm_rejects, paired_t, wilcoxon_test


def test_paired_t_against_scipy():
    from scipy.stats import ttest_rel

    a, b = [1.0, 2.0, 3.0, 4.0, 2.5], [1.4, 2.1, 3.9, 4.2, 2.4]
    got = paired_t(a, b)
    ref = ttest_rel(b, a)
    assert got["t"] == pytest.approx(ref.statistic) and got["p"] == pytest.approx(ref.pvalue)
    assert got["mean"] == pytest.approx(sum(y - x for x, y in zip(a, b)) / 5)
    assert paired_t(a, a) == {"mean": 0.0, "se": 0.0, "t": 0.0, "p": 1.0}
    with pytest.raises(ValueError, match="paired"):
        paired_t([1.0, 2.0], [1.0])


def test_holm_step_down():
    # m = 4: thresholds 0.0125, 0.0167, 0.025, 0.05 for the sorted p-values
    assert holm_rejects([0.01, 0.04, 0.03, 0.005]) == [True, False, False, True]
    assert holm_rejects([0.01, 0.015, 0.02, 0.04]) == [True, True, True, True]
    assert holm_rejects([0.02, 0.001]) == [True, True]           # 0.001 <= 0.05/2, then 0.02 <= 0.05/1
    assert holm_rejects([0.03, 0.026]) == [False, False]         # 0.026 > 0.05/2: nothing rejected
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    with pytest.raises(ValueError):
        holm_rejects([0.1], level=0)


def _wilcoxon_brute(d):
    """P(|W+ - E W+| >= observed) over all sign patterns, by enumeration (mean ranks for ties)."""
    d = [x for x in d if x != 0]
    a = sorted(abs(x) for x in d)
    rank = {v: (a.index(v) + len(a) - a[::-1].index(v) - 1) / 2 + 1 for v in a}
    r = [rank[abs(x)] for x in d]
    centre = sum(r) / 2
    w = sum(ri for ri, x in zip(r, d) if x > 0)
    hits = sum(abs(sum(ri for ri, s in zip(r, signs) if s) - centre) >= abs(w - centre) - 1e-9
               for signs in itertools.product((0, 1), repeat=len(r)))
    return hits / 2 ** len(r)


def test_wilcoxon_is_exact_with_ties_and_matches_scipy_without():
    from scipy.stats import wilcoxon

    rng = random.Random(0)
    for n in (3, 6, 9, 12):
        d = [rng.gauss(0.3, 1.0) for _ in range(n)]
        assert wilcoxon_test(d) == pytest.approx(wilcoxon(d, method="exact").pvalue, rel=1e-12)
        tied = [round(x, 1) for x in d]
        assert wilcoxon_test(tied) == pytest.approx(_wilcoxon_brute(tied), rel=1e-12)
    # the chapter-8 case the grid file's rounding changed: 28 of 1024 sign patterns
    assert wilcoxon_test([1.0, 2.0, -3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]) == pytest.approx(
        _wilcoxon_brute([1.0, 2.0, -3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]))
    d20 = [rng.gauss(0.5, 1.0) for _ in range(20)]      # twenty seeds: exact, and fast
    assert wilcoxon_test(d20) == pytest.approx(wilcoxon(d20, method="exact").pvalue, rel=1e-12)
    assert wilcoxon_test([0.0, 0.0]) == 1.0
