"""``python -m qkmlp.book static-query|product --out FILE``: rerun chapter 2's or
chapter 3's stored study and write it as JSON with its provenance
(:func:`~qkmlp.book.ch02_dynamic_query.static_query_study`,
:func:`~qkmlp.book.ch03_bilinear_attention.product_study`). The provenance comes from
:mod:`qkmlp.runbase.provenance`, as every pipeline's does: the git commit and whether the
checkout had uncommitted changes, the versions, the machine (CPU model and capability,
threads), the date and the wall time.

``python -m qkmlp.book schematic --out DIR [--panels symmetric gated]`` draws panels of the
book's schematic (:mod:`qkmlp.book.schematic`) as ``DIR/schematic-<panel>.svg``: the
pictures the README and the introduction show, committed under ``book/_static``."""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time

import torch

from ..runbase.provenance import IMPORT_GIT, machine, versions
from .ch02_dynamic_query import static_query_study
from .ch03_bilinear_attention import product_study
from .schematic import PANELS, write_schematic


def main(argv=None) -> None:
    """Parse ``argv`` (default ``sys.argv[1:]``), run the study, write ``--out``."""
    parser = argparse.ArgumentParser(prog="python -m qkmlp.book")
    parser.add_argument("study", choices=["static-query", "product", "schematic"])
    parser.add_argument("--out", required=True,
                        help="the JSON file to write; for schematic, the folder for its SVG files")
    parser.add_argument("--panels", nargs="+", default=["symmetric", "gated"], choices=list(PANELS),
                        help="schematic only: the panels to draw")
    parser.add_argument("--seeds", type=int, default=20, help="static-query only")
    parser.add_argument("--steps", type=int, default=3000, help="static-query only")
    args = parser.parse_args(argv)
    if args.study == "schematic":
        for path in write_schematic(args.out, args.panels):
            print(path)
        return
    torch.set_num_threads(1)
    start = time.perf_counter()
    if args.study == "static-query":
        data = static_query_study(range(args.seeds), args.steps)
    else:
        data = product_study()
    data["provenance"] = {
        "command": "python -m qkmlp.book " + " ".join(argv if argv is not None else sys.argv[1:]),
        **IMPORT_GIT,                       # the code this process imported: commit, uncommitted changes
        "versions": versions(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": machine(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "seconds": round(time.perf_counter() - start, 1),
    }
    with open(args.out, "w") as fh:
        json.dump(data, fh, indent=1)
        fh.write("\n")


if __name__ == "__main__":
    main()
