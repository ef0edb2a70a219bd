"""Running kernels: one call made on copies of a case's inputs, with every failure of the kernel
an ``Outcome`` (``calls``: protection, and the attention family's call; ``decode``: the decode
family's), as plain data (``request``), with the memory layouts (``memory``) and dropout's probes
(``dropout``); in a child process (``isolation``) or on spawned gloo ranks (``ranks``).

Tests: tests/checker/running/
"""
