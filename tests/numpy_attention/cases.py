"""Cases of the NumPy core's option tests: each of today's options (and one with all of them)
as keywords of ``attention_forward``, with inputs drawn for it.

Shape legend: B batch, H = 4 query heads, H_kv kv heads, N query length, M key length.
"""

from __future__ import annotations

import numpy as np

H = 4


def option_kwargs(name, rng, batch, n, m):
    """The keywords of option ``name`` for q (batch, H, n, D) and kv heads returned alongside."""
    kv_heads, kwargs = H, {}
    if name.startswith("gqa"):
        kv_heads = int(name.split("-")[1])
        kwargs["enable_gqa"] = True
    elif name == "window-3-2":
        kwargs["window"] = (3, 2)
    elif name == "window-left-4":
        kwargs["window"] = (4, None)
    elif name == "window-right-1":
        kwargs["window"] = (None, 1)
    elif name == "causal-window-2":
        kwargs.update(causal=True, window=(2, 5))
    elif name == "bottom-right-causal":
        kwargs.update(causal=True, align="bottom-right")
    elif name == "bottom-right-window":
        kwargs.update(window=(1, 1), align="bottom-right")
    elif name == "softcap":
        kwargs["softcap"] = 1.5
    elif name == "alibi-H":
        kwargs["alibi_slopes"] = 2.0 ** -np.arange(1, H + 1)
    elif name == "alibi-BH":
        kwargs["alibi_slopes"] = rng.random((batch, H))
    elif name == "alibi-bottom-right-causal":
        kwargs.update(alibi_slopes=rng.random(H), causal=True, align="bottom-right")
    elif name == "sinks":
        kwargs["sinks"] = rng.standard_normal(H)
    elif name == "sinks-dead-rows":
        padding = np.zeros((batch, m), dtype=bool)
        padding[-1] = True  # the last batch element has nothing but the sink
        kwargs.update(sinks=rng.standard_normal(H), key_padding_mask=padding, causal=True)
    elif name == "float-mask-and-padding":
        bias = np.where(rng.random((n, m)) < 0.2, -np.inf, rng.standard_normal((n, m)))
        padding = rng.random((batch, m)) < 0.3
        kwargs.update(attn_mask=bias, key_padding_mask=padding)
    elif name == "chunk-3":
        kwargs.update(causal=True, chunk_size=3)
    elif name == "chunk-start-bottom-right":  # a start per batch element, one before key 0
        kwargs.update(causal=True, align="bottom-right", chunk_size=4)
        kwargs["chunk_start"] = np.arange(batch) * 3 - 1
    elif name == "chunk-window-bidirectional":
        kwargs.update(window=(1, None), chunk_size=3, chunk_start=1)
    elif name == "everything":
        kv_heads = 2
        kwargs.update(
            enable_gqa=True,
            window=(3, 1),
            align="bottom-right",
            softcap=2.0,
            alibi_slopes=rng.random(H),
            sinks=rng.standard_normal(H),
            key_padding_mask=rng.random((batch, m)) < 0.2,
            dropout_p=0.25,
            dropout_mask=rng.random((batch, H, n, m)) > 0.25,
            scale=0.7,
        )
    else:
        raise ValueError(name)
    return kv_heads, kwargs


OPTIONS = [
    "gqa-2",
    "gqa-1",
    "window-3-2",
    "window-left-4",
    "window-right-1",
    "causal-window-2",
    "bottom-right-causal",
    "bottom-right-window",
    "softcap",
    "alibi-H",
    "alibi-BH",
    "alibi-bottom-right-causal",
    "sinks",
    "sinks-dead-rows",
    "float-mask-and-padding",
    "chunk-3",
    "chunk-start-bottom-right",
    "chunk-window-bidirectional",
    "everything",
]
LENGTHS = {"N5-M9": (5, 9), "N9-M5": (9, 5), "N7-M7": (7, 7)}


def make_case(rng, name, lengths, d=3, dv=2, batch=2):
    n, m = LENGTHS[lengths]
    kv_heads, kwargs = option_kwargs(name, rng, batch, n, m)
    arrays = {
        "q": rng.standard_normal((batch, H, n, d)),
        "k": rng.standard_normal((batch, kv_heads, m, d)),
        "v": rng.standard_normal((batch, kv_heads, m, dv)),
    }
    if "sinks" in kwargs:
        arrays["sinks"] = kwargs.pop("sinks")
    dout = rng.standard_normal((batch, H, n, dv))
    dlse = rng.standard_normal((batch, H, n))
    return arrays, kwargs, dout, dlse
