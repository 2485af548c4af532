"""Statistics of the timings: median intervals, paired ratios, the A/A spread, verdicts.

A ratio of two candidates is taken *paired*, round by round (entry i of both time lists
was measured in the same round of :func:`~qkmlp.bench.timing.time_interleaved`), with a
distribution-free 95 % interval for its median (:func:`median_interval`). The A/A
control (a second Llama MLP) gives the spread within which two identical workloads drift
apart (:func:`aa_spread`); a verdict against a goal (:func:`verdict`) or against that
spread (:func:`control_verdict`) reads the whole interval.
"""
from __future__ import annotations

import statistics

__all__ = ["median_interval", "paired_ratio", "pooled_paired_ratio", "aa_spread", "control_verdict",
           "TARGETS", "verdict"]


def median_interval(values, level: float = 0.95) -> dict:
    """Median of ``values`` with a distribution-free confidence interval for it.

    The interval is [x_(k), x_(n+1-k)] of the sorted values, k the largest rank whose
    binomial tail P(Bin(n, ½) < k) is at most (1 - level)/2; it holds the population
    median with probability ``coverage`` ≥ level whatever the distribution (independent
    draws assumed). With fewer than 6 values no 95 % interval exists: then k = 1 (the
    range) and ``coverage`` says what it is worth. Returns {median, lo, hi, n, coverage}.
    """
    from math import comb

    xs = sorted(float(v) for v in values)
    n = len(xs)
    if n == 0:
        raise ValueError("median_interval needs at least one value")
    alpha = (1.0 - level) / 2
    tail = lambda k: sum(comb(n, i) for i in range(k)) / 2**n   # P(Bin(n, 1/2) < k)
    k = 1
    while k + 1 <= (n + 1) // 2 and tail(k + 1) <= alpha:
        k += 1
    return {"median": statistics.median(xs), "lo": xs[k - 1], "hi": xs[n - k], "n": n,
            "coverage": 1.0 - 2 * tail(k)}


def paired_ratio(num: list, den: list, level: float = 0.95) -> dict:
    """:func:`median_interval` of the round-by-round ratios num[i] / den[i].

    ``num`` and ``den`` are the ``times_s`` lists of two candidates from one
    :func:`time_interleaved` call, so entry i of each was measured in the same round.
    """
    if len(num) != len(den) or not num:
        raise ValueError(f"expected two equally long, non-empty lists of times, got {len(num)} and {len(den)}")
    return median_interval([a / b for a, b in zip(num, den)], level)


def pooled_paired_ratio(headlines: list, candidate: str, table: str = "forward_backward",
                        other: str = "llama_mlp", level: float = 0.95) -> dict:
    """:func:`median_interval` of the round-by-round ratios candidate / other pooled over
    several headline results (e.g. the same command run in separate processes).

    ``table`` is "forward" or "forward_backward". Pooling treats every round as independent;
    a shift between processes widens the truth beyond the interval.
    """
    ratios = []
    for hl in headlines:
        t = hl[table]
        ratios += [a / b for a, b in zip(t[candidate]["times_s"], t[other]["times_s"])]
    return median_interval(ratios, level)


def aa_spread(headlines: list, key: str = "fwd_bwd_vs_llama", control: str = "llama_mlp_copy") -> tuple:
    """(lo, hi): the union of the A/A control's paired 95 % intervals for ``key`` over
    several headline results, widened to contain 1. Two identical workloads drift this
    far apart on the machine, so a smaller effect is no evidence."""
    if not headlines:
        raise ValueError("aa_spread needs at least one headline result")
    ps = [h["paired_ratios"][control][key] for h in headlines]
    return (min(1.0, *(p["lo"] for p in ps)), max(1.0, *(p["hi"] for p in ps)))


def control_verdict(p: dict, spread: tuple) -> str:
    """'faster' if the interval [p['lo'], p['hi']] of a ratio to the Llama MLP lies wholly
    below the A/A ``spread``, 'slower' if wholly above, else 'parity'."""
    lo, hi = spread
    if lo > hi or p["lo"] > p["hi"]:
        raise ValueError(f"expected ordered intervals, got {p['lo']}, {p['hi']} and {spread}")
    return "faster" if p["hi"] < lo else ("slower" if p["lo"] > hi else "parity")


#: The headline targets: (ratio key, goal), a ratio at most the goal meets it.
TARGETS = {"fwd_vs_floor": 1.10, "fwd_vs_llama": 1.0, "fwd_bwd_vs_llama": 1.0, "saved_bytes_vs_llama": 0.75}


def verdict(lo: float, hi: float, goal: float) -> str:
    """'met' if the whole interval [lo, hi] is at most ``goal``, 'not met' if all of it
    is above, else 'parity' (the measurement cannot tell the ratio from the goal)."""
    if lo > hi:
        raise ValueError(f"expected lo <= hi, got {lo} > {hi}")
    return "met" if hi <= goal else ("not met" if lo > goal else "parity")
