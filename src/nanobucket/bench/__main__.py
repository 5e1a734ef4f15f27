"""``python -m nanobucket.bench``: the same as ``python -m nanobucket bench``."""

import sys

from . import main

# Guarded so that importing this module (as the import test does) does not run the benchmark.
if __name__ == "__main__":
    sys.exit(main())
