"""The kernels the main job checks by default, correct ones of every spec (``builtin``): torch's
own (``torch_kernels``), the project's twins behind the real libraries' signatures (``adapters``,
``decode``), and where installed FlexAttention's and Hugging Face's (``third_party``); their
documented failures (``expected``).

Tests: tests/checker/targets/
"""
