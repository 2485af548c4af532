"""``python -m qkmlp.bench``: see :func:`qkmlp.bench.main`."""
from . import main

main()
