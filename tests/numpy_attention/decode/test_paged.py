"""kvcache_attention_forward (numpy_attention.decode.paged): flash-attn's
``flash_attn_with_kvcache`` in float64 against a plain torch reference of its semantics written
here (pages gathered in table order, keys rotated and written, masks built in absolute cache
positions), option by option; its gradient is attention_backward's on the gathered keys. Its bad
input: test_checks.py and test_arguments.py; the page pool: test_pages.py and test_cache.py.

The reference is written from flash-attn's documentation (docs/decoding.md restates it), not
from the code under test: it never slices the key axis, and it places every query and key at
its absolute position in the sequence's cache.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from numpy_attention import attention_backward, attention_forward, gradcheck
from numpy_attention.decode.paged import kvcache_attention_forward
from numpy_attention.rope import rotate_pairs

from ...conftest import assert_close, to_torch

H, D, P = 4, 8, 4  # query heads, head width, page size


def torch_reference(q, k_cache, v_cache, *, k=None, v=None, rotary_cos=None, rotary_sin=None,
                    cache_seqlens, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    rotary_interleaved=True, alibi_slopes=None):  # fmt: skip
    """flash_attn_with_kvcache's semantics in plain torch: (out, lse, k_cache, v_cache after)."""
    q, k_cache, v_cache = (torch.as_tensor(t).clone() for t in (q, k_cache, v_cache))
    batch, s_q, heads, width = q.shape
    kv_heads = k_cache.shape[2]
    s_new = 0 if k is None else k.shape[1]
    scale = 1 / math.sqrt(width) if softmax_scale is None else softmax_scale
    seqlens = torch.as_tensor(cache_seqlens).expand(batch).tolist()
    outs, lses = [], []
    for b in range(batch):
        # The sequence's cache as one (capacity, H_kv, W) tensor: its pages in table order.
        if block_table is not None:
            ids = [int(p) for p in block_table[b]]
            logical = [torch.cat([c[p] for p in ids]) for c in (k_cache, v_cache)]
        else:
            row = b if cache_batch_idx is None else int(cache_batch_idx[b])
            logical = [k_cache[row].clone(), v_cache[row].clone()]
        start, total = seqlens[b], seqlens[b] + s_new
        query = q[b]
        if k is not None:
            new_k, new_v = torch.as_tensor(k[b]), torch.as_tensor(v[b])
            if rotary_cos is not None:
                local = window_size[0] >= 0 or window_size[1] >= 0
                q_pos = start + torch.arange(s_q) if causal or local else torch.full((s_q,), start)
                query = rotate(query, q_pos, rotary_cos, rotary_sin, rotary_interleaved)
                new_k = rotate(new_k, start + torch.arange(s_new), rotary_cos, rotary_sin,
                               rotary_interleaved)  # fmt: skip
            logical[0][start:total], logical[1][start:total] = new_k, new_v
            if block_table is not None:  # write the pages back
                for slot, p in enumerate(ids):
                    k_cache[p] = logical[0][slot * P : (slot + 1) * P]
                    v_cache[p] = logical[1][slot * P : (slot + 1) * P]
            else:
                k_cache[row], v_cache[row] = logical
        keys = logical[0][:total].repeat_interleave(heads // kv_heads, dim=1)  # (L, H, D)
        values = logical[1][:total].repeat_interleave(heads // kv_heads, dim=1)
        scores = torch.einsum("ihd,jhd->hij", query, keys) * scale  # (H, s_q, L)
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
        p_i = (total - s_q + torch.arange(s_q))[:, None]  # absolute positions, bottom-right
        j = torch.arange(total)[None, :]
        if alibi_slopes is not None:
            slopes = torch.as_tensor(alibi_slopes)
            slopes = slopes if slopes.ndim == 1 else slopes[b]
            scores = scores - slopes[:, None, None] * (p_i - j).abs()
        hidden = torch.zeros(s_q, total, dtype=torch.bool)
        if causal:
            hidden |= j > p_i
        if window_size[0] >= 0:
            hidden |= j < p_i - window_size[0]
        if window_size[1] >= 0:
            hidden |= j > p_i + window_size[1]
        if cache_leftpad is not None:
            hidden |= j < int(cache_leftpad[b])
        scores = scores.masked_fill(hidden, -math.inf)
        lse = torch.logsumexp(scores, dim=-1)  # (H, s_q)
        weights = torch.exp(scores - torch.where(lse.isneginf(), 0, lse)[..., None])
        outs.append(torch.einsum("hij,jhd->ihd", weights, values))  # (s_q, H, Dv)
        lses.append(lse)
    return torch.stack(outs), torch.stack(lses), k_cache, v_cache


def rotate(x, positions, cos, sin, interleaved):
    """flash-attn's rotary on the first rotary_dim coordinates of x (s, heads, D)."""
    cos, sin = (torch.as_tensor(t)[positions][:, None, :] for t in (cos, sin))  # (s, 1, r/2)
    width = 2 * cos.shape[-1]
    part, rest = x[..., :width], x[..., width:]
    if interleaved:
        a, b = part[..., 0::2], part[..., 1::2]
        turned = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
    else:
        a, b = part[..., : width // 2], part[..., width // 2 :]
        turned = torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)
    return torch.cat((turned, rest), dim=-1)


def rotary_tables(length: int, rotary_dim: int) -> tuple[np.ndarray, np.ndarray]:
    angles = np.arange(length)[:, None] * 10000.0 ** (-np.arange(0, rotary_dim, 2) / rotary_dim)
    return np.cos(angles), np.sin(angles)


# Each option, and the pairs that meet in a decode step. Lengths per sequence (before the new
# tokens) cover 0, 1, odd, a page boundary from both sides and the full capacity (12 = 3 pages of
# 4); "paged" pools shuffle their pages.
CASES = {
    "contiguous": {"seqlens": [0, 5, 9]},
    "paged": {"seqlens": [0, 3, 9], "paged": True},
    "no-append": {"seqlens": [1, 4, 12], "paged": True, "s_new": 0},
    "causal-gqa": {"seqlens": [0, 7, 9], "paged": True, "causal": True, "kv_heads": 2},
    "mqa-causal-s_q>L": {"seqlens": [0, 1, 2], "s_q": 5, "s_new": 1, "causal": True,
                         "kv_heads": 1},
    "rotary-interleaved-causal": {"seqlens": [2, 5, 9], "paged": True, "causal": True,
                                  "rotary": (D, True)},
    "rotary-half-not-causal": {"seqlens": [2, 5, 9], "rotary": (D, False)},
    "rotary-partial-window": {"seqlens": [0, 4, 8], "paged": True, "rotary": (D // 2, False),
                              "window": (3, 1)},
    "rotary-s_new<s_q": {"seqlens": [0, 5, 10], "s_new": 1, "causal": True, "rotary": (D, True)},
    "window-causal": {"seqlens": [3, 6, 9], "paged": True, "causal": True, "window": (2, -1)},
    "softcap": {"seqlens": [1, 5, 8], "softcap": 1.5, "logits": 4.0},
    "alibi": {"seqlens": [1, 5, 8], "paged": True, "alibi": "H", "causal": True},
    "alibi-per-sequence-leftpad": {"seqlens": [2, 5, 8], "alibi": "BH", "leftpad": [1, 0, 8]},
    "leftpad-causal-rotary": {"seqlens": [2, 5, 8], "leftpad": [2, 3, 0], "causal": True,
                              "rotary": (D, True)},
    "batch-idx": {"seqlens": [2, 0, 9], "batch_idx": [4, 0, 2], "causal": True},
    "scale": {"seqlens": [3, 4, 5], "paged": True, "scale": 0.1},
}  # fmt: skip


def make_call(rng: np.random.Generator, case: dict) -> dict:
    """The float64 arguments of ``case``: q, caches (pages shuffled), new k and v, options."""
    batch, capacity, kv_heads = 3, 3 * P, case.get("kv_heads", H)
    s_q = case.get("s_q", 3)
    s_new = case.get("s_new", s_q)
    seqlens = np.array(case["seqlens"], np.int32) - np.where(
        np.array(case["seqlens"]) + s_new > capacity, s_new, 0
    )  # a length at capacity keeps room for the new tokens: it ends exactly full
    stretch = math.sqrt(case.get("logits", 1.0))
    call: dict = {"q": rng.standard_normal((batch, s_q, H, D)) * stretch}
    if case.get("paged"):
        blocks = batch * 3 + 2
        call["block_table"] = rng.permutation(blocks)[: batch * 3].reshape(batch, 3)
        call["block_table"] = call["block_table"].astype(np.int32)
        shape = (blocks, P, kv_heads, D)
    else:
        rows = batch + 2 if "batch_idx" in case else batch
        shape = (rows, capacity, kv_heads, D)
        if "batch_idx" in case:
            call["cache_batch_idx"] = np.array(case["batch_idx"], np.int32)
    call["k_cache"] = rng.standard_normal(shape) * stretch
    call["v_cache"] = rng.standard_normal(shape)
    if s_new:
        call["k"] = rng.standard_normal((batch, s_new, kv_heads, D)) * stretch
        call["v"] = rng.standard_normal((batch, s_new, kv_heads, D))
    if "rotary" in case:
        rotary_dim, call["rotary_interleaved"] = case["rotary"]
        call["rotary_cos"], call["rotary_sin"] = rotary_tables(capacity + s_q, rotary_dim)
    if "leftpad" in case:
        call["cache_leftpad"] = np.minimum(np.array(case["leftpad"], np.int32), seqlens)
    if case.get("alibi") == "H":
        call["alibi_slopes"] = 2.0 ** -np.arange(1, H + 1)
    elif case.get("alibi") == "BH":
        call["alibi_slopes"] = 2.0 ** -np.arange(1, H + 1) * (1 + np.arange(batch))[:, None]
    for name in ("causal", "softcap"):
        if name in case:
            call[name] = case[name]
    if "window" in case:
        call["window_size"] = case["window"]
    if "scale" in case:
        call["softmax_scale"] = case["scale"]
    call["cache_seqlens"] = seqlens
    return call


def assert_lse_close(actual, expected) -> None:
    """-inf exactly where the reference has it (a query with nothing to see), close elsewhere."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    np.testing.assert_array_equal(np.isneginf(actual), np.isneginf(expected))
    finite = np.isfinite(expected)
    assert_close(actual[finite], expected[finite], name="lse")


@pytest.mark.parametrize("name", list(CASES))
def test_matches_a_torch_reference_of_flash_attns_semantics(rng, name):
    call = make_call(rng, CASES[name])
    expected = torch_reference(**{n: to_torch(t) if isinstance(t, np.ndarray) else t
                                  for n, t in call.items()})  # fmt: skip
    k_cache, v_cache = call["k_cache"].copy(), call["v_cache"].copy()

    result = kvcache_attention_forward(
        **{**call, "k_cache": k_cache, "v_cache": v_cache}, return_lse=True
    )

    assert_close(result.out, expected[0], name="out")
    assert_lse_close(result.lse, expected[1])
    np.testing.assert_array_equal(k_cache, expected[2].numpy())  # new slots: rotated keys
    np.testing.assert_array_equal(v_cache, expected[3].numpy())  # every other slot unchanged


def test_float16_is_computed_in_float32_and_rounded_once(rng):
    call = make_call(rng, CASES["rotary-interleaved-causal"])
    half = {n: t.astype(np.float16) if isinstance(t, np.ndarray) and t.dtype == np.float64
            else t for n, t in call.items()}  # fmt: skip
    golden = kvcache_attention_forward(
        **{n: t.astype(np.float64) if isinstance(t, np.ndarray) and t.dtype == np.float16
           else t for n, t in half.items()}, return_lse=True,
    )  # fmt: skip

    result = kvcache_attention_forward(**half, return_lse=True)

    assert result.out.dtype == np.float16 and result.lse.dtype == np.float32
    assert_close(result.out, golden.out, dtype=np.float16, name="out")


# -- the gradient: attention_backward on the gathered keys ------------------------------------

SEQLENS, TABLE = np.array([1, 2], np.int32), np.array([[3, 0], [1, 4]], np.int32)
COS, SIN = rotary_tables(8, 4)
GRAD_OPTIONS = {"causal": True, "softcap": 2.0, "alibi_slopes": np.array([0.5, 0.25])}


def decode(q, k, v, k_pages, v_pages):
    """One decode step over copies of the pages (so that it is a pure function), rotary on."""
    result = kvcache_attention_forward(
        q, k_pages.copy(), v_pages.copy(), k=k, v=v, rotary_cos=COS, rotary_sin=SIN,
        cache_seqlens=SEQLENS, block_table=TABLE, **GRAD_OPTIONS,
    )  # fmt: skip
    return result.out, (q, k, v, k_pages, v_pages)


def turn(x, positions, sign=1.0):
    """Rotate x (s, heads, 4) at ``positions`` (by -angle for sign -1: the transpose)."""
    cos, sin = COS[positions][:, None], sign * SIN[positions][:, None]
    return rotate_pairs(x, cos, sin, interleaved=True)


def gathered_backward(dout, inputs):
    """The gradient as attention_backward gives it on each sequence's gathered, rotated keys,
    scattered back through the rotation and the pages."""
    q, k, v, k_pages, v_pages = inputs
    grads = [np.zeros_like(t) for t in inputs]
    for b, start in enumerate(SEQLENS):
        total, ids = start + k.shape[1], TABLE[b]
        q_pos, k_pos = start + np.arange(q.shape[1]), start + np.arange(k.shape[1])
        keys = np.concatenate([k_pages[ids].reshape(-1, 1, 4)[:start], turn(k[b], k_pos)])
        values = np.concatenate([v_pages[ids].reshape(-1, 1, 4)[:start], v[b]])
        forward = attention_forward(
            turn(q[b], q_pos).swapaxes(0, 1), keys.swapaxes(0, 1), values.swapaxes(0, 1),
            align="bottom-right", enable_gqa=True, **GRAD_OPTIONS,
        )  # fmt: skip
        dq, dk, dv, _ = attention_backward(dout[b].swapaxes(0, 1), forward.ctx)
        grads[0][b] = turn(dq.swapaxes(0, 1), q_pos, -1.0)  # rotate back: the transpose
        grads[1][b] = turn(dk.swapaxes(0, 1)[start:total], k_pos, -1.0)
        grads[2][b] = dv.swapaxes(0, 1)[start:total]
        for slot in range(start):  # cached keys: scattered to their pages (new slots get none)
            grads[3][ids[slot // 2], slot % 2] += dk[:, slot]
            grads[4][ids[slot // 2], slot % 2] += dv[:, slot]
    return tuple(grads)


def test_the_gradient_is_attention_backward_on_the_gathered_keys(rng):
    q = rng.standard_normal((2, 2, 2, 4))  # B = 2, s_q = 2, H = 2, D = 4
    k, v = rng.standard_normal((2, 2, 2, 1, 4))  # s_new = 2, one kv head
    k_pages, v_pages = rng.standard_normal((2, 5, 2, 1, 4))  # 5 pages of 2

    report = gradcheck(decode, q, k, v, k_pages, v_pages, backward=gathered_backward)

    assert report.passed, report
