"""Tests of the group-sequential boundaries and looks (qkmlp.runbase.stats) against published
values, scipy's bivariate normal and Monte Carlo under the null."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from qkmlp.runbase.stats import sequential_bounds, sequential_look, spending


@pytest.mark.parametrize("fractions, kind, published", [
    # two-sided alpha 0.05, Lan-DeMets spending; O'Brien-Fleming-type values as in DeMets &
    # Lan (1994, Stat. Med. 13:1341, Table I) and gsDesign (sfLDOF, test.type = 2)
    ([0.5, 1.0], "obrien-fleming", [2.9626, 1.9686]),
    ([1 / 3, 2 / 3, 1.0], "obrien-fleming", [3.7103, 2.5114, 1.9930]),
    ([0.2, 0.4, 0.6, 0.8, 1.0], "obrien-fleming", [4.8769, 3.3569, 2.6803, 2.2898, 2.0310]),
    ([0.2, 0.4, 0.6, 0.8, 1.0], "pocock", [2.4380, 2.4268, 2.4101, 2.3966, 2.3859]),
])
def test_bounds_match_published_values(fractions, kind, published):
    got = [r["z"] for r in sequential_bounds(fractions, 0.05, kind)]
    assert got == pytest.approx(published, abs=2e-4)


def test_two_looks_spend_exactly_by_the_bivariate_normal():
    t1 = 0.5
    rows = sequential_bounds([t1, 1.0])
    c1, c2 = rows[0]["z"], rows[1]["z"]
    r = math.sqrt(t1)                      # Cov(Z_1, Z_2) = sqrt(t1 / t2)
    mvn = sps.multivariate_normal(mean=[0, 0], cov=[[1, r], [r, 1]])

    def box(a, b):                         # P(|Z1| < a, |Z2| < b)
        return (mvn.cdf([a, b]) - mvn.cdf([-a, b]) - mvn.cdf([a, -b]) + mvn.cdf([-a, -b]))

    first = 2 * sps.norm.sf(c1)
    second = (1 - first) - box(c1, c2)
    assert first == pytest.approx(spending(t1), abs=1e-9)
    assert second == pytest.approx(spending(1.0) - spending(t1), abs=2e-5)
    assert first + second == pytest.approx(0.05, abs=2e-5)


def test_crossing_rates_under_the_null_by_monte_carlo():
    fractions = [0.3, 0.7, 1.0]           # unequal looks
    rows = sequential_bounds(fractions, 0.05)
    rng = np.random.default_rng(1)
    n = 400_000
    incs = rng.standard_normal((n, 3)) * np.sqrt(np.diff([0.0] + fractions))
    z = np.cumsum(incs, axis=1) / np.sqrt(fractions)
    crossed = np.abs(z) >= np.array([r["z"] for r in rows])
    first = np.where(crossed.any(axis=1), crossed.argmax(axis=1), -1)
    for k, r in enumerate(rows):
        want = r["spent"] - (rows[k - 1]["spent"] if k else 0.0)
        se = math.sqrt(want * (1 - want) / n)
        assert abs(np.mean(first == k) - want) < 4.5 * se
    assert np.mean(first >= 0) == pytest.approx(0.05, abs=4.5 * math.sqrt(0.05 * 0.95 / n))


def test_paired_t_looks_hold_alpha_and_cover_by_monte_carlo():
    """The declared use: paired t-tests of 20 then 40 seeds at the boundaries' nominal p-values.
    Under the null the test rejects in about 5 % of trials, and the repeated intervals of the
    two looks cover the true mean together in about 95 %."""
    rows = sequential_bounds([0.5, 1.0])
    rng = np.random.default_rng(2)
    trials, shift = 40_000, 0.3
    d = rng.standard_normal((trials, 40)) + shift
    reject, cover = np.zeros(trials, bool), np.ones(trials, bool)
    for n, r in zip((20, 40), rows):
        x = d[:, :n]
        mu, se = x.mean(1), x.std(1, ddof=1) / math.sqrt(n)
        p = 2 * sps.t.sf(np.abs((mu - shift) / se), n - 1)
        reject |= p <= r["nominal_p"]
        half = sps.t.isf(r["nominal_p"] / 2, n - 1) * se
        cover &= (mu - half <= shift) & (shift <= mu + half)
    se = math.sqrt(0.05 * 0.95 / trials)
    assert abs(reject.mean() - 0.05) < 4.5 * se
    assert abs(cover.mean() - 0.95) < 4.5 * se


def test_one_look_by_scipy():
    rng = np.random.default_rng(3)
    d = list(rng.normal(-0.004, 0.007, size=20))
    look = sequential_look(d, 0.00305, margin=0.005)
    ref = sps.ttest_1samp(d, 0.0)
    assert look["t_p"] == pytest.approx(ref.pvalue, rel=1e-10)
    assert look["rejects"] == (ref.pvalue <= 0.00305)
    half = sps.t.ppf(1 - 0.00305 / 2, 19) * np.std(d, ddof=1) / math.sqrt(20)
    assert look["rci"] == pytest.approx((np.mean(d) - half, np.mean(d) + half), rel=1e-10)
    assert look["inside_margin"] == (-0.005 < np.mean(d) - half and np.mean(d) + half < 0.005)
    tight = sequential_look([0.0001, -0.0001, 0.0002, 0.0], 0.05, margin=0.005)
    assert tight["inside_margin"] and not tight["rejects"]


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="increase strictly"):
        sequential_bounds([0.6, 0.4, 1.0])
    with pytest.raises(ValueError, match="exactly 1"):
        sequential_bounds([0.5, 0.9])
    with pytest.raises(ValueError, match="kind must be"):
        spending(0.5, kind="haybittle")
    with pytest.raises(ValueError, match="nominal_p"):
        sequential_look([0.1, 0.2], 0.0)
    with pytest.raises(ValueError, match="at least two"):
        sequential_look([0.1], 0.05)
