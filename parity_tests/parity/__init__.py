"""The parity suite: every layer of numpy_attention against its torch twin, output and every
gradient by name, on the tolerance policy of ``parity_tests.tolerances``.

``cases`` is the one registry of cases (each layer with each set of options that changes its
math), ``run`` runs a case on both sides and compares them, and ``report`` is the layer part of
``python -m parity_tests``: the registry run on each device and its tables. pytest
(tests/parity/test_run.py) and the CLI run the same cases.

Tests: tests/parity/
"""
