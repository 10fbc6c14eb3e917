"""``python -m shardfeed_benchmarks``: the delivered-into-Python benchmark."""

import sys

from .delivered import main

sys.exit(main())
