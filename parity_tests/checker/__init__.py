"""The kernel checker: a user's attention kernel judged case by case against the float64 NumPy
golden (docs/kernel-verification.md).

Tests: tests/checker/
"""
