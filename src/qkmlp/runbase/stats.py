"""Summaries and paired comparisons across seeds.

Two families run with the same seeds see the same data (the seed fixes the data split,
the teacher and the minibatch order), so their metrics pair up seed by seed. The paired
differences d_i = a_i − b_i are summarised by their mean, a Student-t confidence interval
and an exact two-sided sign test. With n = 5 seeds the smallest possible sign-test
p-value is 2/2⁵ = 0.0625: the sign test alone can never reach 5 % at five seeds, which is
why the t-interval is reported beside it.

A chapter that makes many comparisons declares each prediction's *family* of tests and
corrects their p-values with Holm's step-down method (:func:`holm`), which controls the
probability of any false rejection in the family at α. :func:`detectable_difference`
gives the smallest true mean difference a paired t-test of n seeds detects with a given
power, from the observed spread of the differences: the honest "we could not have seen
an effect smaller than this".
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

__all__ = ["mean_sd", "sign_test", "t_interval", "t_test", "wilcoxon_test", "tost", "paired_comparison", "holm",
           "holm_rejects", "paired_t",
           "detectable_difference", "spending", "sequential_bounds", "sequential_look"]


def _floats(values, name: str) -> list[float]:
    try:
        out = [float(v) for v in values]
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a sequence of numbers") from None
    if not all(math.isfinite(v) for v in out):
        raise ValueError(f"{name} must contain only finite numbers, got {out}")
    return out


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof = 1; 0.0 for a single value)."""
    v = _floats(values, "values")
    if not v:
        raise ValueError("values must not be empty")
    mu = sum(v) / len(v)
    if len(v) == 1:
        return mu, 0.0
    return mu, math.sqrt(sum((x - mu) ** 2 for x in v) / (len(v) - 1))


