"""qkmlp.bench: configuration, provenance and storage (no timing is asserted)."""
from __future__ import annotations

import json
import math
import os

import pytest
import torch

from conftest import FUSED
from qkmlp import bench


def test_cuda_headline_is_llama_7b_in_bfloat16_and_refuses_without_a_gpu():
    hs = bench.headline_sizes("cuda")
    assert (hs["d"], hs["m"], hs["dtype"]) == (4096, 11008, torch.bfloat16)
    assert 2048 in hs["ns"] and 1 in hs["ns"]
    assert bench.headline_sizes("cpu")["dtype"] == torch.float32
    with pytest.raises(ValueError, match="cpu or cuda"):
        bench.headline_sizes("mps")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="cuda.is_available"):
            bench.run(("headline",), device="cuda", sizes={"d": 8, "m": 16, "ns": (4,)}, reps=1)


def test_allocator_settings_are_recorded():
    info = bench.set_allocator("tuned")
    try:
        rec = bench.machine_info()["allocator"]
        assert rec["malloc"]["mode"] == "tuned"
        assert rec["malloc"]["applied"] == info["applied"]
        assert rec["torch_threads"] == torch.get_num_threads()
        assert rec["affinity"] is None or len(rec["affinity"]) >= 1
    finally:
        bench.set_allocator("default")
    with pytest.raises(ValueError, match="tuned"):
        bench.set_allocator("fast")


def test_store_path_never_overwrites(tmp_path):
    p1 = bench.store_path(str(tmp_path), "cpu_float32")
    open(p1, "w").close()
    p2 = bench.store_path(str(tmp_path), "cpu_float32")
    assert p1 != p2 and not os.path.exists(p2)


def test_json_refuses_to_overwrite(tmp_path, capsys):
    out = tmp_path / "r.json"
    out.write_text("{}")
    with pytest.raises(SystemExit):
        bench.main(["--tiny", "--suite", "size", "--json", str(out)])
    assert out.read_text() == "{}"


def test_tiny_headline_records_op_counts_and_allocator(tmp_path):
    res = bench.main(["--tiny", "--suite", "headline", "--dtype", "bfloat16", "--store", str(tmp_path)])
    files = list(tmp_path.glob("cpu_bfloat16_*.json"))
    assert len(files) == 1
    stored = json.loads(files[0].read_text())
    assert stored["machine"]["allocator"]["malloc"]["mode"] == "tuned"
    hl = stored["suites"]["headline"][0]
    assert hl["config"]["dtype"] == "bfloat16"
    oc = hl["op_counts"]
    assert oc["gated_mlp"]["forward"]["conversions"] == 0
    assert (oc["gated_mlp"]["forward_activations"]["elementwise"]
            <= oc["llama_mlp"]["forward_activations"]["elementwise"])
    assert oc["gated_mlp"]["forward_backward"]["conversions"] == 0
    assert res["suites"]["headline"][0]["paired_ratios"]["llama_mlp_copy"]["fwd_vs_llama"]["n"] == 3
    bench.set_allocator("default")


def test_stack_peak_grows_with_depth_and_reads_back():
    recs = [bench.stack_step_peak("llama_mlp", b, d=16, m=40, n=8) for b in (1, 2)]
    for r in recs:
        assert r["after"] >= r["before"] > 0 and r["step"] == r["after"] - r["before"]
    st = {"config": {"dtypes": ["float32"], "blocks": [1]},
          "records": [{"kind": "llama_mlp", "blocks": 1, "dtype": "float32", "step": 4 * 2**20},
                      {"kind": "gated_mlp", "blocks": 1, "dtype": "float32", "step": 3 * 2**20}]}
    (row,) = bench.stack_ratios(st)
    assert row["ratio"] == 0.75 and row["llama_mib"] == 4.0
    with pytest.raises(ValueError, match="kind"):
        bench.stack_step_peak("nope", 1, d=4, m=8, n=2)


def test_verdicts_need_the_interval_outside_the_aa_spread():
    def hl(lo, hi):
        return {"paired_ratios": {"llama_mlp_copy": {"fwd_vs_llama": {"lo": lo, "hi": hi}}}}

    spread = bench.aa_spread([hl(0.98, 1.03), hl(0.99, 1.05)], "fwd_vs_llama")
    assert spread == (0.98, 1.05)
    assert bench.aa_spread([hl(1.01, 1.02)], "fwd_vs_llama") == (1.0, 1.02)   # contains 1
    assert bench.control_verdict({"lo": 0.90, "hi": 0.97}, spread) == "faster"
    assert bench.control_verdict({"lo": 0.90, "hi": 0.99}, spread) == "parity"
    assert bench.control_verdict({"lo": 1.06, "hi": 1.10}, spread) == "slower"
    with pytest.raises(ValueError):
        bench.control_verdict({"lo": 1.0, "hi": 0.9}, spread)
    with pytest.raises(ValueError):
        bench.aa_spread([], "fwd_vs_llama")


