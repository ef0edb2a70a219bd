"""``python -m parity_tests`` and the ``parity-tests`` console script: see ``parity_tests.cli``.

Tests: tests/parity/test_cli.py
"""

import os
import sys

from .cli import main as _cli_main


def main() -> int:
    """The ``parity-tests`` console script. As ``python -m`` does, it puts the current directory
    first on ``sys.path``, so that ``--kernel mymodule:attention`` finds ./mymodule.py; its
    messages name it ``parity-tests``."""
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    return _cli_main(prog="parity-tests")


if __name__ == "__main__":
    sys.exit(_cli_main())
