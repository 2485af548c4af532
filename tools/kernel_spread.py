"""How far the numerics references move with the CPU's kernel set, and with a real change.

torch picks vectorised kernels by the CPU (``torch.backends.cpu.get_cpu_capability()``:
AVX512, AVX2 or DEFAULT; ``ATEN_CPU_CAPABILITY`` lowers it). They round differently, so a
training run is bit-equal only on the same kernel set and thread count. This tool reruns the
two references the code-version guards compare against (tests/retrain_reference.json and
tests/data/run_reference.json) under each kernel set this CPU offers, in fresh processes, and
prints the largest relative difference of any stored number: between kernel sets, and
against the stored files (written on another machine). Then it applies deliberate small
changes of the numerics and prints how far they move the same numbers. The guards'
tolerance (``REL_TOL`` in tests/numerics_tolerance.py) must lie between the two::

    python tools/kernel_spread.py
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent / "tests"          # run_reference, test_retrain, numerics_tolerance live there
sys.path.insert(0, str(TESTS))


def flat(x, path=""):
    if isinstance(x, dict):
        for k in x:
            yield from flat(x[k], f"{path}.{k}")
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from flat(v, f"{path}[{i}]")
    else:
        yield path, x


def largest_rel_diff(a, b) -> tuple[float, str]:
    """(largest |a − b| / |b| over the floats, where); inf where anything else differs."""
    fa, fb = dict(flat(a)), dict(flat(b))
    if set(fa) != set(fb):
        return math.inf, "different fields"
    worst = (0.0, "")
    for k, x in fa.items():
        y = fb[k]
        if isinstance(x, float) or isinstance(y, float):
            r = abs(x - y) / max(abs(y), 1e-12) if x is not None and y is not None else (0.0 if x is y else math.inf)
        else:
            r = 0.0 if x == y else math.inf
        if r > worst[0]:
            worst = (r, k)
    return worst


def references() -> dict:
    """Both references computed in this process, one thread."""
    import torch

    torch.set_num_threads(1)
    import run_reference
    import test_retrain

    return {"capability": torch.backends.cpu.get_cpu_capability(), "retrain": test_retrain.reference_runs(),
            "runs": [run_reference.run_case(*c) for c in run_reference.cases()]}


def in_subprocess(capability: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "ref.json"
        code = (f"import json, sys; sys.path[:0] = [{str(HERE)!r}, {str(TESTS)!r}]; import kernel_spread as k; "
                f"json.dump(k.references(), open({str(out)!r}, 'w'))")
        env = {**os.environ, "ATEN_CPU_CAPABILITY": capability}
        subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=1800)
        return json.loads(out.read_text())


def main() -> None:
    stored = {"retrain": json.loads((TESTS / "retrain_reference.json").read_text())["runs"],
              "runs": json.loads((TESTS / "data" / "run_reference.json").read_text())["runs"]}
    got = {}
    for cap in ("avx512", "avx2", "default"):
        r = in_subprocess(cap)
        if r["capability"].lower() != cap:     # the CPU lacks it: torch fell back
            print(f"{cap}: not offered by this CPU (torch used {r['capability']})")
            continue
        got[cap] = r
    for name in ("retrain", "runs"):
        caps = list(got)
        for i, a in enumerate(caps):
            print(f"{name}: stored vs {a}: {largest_rel_diff(got[a][name], stored[name])}")
            for b in caps[i + 1:]:
                print(f"{name}: {a} vs {b}: {largest_rel_diff(got[a][name], got[b][name])}")
    from numerics_tolerance import perturbed_retrain_runs

    base = references()["retrain"]
    for change in ("adamw_eps", "warmup", "loss_order"):
        print(f"retrain, {change}: {largest_rel_diff(perturbed_retrain_runs(change), base)}")


if __name__ == "__main__":
    main()
