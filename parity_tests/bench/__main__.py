"""``python -m parity_tests.bench``: see ``parity_tests.bench.cli``.

Tests: tests/bench/test_cli.py, tests/parity/test_cli.py (without torch)
"""

import sys

if __name__ == "__main__":  # one line and exit 2, not a traceback, where torch is missing
    from parity_tests.cli import exit_without_torch

    exit_without_torch("python -m parity_tests.bench")

    from .cli import main

    sys.exit(main())
