"""``python -m nanobucket.bench``: the same as ``python -m nanobucket bench``."""

import sys

from . import main

sys.exit(main())