def sign_test(diffs: Sequence[float]) -> float:
    """Exact two-sided sign-test p-value for median(diffs) = 0; zeros are dropped.

    Returns 1.0 when every difference is zero.
    """
    d = _floats(diffs, "diffs")
    pos = sum(1 for x in d if x > 0)
    neg = sum(1 for x in d if x < 0)
    n = pos + neg
    if n == 0:
        return 1.0
    k = min(pos, neg)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def t_interval(diffs: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """Student-t confidence interval for the mean of ``diffs`` (needs at least 2 values)."""
    from scipy.stats import t as student_t

    d = _floats(diffs, "diffs")
    if len(d) < 2:
        raise ValueError(f"a t-interval needs at least 2 paired differences, got {len(d)}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    mu, sd = mean_sd(d)
    half = float(student_t.ppf(0.5 + level / 2, df=len(d) - 1)) * sd / math.sqrt(len(d))
    return mu - half, mu + half


def t_test(diffs: Sequence[float]) -> float:
    """Two-sided one-sample t-test p-value for mean(diffs) = 0 (the paired t-test).

    All-zero differences give 1.0; differences with zero spread but a non-zero mean give 0.0.
    """
    from scipy.stats import t as student_t

    d = _floats(diffs, "diffs")
    if len(d) < 2:
        raise ValueError(f"a t-test needs at least 2 paired differences, got {len(d)}")
    mu, sd = mean_sd(d)
    if sd == 0.0:
        return 1.0 if mu == 0.0 else 0.0
    t = mu / (sd / math.sqrt(len(d)))
    return float(min(1.0, 2 * student_t.sf(abs(t), df=len(d) - 1)))


def wilcoxon_test(diffs: Sequence[float]) -> float:
    """Exact two-sided Wilcoxon signed-rank p-value for a distribution symmetric about 0.

    Zeros are dropped; tied absolute values share their mean rank. The null distribution
    of W⁺ (the sum of the ranks of the positive differences) is counted over all 2ⁿ
    sign patterns of the observed ranks, so ties are handled exactly (any n). The
    p-value is P(|W⁺ − E W⁺| ≥ |w⁺ − E W⁺|) under that distribution.
    """
    d = [x for x in _floats(diffs, "diffs") if x != 0.0]
    n = len(d)
    if n == 0:
        return 1.0
    absd = sorted(range(n), key=lambda i: abs(d[i]))
    ranks = [0.0] * n
    i = 0
    while i < n:                      # mean ranks over ties of |d|
        j = i
        while j + 1 < n and abs(d[absd[j + 1]]) == abs(d[absd[i]]):
            j += 1
        for k in range(i, j + 1):
            ranks[absd[k]] = (i + j) / 2 + 1
        i = j + 1
    # Twice the ranks are integers: count the sign patterns by their rank sum (dynamic
    # programming over the 2ⁿ patterns, exact for any n).
    twice = [round(2 * r) for r in ranks]
    total = sum(twice)
    counts = [0] * (total + 1)
    counts[0] = 1
    for r in twice:
        for s_ in range(total, r - 1, -1):
            counts[s_] += counts[s_ - r]
    w = sum(r for r, x in zip(twice, d) if x > 0)
    dev = abs(2 * w - total)
    hits = sum(c for s_, c in enumerate(counts) if abs(2 * s_ - total) >= dev)
    return hits / (1 << n)


def tost(diffs: Sequence[float], margin: float) -> float:
    """TOST p-value for |mean(diffs)| < ``margin`` (two one-sided t-tests, the larger p).

    Below α it shows the mean difference within ±margin at level α: equivalently, the
    (1 − 2α) t-interval lies inside (−margin, margin).
    """
    from scipy.stats import t as student_t

    d = _floats(diffs, "diffs")
    if not (isinstance(margin, (int, float)) and math.isfinite(margin) and margin > 0):
        raise ValueError(f"margin must be a positive finite number, got {margin!r}")
    if len(d) < 2:
        raise ValueError(f"TOST needs at least 2 paired differences, got {len(d)}")
    mu, sd = mean_sd(d)
    if sd == 0.0:
        return 0.0 if abs(mu) < margin else 1.0
    se, df = sd / math.sqrt(len(d)), len(d) - 1
    p_lower = float(student_t.sf((mu + margin) / se, df))     # H0: mean <= -margin
    p_upper = float(student_t.cdf((mu - margin) / se, df))    # H0: mean >= +margin
    return max(p_lower, p_upper)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values, in the input order.

    Sort p ascending; the i-th smallest (i = 0, 1, ...) is multiplied by (m − i), the
    results are made non-decreasing in that order and capped at 1. Rejecting where the
    adjusted p < α controls the family-wise error rate at α.
    """
    p = _floats(pvalues, "pvalues")
    if any(not 0.0 <= x <= 1.0 for x in p):
        raise ValueError(f"p-values must lie in [0, 1], got {p}")
    m = len(p)
    order = sorted(range(m), key=lambda i: p[i])
    out = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out


def holm_rejects(pvalues: Sequence[float], level: float = 0.05) -> list[bool]:
    """Holm's step-down procedure: which hypotheses are rejected at family-wise ``level``
    (the i-th smallest p is rejected while p ≤ level / (m − i)); the same as
    ``holm(pvalues)[i] <= level``."""
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    return [q <= level for q in holm(pvalues)]


def paired_t(a: Sequence[float], b: Sequence[float]) -> dict:
    """Paired Student-t test of mean(b − a) = 0 (over windows, seeds, ...): ``mean``, ``se``,
    ``t`` and the two-sided ``p`` (n − 1 degrees of freedom)."""
    from scipy.stats import t as student_t

    a, b = _floats(a, "a"), _floats(b, "b")
    if len(a) != len(b):
        raise ValueError(f"a and b must be paired (same length), got {len(a)} and {len(b)}")
    n = len(a)
    if n < 2:
        raise ValueError("a paired t-test needs at least 2 pairs")
    mean, sd = mean_sd([y - x for x, y in zip(a, b)])
    se = sd / math.sqrt(n)
    if se == 0:
        t, p = (0.0, 1.0) if mean == 0 else (math.copysign(math.inf, mean), 0.0)
    else:
        t = mean / se
        p = float(2 * student_t.sf(abs(t), df=n - 1))
    return {"mean": mean, "se": se, "t": t, "p": p}


def detectable_difference(sd_diff: float, n: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """Smallest true mean difference a two-sided paired t-test at level ``alpha`` detects with
    probability ``power``, for n pairs whose differences have standard deviation ``sd_diff``.

    Solves P(|T| > t_{1−α/2, n−1}) = power for the non-central t with non-centrality
    δ√n/sd_diff (exact, not the normal approximation).
    """
    from scipy.optimize import brentq
    from scipy.stats import nct
    from scipy.stats import t as student_t

    if not (isinstance(n, int) and n >= 2):
        raise ValueError(f"n must be an integer >= 2, got {n!r}")
    if not (math.isfinite(sd_diff) and sd_diff >= 0):
        raise ValueError(f"sd_diff must be finite and >= 0, got {sd_diff!r}")
    for v, name in ((alpha, "alpha"), (power, "power")):
        if not 0 < v < 1:
            raise ValueError(f"{name} must be in (0, 1), got {v!r}")
    if sd_diff == 0.0:
        return 0.0
    df = n - 1
    crit = float(student_t.ppf(1 - alpha / 2, df))

    def gap(nc):
        upper = float(nct.sf(crit, df, nc))
        lower = float(nct.cdf(-crit, df, nc))   # scipy returns nan when this tail underflows
        return upper + (lower if math.isfinite(lower) else 0.0) - power

    hi = crit + 4.0
    while gap(hi) < 0:          # power grows with the non-centrality; widen until it passes
        hi *= 2
    nc = brentq(gap, 0.0, hi)
    return nc * sd_diff / math.sqrt(n)


def paired_comparison(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> dict:
    """Compare metric lists ``a`` and ``b`` paired by seed (same order, same length).

    Returns ``n``, ``mean_diff`` (a − b), ``sd_diff``, ``ci`` (t-interval), ``wins``
    (seeds with a > b), ``losses``, ``sign_p`` and ``significant`` (the t-interval
    excludes 0), ``t_p``, the two-sided paired t-test p-value (uncorrected),
    ``wilcoxon_p`` (exact signed-rank, uncorrected), and ``diffs``.
    """
    a, b = _floats(a, "a"), _floats(b, "b")
    if len(a) != len(b):
        raise ValueError(f"a and b must be paired (same length), got {len(a)} and {len(b)}")
    diffs = [x - y for x, y in zip(a, b)]
    mu, sd = mean_sd(diffs)
    lo, hi = t_interval(diffs, level)
    return {
        "n": len(diffs),
        "mean_diff": mu,
        "sd_diff": sd,
        "ci": (lo, hi),
        "wins": sum(1 for x in diffs if x > 0),
        "losses": sum(1 for x in diffs if x < 0),
        "sign_p": sign_test(diffs),
        "t_p": t_test(diffs),
        "wilcoxon_p": wilcoxon_test(diffs),
        "diffs": diffs,
        "significant": bool(lo > 0 or hi < 0),
    }


# --- group-sequential tests ------------------------------------------------------------

def spending(t: float, alpha: float = 0.05, kind: str = "obrien-fleming") -> float:
    """The Lan-DeMets (1983) α-spending function of a two-sided test at information
    fraction ``t``: the type I error spent by then, both sides together, each side spending
    half. ``"obrien-fleming"``: 2·[2 − 2Φ(z_{1−α/4}/√t)], the one-sided O'Brien-Fleming-type
    function at α/2 per side (spends almost nothing early; the convention of gsDesign's
    ``sfLDOF`` with ``test.type=2`` and of DeMets & Lan 1994); ``"pocock"``:
    α·ln(1 + (e − 1)t)."""
    from scipy.stats import norm

    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    if not 0 <= t <= 1:
        raise ValueError(f"the information fraction t must be in [0, 1], got {t!r}")
    if kind == "obrien-fleming":
        return 0.0 if t == 0 else float(2 * (2 - 2 * norm.cdf(norm.isf(alpha / 4) / math.sqrt(t))))
    if kind == "pocock":
        return float(alpha * math.log(1 + (math.e - 1) * t))
    raise ValueError(f"kind must be 'obrien-fleming' or 'pocock', got {kind!r}")


def sequential_bounds(fractions: Sequence[float], alpha: float = 0.05, kind: str = "obrien-fleming",
                      grid: int = 2001) -> list[dict]:
    """Two-sided group-sequential boundaries from a Lan-DeMets spending function.

    ``fractions``: the information fractions of the looks, increasing, the last 1 (for a
    paired test of n_k seeds at look k out of N: n_k / N). At look k the test rejects when
    |Z_k| ≥ c_k, where Z_k is the standardised statistic on the data so far (a Brownian
    motion in the information: Cov(Z_i, Z_j) = √(t_i/t_j), i ≤ j); c_k is chosen so that the
    probability under the null of a first crossing at look k is the increment of
    :func:`spending` (numerical integration of the continuation densities on a grid,
    Armitage, McPherson & Rowe 1969; Jennison & Turnbull 2000, ch. 19).

    Returns one dict per look: ``fraction``, ``z`` (c_k), ``nominal_p`` (2(1 − Φ(c_k)), the
    two-sided p-value at which look k rejects), ``spent`` (α spent by look k) and
    ``cross_p`` (the null probability of a first crossing at look k, recomputed).
    """
    import numpy as np
    from scipy.optimize import brentq
    from scipy.stats import norm

    ts = _floats(fractions, "fractions")
    if not ts or any(b <= a for a, b in zip(ts, ts[1:])) or ts[0] <= 0 or abs(ts[-1] - 1) > 1e-12:
        raise ValueError(f"fractions must increase strictly from above 0 to exactly 1, got {list(fractions)}")
    if grid < 101 or grid % 2 == 0:
        raise ValueError(f"grid must be an odd number of points >= 101, got {grid!r}")
    spent = [spending(t, alpha, kind) for t in ts]
    out = []
    # look 1: Z_1 is standard normal
    c = float(norm.isf((spent[0]) / 2))
    out.append({"fraction": ts[0], "z": c, "nominal_p": spent[0], "spent": spent[0], "cross_p": spent[0]})
    # sub-density of S_1 = Z_1 √t_1 on the continuation region, on Simpson's grid
    b = c * math.sqrt(ts[0])
    s = np.linspace(-b, b, grid)
    w = np.full(grid, 2.0)
    w[1:-1:2] = 4.0
    w[0] = w[-1] = 1.0
    w *= (s[1] - s[0]) / 3
    f = norm.pdf(s, scale=math.sqrt(ts[0]))
    for k in range(1, len(ts)):
        sd = math.sqrt(ts[k] - ts[k - 1])
        target = spent[k] - spent[k - 1]

        def cross(bk):
            # P(continue to k−1, then |S_k| ≥ bk) = ∫ f(u) P(|u + D| ≥ bk) du, D ~ N(0, Δt)
            tail = norm.sf((bk - s) / sd) + norm.cdf((-bk - s) / sd)
            return float(np.sum(w * f * tail))

        lo, hi = 1e-9, 40.0 * math.sqrt(ts[k])
        if cross(lo) < target:
            raise ValueError(f"look {k + 1} cannot spend {target:.3g}: the continuation probability is too small")
        bk = brentq(lambda x: cross(x) - target, lo, hi, xtol=1e-12)
        ck = bk / math.sqrt(ts[k])
        out.append({"fraction": ts[k], "z": ck, "nominal_p": float(2 * norm.sf(ck)), "spent": spent[k],
                    "cross_p": cross(bk)})
        if k + 1 < len(ts):      # the continuation density at look k
            s_new = np.linspace(-bk, bk, grid)
            kern = norm.pdf((s_new[:, None] - s[None, :]) / sd) / sd
            f = kern @ (w * f)
            s = s_new
            w = np.full(grid, 2.0)
            w[1:-1:2] = 4.0
            w[0] = w[-1] = 1.0
            w *= (s[1] - s[0]) / 3
    return out


def sequential_look(diffs: Sequence[float], nominal_p: float, margin: Optional[float] = None) -> dict:
    """One look of a group-sequential paired t-test at its boundary's nominal level.

    The look rejects "no difference" when the two-sided paired t p-value of ``diffs`` is at
    most ``nominal_p`` (the boundary carried to the t scale by equal p-values). The
    repeated confidence interval is mean ± t_{n−1, 1−nominal_p/2}·sd/√n: the intervals of
    all looks cover the true mean together with probability about 1 − α, whatever the
    stopping rule, so its ends are the effects the data exclude at that look. With
    ``margin``, ``inside_margin`` says whether that interval lies inside ±margin.

    Returns ``n``, ``mean_diff``, ``sd_diff``, ``t_p``, ``nominal_p``, ``rejects``,
    ``rci`` and (with a margin) ``inside_margin``.
    """
    from scipy.stats import t as student_t

    d = _floats(diffs, "diffs")
    if len(d) < 2:
        raise ValueError(f"a look needs at least two paired differences, got {len(d)}")
    if not 0 < nominal_p < 1:
        raise ValueError(f"nominal_p must be in (0, 1), got {nominal_p!r}")
    mu, sd = mean_sd(d)
    p = t_test(d)
    half = float(student_t.isf(nominal_p / 2, len(d) - 1)) * sd / math.sqrt(len(d))
    out = {"n": len(d), "mean_diff": mu, "sd_diff": sd, "t_p": p, "nominal_p": nominal_p,
           "rejects": bool(p <= nominal_p), "rci": (mu - half, mu + half)}
    if margin is not None:
        if not (math.isfinite(margin) and margin > 0):
            raise ValueError(f"margin must be finite and > 0, got {margin!r}")
        out["inside_margin"] = bool(-margin < mu - half and mu + half < margin)
    return out
