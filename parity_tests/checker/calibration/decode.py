"""The calibration of the decode specs alone: ``python -m parity_tests.checker.calibration.decode
SEEDS [--dtype NAME ...]`` (opt-in, never part of pytest; ``nice -n 10`` on a shared machine).

``checker.calibration.calibrate`` restricted to the "flash_kvcache" and "flash_mla" specs: their
built-in correct targets (``targets.decode_targets``) over SEEDS seeds of their batteries, every
row of which must pass, and the weakest flag of every decode pitfall (``pitfalls_decode``) per
dtype, which must stay above 1 on every seed. It prints the Markdown tables recorded in
docs/decoding.md and exits 0 when both hold, else 1. ``python -m parity_tests --calibrate``
covers these specs too, beside every other.

Tests: tests/checker/calibration/test_decode.py
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import torch

from ...progress import Progress
from ..battery.decode.case import DECODE_SPECS
from ..golden import DTYPES
from .calibrate import calibrate

DEFAULT_DTYPES = ("float64", "float32", "float16", "bfloat16")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m parity_tests.checker.calibration.decode",
        description="Calibrate the decode specs' tolerance policy over seeds.",
    )
    parser.add_argument("seeds", type=int, help="how many seeds, from 0")
    parser.add_argument("--dtype", action="append", choices=sorted(DTYPES))
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error(f"seeds must be >= 1, got {args.seeds}")
    dtypes = tuple(args.dtype or DEFAULT_DTYPES)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: threads only contend, on a shared machine most
    try:
        progress = Progress(sys.stderr)
        return calibrate(
            args.seeds, args.device, dtypes, "default", progress, print, specs=DECODE_SPECS
        )
    finally:
        torch.set_num_threads(threads)


if __name__ == "__main__":
    sys.exit(main())
