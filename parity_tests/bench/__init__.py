"""The benchmarks (never timed tests): NumPy attention against torch on this machine's CPU, and
the project's kernels where they run.

``python -m parity_tests.bench`` (``cli.py``, ``--help``) runs the CPU benchmark, one part per
module: ``attention`` (the attention alone at each shape), ``tuning`` (the tiled path's
crossover, block sizes and profile), ``gpt2`` (a GPT-2 layer), ``options`` (today's options on the
tiled path), ``decode`` (a Llama-8B-shaped layer's decode step and prefill) and ``latent`` (a
DeepSeek-V2-Lite-shaped MLA layer's decode step); ``measure`` says how they measure and
``report`` assembles their tables and targets, recorded in docs/benchmarks.md. Two benchmarks
have commands of their own: ``python -m parity_tests.bench.distributed`` (ring attention on gloo
CPU processes, docs/context-parallel.md) and ``python -m parity_tests.bench.triton`` (the Triton
kernel on a GPU, docs/triton-kernel.md).

Importing this package imports nothing else (no torch): each module is loaded when asked for.

Tests: tests/bench/
"""
