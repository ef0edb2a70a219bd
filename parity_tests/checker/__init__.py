"""The kernel checker: a user's attention kernel judged case by case against the float64 NumPy
golden (docs/kernel-verification.md).

One idea per module, each importing only those above it in this list:
``case`` (one case and its inputs), ``pairs`` (each spec's factors and values, the pairs one
case can hold, the covering array, pair coverage), ``named`` (the hand-written cases, kept by
name), ``sizes`` (the block edges, split-KV paths and head widths a battery must hold),
``generate`` (each spec's default battery: the covering array sized, shaped and named),
``battery`` (the batteries and the cases by name; the quick battery), ``decode_battery`` (the
decode specs' cases and inputs), ``reference`` (the plain same-dtype baseline),
``decode_reference`` (its decode form: pages, rotary, append), ``specs`` (how each library's
signature and layout calls a kernel, and the features it can express), ``report`` (rows,
verdicts, coverage), ``judge`` (the tolerance policy on one tensor, the bias statistic, lse,
dropout's draws), ``expected`` (a case's inputs, golden and baseline), ``memory`` (where q, k, v
sit in memory), ``dropout`` (the keep-mask read back, the draws), ``calls`` (one kernel call
made and judged: the request, its outcome, the in-place checks), ``decode`` (the decode specs: a
decode call made and judged, out, lse and the caches after it), ``isolation`` (each call in a
child process), ``ring`` (the distributed spec on spawned gloo ranks), ``kernels``
(``check_kernel``: the cases and dtypes of one kernel, in this process, isolated or on a ring),
``adapters`` (``torch_attention`` behind flash-attn's signatures), ``decode_kernels`` (correct
decode kernels: ``torch_attention.paged`` behind flash-attn's and FlashMLA's signatures,
transformers' paged attention), ``third_party`` (FlexAttention and Hugging Face's attention
functions behind a spec), ``pitfalls_today``, ``pitfalls_kernels``, ``pitfalls`` and
``pitfalls_decode`` (broken kernels that prove the checker has teeth), ``targets`` (the built-in
kernels and their documented failures), ``calibration`` (the measurement behind the tolerance
policy), ``decode_calibration`` (its decode specs alone), ``render`` (tables and JSON for the
CLI).

Tests: tests/checker/ (one test file per module)
"""
