"""The kernel checker: a user's attention kernel judged case by case against the float64 NumPy
golden (docs/kernel-verification.md).

One idea per module, each importing only those above it in this list:
``battery`` (the cases and their inputs), ``reference`` (the plain same-dtype baseline),
``specs`` (how each library's signature and layout calls a kernel, and the features it can
express), ``report`` (rows, verdicts, coverage), ``judge`` (the tolerance policy on one tensor,
the bias statistic, lse), ``expected`` (a case's inputs, golden and baseline), ``calls`` (one
kernel call made and judged: the request, its outcome, the in-place checks), ``isolation`` (each
call in a child process), ``ring`` (the distributed spec on spawned gloo ranks), ``kernels``
(``check_kernel``: the cases and dtypes of one kernel, in this process, isolated or on a ring),
``adapters`` (``torch_attention`` behind flash-attn's signatures), ``third_party``
(FlexAttention and Hugging Face's attention behind a spec), ``pitfalls_today`` and ``pitfalls``
(broken kernels that prove the checker has teeth), ``targets`` (the built-in kernels and their
documented failures), ``calibration`` (the measurement behind the tolerance policy), ``render``
(tables and JSON for the CLI).

Tests: tests/checker/ (one test file per module)
"""
