"""Hand-written cases, each kept addressable by its name: the named cases (the checker's battery
before batteries were built by code, ``checker.battery``), the stress battery, and the ring
battery's first cases.

The named cases are no battery of their own: ``cases=["window-tl"]`` or ``--case window-tl``
runs one, the compiled targets run four of them (each new shape compiles), and the findings of
docs/kernel-verification.md cite them. What each is for is written beside it.

Shape legend: B batch, H heads, H_kv key/value heads, N query length, M key/value length,
D head width, Dv value width.

Tests: tests/checker/battery/attention/test_generate.py
"""

from __future__ import annotations

from .case import Case

BR = "bottom-right"
VARLEN_LENGTHS = ((37, 113), (1, 64), (64, 37), (20, 20))

NAMED: tuple[Case, ...] = (
    Case("single-query", 1, 1, 1, 37, 16),
    Case("plain", 2, 3, 37, 113, 64),
    Case("long-keys-d128", 1, 2, 113, 203, 128),
    Case("odd-d33", 2, 1, 203, 37, 33),
    Case("causal-square", 2, 2, 128, 128, 32, causal=True),
    Case("causal-n<m", 1, 2, 37, 113, 64, causal=True),
    Case("causal-n>m", 2, 1, 113, 37, 48, causal=True),
    Case("bool-mask", 2, 2, 37, 113, 64, mask="bool"),
    Case("float-mask", 1, 3, 113, 128, 64, mask="float"),
    Case("dead-rows-bool", 2, 2, 37, 64, 32, mask="dead-bool"),
    Case("dead-rows-float", 1, 2, 37, 64, 32, mask="dead-float"),
    Case("scale-1/d", 2, 2, 37, 113, 64, scale=1.0 / 64),
    # Dv != D with the default scale: the scale is 1 / sqrt(D), never 1 / sqrt(Dv).
    Case("dv>d", 2, 2, 37, 113, 32, dv=64),
    Case("dv<d", 1, 3, 113, 37, 64, dv=16),
    Case("large-logits", 1, 2, 113, 113, 64, logits=30.0),
    Case("heavy-tailed", 2, 2, 128, 128, 64, causal=True, inputs="heavy"),
    Case("dropout", 2, 2, 37, 64, 64, dropout_p=0.3),
    # GQA: 2 and 1 KV heads of 4 (the group sums of dK and dV are judged).
    Case("gqa-2of4", 2, 4, 37, 113, 32, heads_kv=2),
    Case("gqa-1of4-causal", 1, 4, 64, 64, 32, causal=True, heads_kv=1),
    # Bottom-right causal (flash-attn's): N < M, N > M (the first N - M rows see nothing), and
    # one decode step against a long cache.
    Case("causal-br-n<m", 1, 2, 37, 113, 64, causal=True, align=BR),
    Case("causal-br-n>m", 2, 1, 113, 37, 48, causal=True, align=BR),
    Case("decode-n1", 2, 4, 1, 203, 64, causal=True, align=BR, heads_kv=2),
    # Windows: one-sided (a causal sliding window), two-sided with each alignment.
    Case("window-causal", 2, 2, 128, 128, 32, causal=True, window=(16, None)),
    Case("window-br", 1, 2, 37, 113, 32, window=(8, 5), align=BR),
    Case("window-tl", 1, 2, 113, 37, 32, window=(4, 9)),
    # Softcap at logits that it actually bends (spread 30 against a cap of 5), alone and with
    # what it meets in models, in the pipeline's order (cap, then ALiBi, then the masks): a
    # causal sliding window bottom-right (Gemma 2's sliding layers), and ALiBi.
    Case("softcap", 1, 2, 64, 64, 64, softcap=5.0, logits=30.0),
    Case("softcap-window", 2, 2, 64, 96, 32, causal=True, window=(24, None), softcap=2.0,
         logits=30.0, align=BR),
    Case("softcap-alibi", 1, 4, 37, 113, 32, softcap=5.0, logits=30.0, alibi="H", align=BR),
    # ALiBi per head and per batch element; causal with N < M is where flash-attn's lse
    # convention differs from the golden's (docs/derivations/alibi.md).
    Case("alibi-h", 2, 4, 37, 113, 32, alibi="H", align=BR),
    Case("alibi-bh-causal", 2, 2, 37, 113, 32, causal=True, alibi="BH", align=BR),
    # Packed variable-length sequences, unequal lengths and a length-1 sequence.
    Case("varlen", 4, 2, 122, 234, 32, seqlens=VARLEN_LENGTHS),
    Case("varlen-causal-gqa", 4, 4, 122, 234, 32, causal=True, align=BR, heads_kv=2,
         seqlens=VARLEN_LENGTHS),
)  # fmt: skip

# Conditions where real kernels are known to drift (extreme logits, long sequences): findings,
# never part of a verdict.
STRESS: tuple[Case, ...] = (
    Case("logits-1e3", 1, 2, 113, 113, 64, logits=1e3),
    Case("logits-1e4", 1, 2, 113, 113, 64, logits=1e4),
    Case("logits-1e6", 1, 2, 113, 113, 64, logits=1e6),
    Case("causal-logits-1e3", 1, 2, 113, 113, 64, causal=True, logits=1e3),
    Case("long-1024", 1, 1, 1024, 1024, 64, causal=True),
    Case("d256", 1, 2, 113, 203, 256),
    Case("heavy-logits-100", 2, 2, 128, 128, 64, inputs="heavy", logits=100.0),
)

# Self-attention (N = M) for the distributed spec; 48 positions split into 2W equal chunks for
# W in 2, 3, 4, 6 (zigzag) and more (contiguous). The ring battery starts from these and adds
# the rows its covering array still needs (``checker.battery.attention.generate``).
RING_SEEDS: tuple[Case, ...] = (
    Case("ring-plain", 2, 2, 48, 48, 16),
    Case("ring-causal", 2, 2, 48, 48, 16, causal=True),
    Case("ring-causal-zigzag", 2, 2, 48, 48, 16, causal=True, layout="zigzag"),
    Case("ring-gqa", 1, 4, 48, 48, 16, heads_kv=2, causal=True),
    Case("ring-window", 1, 2, 48, 48, 16, window=(5, 3), layout="zigzag"),
    Case("ring-softcap", 1, 2, 48, 48, 16, softcap=2.0, logits=5.0, causal=True),
)
