"""The kernel checker: a user's attention kernel judged case by case against the float64 NumPy
golden (docs/kernel-verification.md).

One idea per module, each importing only those above it in this list:
``battery`` (the cases and their inputs), ``reference`` (the plain same-dtype baseline),
``report`` (rows, verdicts, coverage), ``judge`` (the tolerance policy on one tensor),
``kernels`` (``check_kernel``: running the kernel, refusing what no correct kernel does),
``pitfalls`` (broken kernels that prove the checker has teeth), ``targets`` (the built-in kernels
and their documented failures), ``calibration`` (the measurement behind the tolerance policy),
``render`` (tables and JSON for the CLI).

Tests: tests/checker/ (one test file per module)
"""
