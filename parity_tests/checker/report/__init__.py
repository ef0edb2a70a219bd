"""What the checker returns and prints: rows, verdicts, group statuses and coverage, "not covered"
(``rows``); the CLI's tables and the JSON report (``render``); ``--list-cases`` (``listing``).

Tests: tests/checker/report/
"""
