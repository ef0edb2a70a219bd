"""The kernel checker: a user's attention kernel judged case by case against the float64 NumPy
golden, through one pipeline for every kernel API (docs/kernel-verification.md; a case's path,
file by file: docs/checker-map.md).

- ``spec`` (the plugin interface) and ``specs/`` (one module per kernel API: sdpa, flash,
  flash_varlen, flex, ring, flash_kvcache, flash_mla, found by walking the folder);
- ``pipeline`` (``check_kernel`` and ``plan_groups``: battery -> call -> golden -> judge ->
  report, knowing no API by name);
- ``battery/`` (covering arrays over any spec's factors, the kernel's limits, batteries and cases
  by name, the fuzzer; ``attention/`` and ``decode/``: each family's cases, sizes and builder);
- ``golden/`` (the float64 golden and the plain same-dtype baseline of each family);
- ``running/`` (a call made and protected, in this process, in a child, on ranks);
- ``judge/`` (the tolerance policy on one tensor; each family's verdict on one call);
- ``report/`` (rows, verdicts, coverage, "not covered"; tables, JSON, ``--list-cases``);
- ``pitfalls/`` (broken kernels, one module per spec), ``targets/`` (the built-in correct
  kernels) and ``calibration/`` (the measurement behind the policy).

Each folder's modules import only what lies before them in this list, or in their own folder;
``parity_tests`` exports ``check_kernel``, ``plan_groups``, ``KernelLimits``, ``KernelReport``
and the names of the specs and features.

Tests: tests/checker/ (one test file per module, mirroring these folders)
"""
