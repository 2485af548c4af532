"""Rerun one stored run of chapter 8 under torch's kernel sets and store what each gives.

    python tools/rerun_across_kernels.py book/data/experiments/reruns/lm_compute_1500_gated_s20.json

Each kernel set runs in its own process (``ATEN_CPU_CAPABILITY`` is read when torch loads):
the native one, then ``default``. Chapter 8 reads the file and states the differences.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GRID, FAMILY, SEED = "book/data/experiments/lm_compute_1500.json", "gated1-silu", 20
ONE = f"""
import json, torch
torch.set_num_threads(1)
from qkmlp.experiments import load_results, rerun
from qkmlp.runbase.provenance import machine
r = rerun(load_results({str(ROOT / GRID)!r}), [{{"family": {FAMILY!r}}}], seeds=[{SEED}])[0]
print(json.dumps({{"live": r["live"], "stored": r["stored"], "machine": machine()}}))
"""


def main(out: str) -> None:
    rows = {}
    for caps in ("native", "default"):
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        env.pop("ATEN_CPU_CAPABILITY", None)
        if caps != "native":
            env["ATEN_CPU_CAPABILITY"] = caps
        res = subprocess.run([sys.executable, "-c", ONE], env=env, capture_output=True, text=True, check=True)
        rows[caps] = json.loads(res.stdout.strip().splitlines()[-1])
    rec = {"grid": GRID, "family": FAMILY, "seed": SEED, "metric": "test_loss",
           "command": "python tools/rerun_across_kernels.py " + out, "kernels": rows}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(rec, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
