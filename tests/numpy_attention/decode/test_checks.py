"""The refusals of kvcache_attention_forward (numpy_attention.decode.checks): each bad argument
of a paged call refused with an error naming the argument, the shapes or the sequence, and
nothing written to either cache; the torch twin reuses the cases
(tests/torch_attention/decode/test_checks.py)."""

from __future__ import annotations

import numpy as np
import pytest

from numpy_attention.decode.paged import kvcache_attention_forward

from .test_paged import CASES, D, make_call


def paged_call(rng: np.random.Generator) -> dict:
    call = make_call(rng, {**CASES["paged"], "rotary": (D, True)})
    return {**call, "cache_seqlens": np.array([0, 3, 8], np.int32)}


BAD = {
    "past the block table": ({"cache_seqlens": np.array([0, 10, 1], np.int32)}, ValueError,
                             r"sequence 1: cache_seqlens 10 \+ 3 new tokens = 13 keys, but its "
                             r"block table holds 12 \(3 x 4\).*#2709"),
    "short block table": ({"block_table": "short"}, ValueError,
                          r"sequence 2: .* = 11 keys, but its block table holds 8"),
    "page out of range": ({"block_table": "bad page"}, ValueError,
                          r"sequence 1: block_table\[1, 1\] = 11 is not one of the cache's 11"),
    "negative length": ({"cache_seqlens": np.array([0, -1, 1], np.int32)}, ValueError,
                        r"sequence 1: cache_seqlens is negative \(-1\)"),
    "float table": ({"block_table": "float"}, TypeError,
                    r"block_table must be an integer array, got dtype (torch\.)?float64"),
    "float seqlens": ({"cache_seqlens": np.array([0.0, 1.0, 2.0])}, TypeError,
                      "cache_seqlens must be an integer array"),
    "leftpad with pages": ({"cache_leftpad": np.zeros(3, np.int32)}, ValueError,
                           "flash-attn refuses them with a block_table"),
    "short rotary": ({"rotary_cos": "short", "rotary_sin": "short"}, ValueError,
                     r"sequence 2: rotary positions reach 10, but .* have 8 rows"),
    "rotary without k": ({"k": None, "v": None}, ValueError, "rotary embeds the new keys"),
    "shared slot": ({"block_table": "shared"}, ValueError,
                    r"sequences 0 and 1 both write page/row"),
    "window": ({"window_size": (-2, 0)}, ValueError, r"window_size\[0\] must be >= 0"),
    "softcap": ({"softcap": -1.0}, ValueError, "softcap must be >= 0"),
    "dtype": ({"k": "float32"}, TypeError, "inputs must share one dtype"),
    "gqa": ({"q": "5 heads"}, ValueError, r"H = 5 must be a multiple of the kv heads H_kv = 4"),
}  # fmt: skip


def _bad(call: dict, name: str, value: str) -> object:
    """The bad argument ``value`` names, made from the good call."""
    table = call["block_table"].copy()
    if name == "block_table":
        if value == "bad page":
            table[1, 1] = 11  # the pool has pages 0 .. 10
        elif value == "shared":
            table[1, 1] = table[0, 0]  # sequence 1's positions 4, 5 on sequence 0's 0, 1
        return {"short": table[:, :2], "float": table.astype(np.float64)}.get(value, table)
    if name in ("rotary_cos", "rotary_sin"):
        return call[name][:8]
    if name == "k" and value == "float32":
        return call["k"].astype(np.float32)
    if name == "q" and value == "5 heads":
        return np.concatenate([call["q"], call["q"][:, :, :1]], axis=2)
    return value


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input_is_refused_and_nothing_is_written(rng, name):
    call = paged_call(rng)
    changes, error, match = BAD[name]
    call.update({arg: _bad(call, arg, value) if isinstance(value, str) else value
                 for arg, value in changes.items()})  # fmt: skip
    before = call["k_cache"].copy(), call["v_cache"].copy()

    with pytest.raises(error, match=match):
        kvcache_attention_forward(**call)

    np.testing.assert_array_equal(call["k_cache"], before[0])
    np.testing.assert_array_equal(call["v_cache"], before[1])


def test_a_contiguous_cache_too_short_names_the_sequence(rng):
    call = make_call(rng, CASES["contiguous"])
    call["cache_seqlens"] = np.array([0, 10, 3], np.int32)

    with pytest.raises(ValueError, match=r"sequence 1: .* = 13 keys, but the cache holds 12"):
        kvcache_attention_forward(**call)
