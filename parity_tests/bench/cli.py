"""The command line of ``python -m parity_tests.bench``: the NumPy attention against torch on this
machine's CPU (never a timed test).

    python -m parity_tests.bench --help
    python -m parity_tests.bench                     # the whole benchmark, report on stdout
    python -m parity_tests.bench --only gpt2         # one part of it
    python -m parity_tests.bench --only shapes --shape 1,12,512,64 --repeats 1
    python -m parity_tests.bench --write-docs        # the whole benchmark, recorded in docs/

The parts (``--only``), each in its own module of this package: ``shapes``, the attention alone
at each shape (``attention.py``); ``crossover``, ``blocks`` and ``profile``, the tiled path's
dense/tiled crossover, block sizes and products alone against the whole (``tuning.py``);
``gpt2``, the GPT-2 layer (``gpt2.py``); ``options`` and ``window``, the cost of today's options
on the tiled path (``options.py``); ``decode``, a Llama-8B-shaped layer's decode step and prefill
(``decode.py``); ``latent``, a DeepSeek-V2-Lite-shaped MLA layer's decode step (``latent.py``);
``sparse``, sparse attention by indices against dense attention at growing lengths (``sparse.py``);
``linear``, the gated delta rule's chunk and recurrent forms at growing lengths and a
GatedDeltaNet layer's decode step after growing contexts (``linear.py``).
The issues' targets are reported where the parts they need ran (``report.py``).

The report goes to stdout. Only ``--write-docs`` (with the whole benchmark) rewrites the
generated block of docs/benchmarks.md and, when matplotlib is installed (the ``plot`` extra),
docs/benchmarks.png. How times and memory are measured: ``measure.py``.

Tests: tests/bench/test_cli.py.
"""

from __future__ import annotations

import argparse

from . import attention, gpt2, measure, report, tuning
from . import decode as decode_bench
from . import latent as latent_bench
from . import linear as linear_bench
from . import options as options_bench
from . import sparse as sparse_bench

PARTS = (
    "shapes",
    "crossover",
    "blocks",
    "profile",
    "gpt2",
    "options",
    "window",
    "decode",
    "latent",
    "sparse",
    "linear",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m parity_tests.bench",
        description="Time the NumPy attention (dense and tiled) against torch on this CPU. "
        "The report goes to stdout; nothing is written unless --write-docs is given. "
        "The whole benchmark takes several minutes.",
    )
    parser.add_argument(
        "--repeats",
        type=_positive_int,
        default=3,
        metavar="N",
        help="time each run as the best of N after one warm-up (default 3; shapes with "
        "N >= 16384 run once)",
    )
    parser.add_argument(
        "--only",
        choices=PARTS,
        action="append",
        metavar="PART",
        help=f"run only this part (repeatable): {', '.join(PARTS)}",
    )
    parser.add_argument(
        "--shape",
        type=_shape,
        action="append",
        metavar="B,H,N,D",
        help="time this shape in the shapes part instead of the default ones (repeatable)",
    )
    parser.add_argument(
        "--write-docs",
        action="store_true",
        help="also rewrite the generated block of docs/benchmarks.md and docs/benchmarks.png; "
        "only with the whole benchmark (no --only, no --shape)",
    )
    return parser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _shape(text: str) -> tuple[int, int, int, int]:
    parts = text.split(",")
    if len(parts) != 4:
        raise argparse.ArgumentTypeError(f"a shape is B,H,N,D (four integers), got {text!r}")
    b, h, n, d = (_positive_int(part) for part in parts)
    return b, h, n, d


def main(argv: list[str] | None = None) -> int:
    """Run the chosen parts, print the report; with ``--write-docs``, record it in docs/."""
    cli = build_parser()
    args = cli.parse_args(argv)
    if args.write_docs and (args.only or args.shape):
        cli.error("--write-docs records the whole benchmark: drop --only and --shape")
    parts = [part for part in PARTS if part in (args.only or PARTS)]
    if args.shape and "shapes" not in parts:
        cli.error("--shape sets the shapes of the shapes part, which --only leaves out")
    repeats = args.repeats

    rate = measure.matmul_rate(repeats)
    rows = None
    if "shapes" in parts:
        rows = {
            shape: attention.bench_shape(shape, repeats) for shape in args.shape or attention.SHAPES
        }
    cross = tuning.crossover() if "crossover" in parts else None
    sweep = tuning.block_sweep(repeats) if "blocks" in parts else None
    floor = None
    if "profile" in parts:
        floor = tuning.tile_products_floor(
            tuning.PROFILE, repeats, (rows or {}).get(tuning.PROFILE)
        )
    layer = gpt2.gpt2_layer(repeats) if "gpt2" in parts else None
    options_rows = (
        options_bench.option_rows(measure.best_time, repeats) if "options" in parts else None
    )
    window = options_bench.window_rows(measure.best_time) if "window" in parts else None
    decode = decode_bench.decode_rows(repeats, measure.traced_peak) if "decode" in parts else None
    latent = latent_bench.latent_rows(repeats, measure.traced_peak) if "latent" in parts else None
    sparse = sparse_bench.sparse_rows(repeats) if "sparse" in parts else None
    linear = linear_bench.linear_rows(repeats) if "linear" in parts else None
    text = report.report(
        rate,
        repeats,
        rows,
        sweep,
        cross,
        floor,
        layer,
        options_rows,
        window,
        decode,
        latent,
        sparse,
        linear,
    )
    print(text)
    if args.write_docs:
        report.write_doc(text)
        path = report.plot(rows or {})
        plotted = f" and {path}" if path else " (no plot: matplotlib not installed)"
        print(f"\nwrote {report.DOC}{plotted}")
    return 0