def test_gemm_flops_match_costs_and_a_hand_count():
    from qkmlp import costs

    n, d, m = 7, 12, 20
    for cls in FUSED:                                   # the layers the bench times
        layer = cls(d, m, device="meta")
        # costs counts the elementwise middle too (2m per token at rank 1)
        assert bench.gemm_flops(n, d, m) == n * (costs.flops_per_token(layer) - 2 * m)
    # backward: dH = dY·Vᵀ, dV = Hᵀ·dY, dQ, dK, and dX from both halves
    hand_bwd = 2 * (n * d * m + m * n * d + 2 * m * n * d + 2 * n * m * d)
    assert bench.gemm_flops(n, d, m, backward=True) == bench.gemm_flops(n, d, m) + hand_bwd
    assert bench.forward_bytes("floor_gemms", 1, 1, 1, 4) == 4 * 9
    assert bench.forward_bytes("gated_mlp", 1, 1, 1, 2) == 2 * 12
    with pytest.raises(ValueError, match="kind"):
        bench.forward_bytes("dense", 1, 1, 1)
    with pytest.raises(ValueError, match="positive"):
        bench.gemm_flops(0, d, m)


def test_tiny_roofline_structure(tmp_path):
    res = bench.main(["--tiny", "--suite", "roofline", "--store", str(tmp_path),
                      "--tag", "roof"])
    bench.set_allocator("default")
    (f,) = tmp_path.glob("roof_*.json")
    ro = json.loads(f.read_text())["suites"]["roofline"]
    assert ro == json.loads(json.dumps(res["suites"]["roofline"]))
    assert set(ro["peak"]) == {"1", "2"}
    for pk in ro["peak"].values():
        assert pk["gemm_gflops"] > 0 and pk["add_gbps"] > 0 and pk["copy_gbps"] > 0
    for run in ro["peak_runs"]:
        for th, pk in run.items():
            t = pk["median_s"]["mm"]
            assert pk["gemm_gflops"] == pytest.approx(2 * pk["size"] ** 3 / t / 1e9)
            assert ro["peak"][th]["gemm_gflops"] >= pk["gemm_gflops"]
            assert ro["peak"][th]["add_gbps"] >= pk["add_gbps"]
    c = ro["config"]
    per_thread = len(c["ns"]) + len(c["ms"]) - 1       # the headline point is shared
    assert len(ro["points"]) == 2 * per_thread
    for p in ro["points"]:
        assert set(p["median_s"]["forward"]) == set(bench.ROOFLINE_KINDS)
        for phase, f_ in p["flops"].items():
            for k, s in p["median_s"][phase].items():
                assert len(p["times_s"][phase][k]) == p["reps"]
                assert p["gflops"][phase][k] == pytest.approx(f_ / s / 1e9)
            share = p["elementwise_share"][phase]["gated_mlp"]
            med = p["median_s"][phase]
            assert share == pytest.approx(1 - med["floor_gemms"] / med["gated_mlp"])
        assert p["intensity"]["gated_mlp"] < p["intensity"]["floor_gemms"]
    assert len(bench.roofline_rows(ro, threads=1, m=c["m"])) == len(c["ns"])
    with pytest.raises(ValueError, match="headline"):
        bench.bench_roofline(8, 16, 4, ns=(8,), ms=(16,))


def test_silu_mul_is_the_plain_formula_and_saves_a_and_b():
    torch.manual_seed(0)
    a, b = (torch.randn(5, 7, dtype=torch.float64, requires_grad=True) for _ in range(2))
    torch.testing.assert_close(bench.SiLUMul.apply(a, b), torch.nn.functional.silu(a) * b)
    assert torch.autograd.gradcheck(bench.SiLUMul.apply, (a, b))
    assert torch.autograd.gradgradcheck(bench.SiLUMul.apply, (a, b))
    llama = bench.LlamaMLP(6, 10)
    x = torch.randn(4, 6, requires_grad=True)
    f = bench.liger_style_mlp(llama)
    gy = torch.randn(4, 6)
    y, want = f(x), llama(x)
    torch.testing.assert_close(y, want)
    for g, w in zip(torch.autograd.grad(y, [x, *llama.parameters()], gy),
                    torch.autograd.grad(want, [x, *llama.parameters()], gy)):
        torch.testing.assert_close(g, w)
    params = list(llama.parameters())
    assert bench.saved_bytes(lambda: f(x), params) == 4 * 4 * (6 + 3 * 10)
    assert bench.saved_bytes(lambda: llama(x), params) == 4 * 4 * (6 + 4 * 10)


