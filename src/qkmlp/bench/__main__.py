"""``python -m qkmlp.bench``: the command line of :func:`qkmlp.bench.cli.main`."""
from .cli import main

main()
