"""The measurement behind the tolerance policy, over many seeds of every spec's battery
(``calibrate``: ``python -m parity_tests --calibrate SEEDS [--spec ...]``; ``decode``: the
decode specs' command of before, ``python -m parity_tests.checker.calibration.decode SEEDS``).

Tests: tests/checker/calibration/
"""