def _fake_headline(meds):
    """A headline result holding only paired ratios: meds[cand] = (fwd, fwd+bwd)."""
    pr = {}
    for k, (f, fb) in meds.items():
        pr[k] = {"fwd_vs_llama": {"median": f, "lo": f - 0.01, "hi": f + 0.02},
                 "fwd_bwd_vs_llama": {"median": fb, "lo": fb - 0.03, "hi": fb + 0.01}}
    return {"paired_ratios": pr}


def test_ratio_panels_draw_every_run_interval_and_the_aa_spread():
    hls = [_fake_headline({"gated_mlp": (0.99, 1.02), "symmetric_mlp": (1.0, 1.01),
                           "llama_mlp_copy": (1.0, 0.98)}),
           _fake_headline({"gated_mlp": (0.97, 1.05), "symmetric_mlp": (1.01, 1.0),
                           "llama_mlp_copy": (1.01, 1.02)})]
    from qkmlp.book.ch10_cost import RATIO_CANDIDATES, ratio_panels

    figs = ratio_panels(hls)
    assert len(figs) == 2
    for fig, key in zip(figs, ("fwd_vs_llama", "fwd_bwd_vs_llama")):
        ax = fig.axes[0]
        lo, hi = bench.aa_spread(hls, key)
        span = [p for p in ax.patches if p.get_label() == "A/A spread"]
        assert len(span) == 1
        r = span[0]       # a Rectangle (matplotlib >= 3.9) or a Polygon
        ys = ([r.get_y(), r.get_y() + r.get_height()] if hasattr(r, "get_height")
              else [v[1] for v in r.get_xy()])
        assert min(ys) == pytest.approx(lo) and max(ys) == pytest.approx(hi)
        bars = {c.get_label(): c for c in ax.containers}
        for k, _, _, lab in RATIO_CANDIDATES:
            got = list(bars[lab].lines[0].get_ydata())
            assert got == [h["paired_ratios"][k][key]["median"] for h in hls]
    import matplotlib.pyplot as plt
    for f in figs:
        plt.close(f)
    with pytest.raises(ValueError, match="at least one"):
        ratio_panels([])


_PROFILE_SCRIPT = r"""
import os, sys, torch
from qkmlp.bench import op_counts
from torch.profiler import ProfilerActivity, profile
x = torch.randn(8, 8)
if sys.argv[1] == "raw":
    with profile(activities=[ProfilerActivity.CPU]):
        x @ x
else:
    def fn():
        os.write(2, b"a line of our own on fd 2\n")
        return x @ x
    counts = op_counts(fn)
    assert counts["ops"]["aten::mm"] == 1, counts
"""


