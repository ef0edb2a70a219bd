"""What the checker returns and prints: rows, verdicts, group statuses and coverage, "not covered"
(``rows``); what the failing groups of a check have in common (``diagnosis``); the CLI's tables
and JSON (``render``), the JSON file written as a run goes (``json_file``); ``--list-cases``
(``listing``).

Tests: tests/checker/report/
"""
