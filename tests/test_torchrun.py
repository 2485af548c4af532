"""torchrun scale-out: 2 processes (gloo, CPU) shard a quick grid; rank 0 writes one file whose
runs equal a single process's, and each run says which rank computed it."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from qkmlp.experiments import strip_provenance


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_gloo_ranks_equal_one_process(tmp_path):
    common = ["--task", "teacher", "--quick", "--no-progress"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    one = subprocess.run([sys.executable, "-m", "qkmlp.experiments", *common, "--out", str(tmp_path / "one")],
                         capture_output=True, text=True, timeout=600, env=env)
    assert one.returncode == 0, one.stderr[-2000:]
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                          "--master_addr", "127.0.0.1", "--master_port", str(_free_port()),
                          "-m", "qkmlp.experiments", *common, "--out", str(tmp_path / "two")],
                         capture_output=True, text=True, timeout=600, env=env)
    assert two.returncode == 0, two.stderr[-3000:]
    a = json.loads((tmp_path / "one" / "teacher_quick.json").read_text())
    b = json.loads((tmp_path / "two" / "teacher_quick.json").read_text())
    assert b["meta"]["world_size"] == 2 and a["meta"]["world_size"] == 1
    assert [strip_provenance(r) for r in b["runs"]] == [strip_provenance(r) for r in a["runs"]]
    assert [strip_provenance(r) for r in b["tune_runs"]] == [strip_provenance(r) for r in a["tune_runs"]]
    assert b["tuning"] == a["tuning"]
    # the sharding is visible: job i ran on rank i mod 2, and every run names its host
    ranks = [r["rank"] for r in b["tune_runs"] + b["runs"]]
    assert set(ranks) == {0, 1} and all(r["host"] for r in b["runs"])
    assert [r["rank"] for r in b["tune_runs"]] == [i % 2 for i in range(len(b["tune_runs"]))]
    assert not (tmp_path / "two" / "teacher_quick.json.tmp").exists()


def test_part_and_torchrun_are_exclusive(monkeypatch, capsys):
    from qkmlp.experiments.__main__ import main
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    with pytest.raises(SystemExit):
        main(["--task", "digits", "--quick", "--part", "1/2", "--cache", "x"])
    assert "use one" in capsys.readouterr().err
