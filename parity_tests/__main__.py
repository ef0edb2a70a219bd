"""``python -m parity_tests``: see ``parity_tests.cli``."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
