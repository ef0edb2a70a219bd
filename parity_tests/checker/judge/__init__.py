"""The verdict: the tolerance policy on one tensor (``policy``), and each family's verdict on one
call, every tensor it returns judged against its golden (``attention``, ``decode``).

Tests: tests/checker/judge/
"""