@pytest.mark.parametrize("mode", ["raw", "op_counts"])
def test_op_counts_drops_kinetos_usdt_lines_and_keeps_the_rest(mode):
    """libkineto prints 'USDT: <date> <pid> SyncActivityProfilerHandler.cpp:..] profiler_start'
    (and _stop) on stderr at every profile; op_counts drops exactly those lines and
    forwards everything else written to file descriptor 2 meanwhile."""
    import subprocess
    import sys

    env = dict(os.environ)
    env.pop("KINETO_LOG_LEVEL", None)
    proc = subprocess.run([sys.executable, "-c", _PROFILE_SCRIPT, mode], capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    usdt = [ln for ln in proc.stderr.splitlines() if ln.startswith("USDT:")]
    if mode == "raw":
        if not usdt:
            pytest.skip("this torch build's profiler prints no USDT lines: nothing to drop")
        assert any("profiler_start" in ln for ln in usdt)
    else:
        assert usdt == [], proc.stderr
        assert "a line of our own on fd 2" in proc.stderr


# --- the command and its statistics (moved from the fast-path tests) ----------------------

def test_bench_runs_tiny_and_writes_json(tmp_path, capsys):
    from qkmlp import bench

    path = tmp_path / "b.json"
    res = bench.main(["--tiny", "--suite", "headline", "--suite", "rank", "--json", str(path)])
    out = capsys.readouterr().out
    assert "floor_gemms" in out and "llama_mlp" in out and "torch" in out
    stored = json.loads(path.read_text())
    assert stored["machine"]["torch"] == torch.__version__
    assert "library_uncommitted_changes" in stored["machine"]
    assert stored["command"].startswith("python -m qkmlp.bench")
    hl = stored["suites"]["headline"][0]
    assert set(hl["ratios"]) == {"gated_mlp", "symmetric_mlp"}
    assert set(hl["paired_ratios"]) == {"gated_mlp", "symmetric_mlp", "llama_mlp_copy", "llama_mlp"}
    for k in ("gated_mlp", "symmetric_mlp"):
        assert set(hl["verdicts"][k]) == set(bench.TARGETS)
        assert hl["verdicts"][k]["saved_bytes_vs_llama"] == "met"
        p = hl["paired_ratios"][k]["fwd_bwd_vs_llama"]
        assert p["lo"] <= p["median"] <= p["hi"] and p["n"] == hl["config"]["reps_fwd_bwd"]
    assert "A/A control" in out
    assert hl["saved_bytes"]["gated_mlp"] < hl["saved_bytes"]["llama_mlp"]
    assert res["suites"]["rank"]["parameters"]["dense"] > 0


def test_bench_compiled_candidates(capsys):
    """--compile wraps every module candidate in torch.compile (aot_eager: no C++ needed)."""
    from qkmlp import bench

    res = bench.main(["--tiny", "--suite", "headline", "--compile", "aot_eager"])
    hl = res["suites"]["headline"][0]
    assert hl["config"]["compile_backend"] == "aot_eager"
    assert "torch.compile backend aot_eager" in capsys.readouterr().out
    assert set(hl["saved_bytes"]) == {"llama_mlp", "gated_mlp", "symmetric_mlp"}


def test_median_interval_covers_the_median_as_often_as_it_says():
    """Simulated coverage of the order-statistic interval, on a skewed distribution."""
    from qkmlp.bench import median_interval

    gen = torch.Generator().manual_seed(0)
    trials, n, true_median = 4000, 21, math.log(2.0)        # Exp(1) has median ln 2
    draws = torch.empty(trials, n).exponential_(1.0, generator=gen)
    hits, coverage = 0, None
    for row in draws.tolist():
        iv = median_interval(row)
        hits += iv["lo"] <= true_median <= iv["hi"]
        coverage = iv["coverage"]
        assert iv["lo"] <= iv["median"] <= iv["hi"] and iv["n"] == n
    assert coverage >= 0.95
    sd = math.sqrt(coverage * (1 - coverage) / trials)
    assert abs(hits / trials - coverage) < 4 * sd, (hits / trials, coverage)


def test_median_interval_small_samples_and_bad_input():
    from qkmlp.bench import median_interval

    iv = median_interval([3.0, 1.0, 2.0])           # too few values for 95 %: the range
    assert (iv["lo"], iv["median"], iv["hi"]) == (1.0, 2.0, 3.0) and iv["coverage"] == 0.75
    with pytest.raises(ValueError, match="at least one"):
        median_interval([])


def test_paired_ratio_pairs_by_round_and_verdicts():
    from qkmlp.bench import paired_ratio, verdict

    # round-by-round load swings cancel in the paired ratio but not between medians
    num, den = [2.0, 20.0, 4.0, 40.0, 6.0, 60.0], [1.0, 10.0, 2.0, 20.0, 3.0, 30.0]
    iv = paired_ratio(num, den)
    assert iv["lo"] == iv["median"] == iv["hi"] == 2.0
    with pytest.raises(ValueError, match="equally long"):
        paired_ratio([1.0], [1.0, 2.0])
    assert verdict(0.97, 0.99, 1.0) == "met"
    assert verdict(0.99, 1.01, 1.0) == "parity"
    assert verdict(1.01, 1.02, 1.0) == "not met"
    with pytest.raises(ValueError, match="lo <= hi"):
        verdict(1.0, 0.9, 1.0)


def test_pooled_paired_ratio_and_format_paired():
    from qkmlp.bench import format_paired, pooled_paired_ratio

    def headline(cand, other):
        return {"forward_backward": {"gated_mlp": {"times_s": cand}, "llama_mlp": {"times_s": other}}}

    runs = [headline([2.0, 4.0], [1.0, 2.0]), headline([3.0], [1.0])]
    iv = pooled_paired_ratio(runs, "gated_mlp")
    assert (iv["median"], iv["n"], iv["lo"], iv["hi"]) == (2.0, 3, 2.0, 3.0)
    hl = {"paired_ratios": {"gated_mlp": {"fwd_vs_llama": {"median": 0.98, "lo": 0.97, "hi": 0.99},
                                          "fwd_vs_floor": {"median": 1.02, "lo": 1.01, "hi": 1.03}},
                            "llama_mlp": {"fwd_vs_floor": {"median": 1.0, "lo": 0.9, "hi": 1.1}}},
          "verdicts": {"gated_mlp": {"fwd_vs_llama": "met"}}}
    assert format_paired(hl, ["gated_mlp"], ["fwd_vs_llama"]) == ["  gated_mlp: fwd_vs_llama 0.980 [0.970, 0.990] met"]
    assert len(format_paired(hl)) == 2
