"""The rules of one attention call in torch, the twin of ``numpy_attention.rules``: q, k, v and
every option checked once, before any work (``prepare``, with the NumPy core's messages), and
kept in the form the backends read (``ScoreRules``): the tensor masks combined into one bool
"may attend", causal and windows as one band of positions (``left``, ``right``, ``offset``)
and chunks beside it (``chunk``, ``chunk_start``),
kept apart so that SDPA can use its own causal mask and FlexAttention its ``mask_mod``, ALiBi
slopes and sinks shaped to broadcast on the scores, dropout as an explicit keep-mask.

Shape legend: B batch, H query heads, H_kv key/value heads, N query length, M key length, D head
width, Dv value head width; "..." any leading axes of q, the last of them the heads axis H.

Derivation: docs/derivations/attention.md (the pipeline the rules feed), windows.md, gqa.md,
alibi.md, sinks.md. Tests: tests/torch_attention/test_rules.py.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch

from . import masks, validation

ALIGNS = ("top-left", "bottom-right")


class ScoreRules(NamedTuple):
    """Every option of one attention call, checked, in the form the backends read.

    ``allowed`` holds the tensor masks only; causal and windows are a band of positions
    (``left``, ``right``, ``offset``), kept apart so that SDPA can use its own causal mask and
    FlexAttention its ``mask_mod``. Tensors broadcast against the scores (..., H, N, M).
    """

    n: int
    m: int
    group: int  # query heads per kv head (1 without GQA)
    scale: float
    softcap: float  # 0.0: off
    slopes: torch.Tensor | None  # ALiBi, (H, 1, 1) or (B, 1, ..., H, 1, 1), compute dtype
    bias: torch.Tensor | None  # float attn_mask, compute dtype, 0 where it was -inf
    allowed: torch.Tensor | None  # bool "may attend": bool attn_mask, padding, float -inf
    left: int | None  # the band of visible keys: p_i - left <= j <= p_i + right,
    right: int | None  # None = unbounded on that side; causal makes right <= 0
    offset: int  # p_i = i + offset
    sinks: torch.Tensor | None  # (H, 1, 1), compute dtype
    dropout_p: float
    keep: torch.Tensor | None  # explicit dropout keep-mask, broadcasting to (..., H, N, M)
    compute: torch.dtype  # float32 for half inputs, else the inputs' dtype
    chunk: int | None = None  # chunked attention: p_i and j must share a chunk of this size,
    chunk_start: torch.Tensor | None = None  # counted from this key: int64, full rank; None: 0


class Inputs(NamedTuple):
    """q, k, v checked (in their own dtype), with the rules of the call."""

    q: torch.Tensor  # (..., H, N, D)
    k: torch.Tensor  # (..., H_kv, M, D)
    v: torch.Tensor  # (..., H_kv, M, Dv)
    rules: ScoreRules


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half types are computed in float32 (NumPy's float16 rule); others in their own dtype."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def prepare(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: Any = False,
    window: Any = None,
    align: Any = "top-left",
    key_padding_mask: Any = None,
    attn_mask: Any = None,
    scale: Any = None,
    softcap: Any = 0.0,
    alibi_slopes: Any = None,
    sinks: Any = None,
    enable_gqa: Any = False,
    dropout_p: Any = 0.0,
    dropout_mask: Any = None,
    chunk_size: Any = None,
    chunk_start: Any = None,
) -> Inputs:
    """Check q, k, v and every option (before any work) and build the rules of the call.

    Raises ``TypeError``/``ValueError`` naming the argument and the shapes involved, with the
    messages of ``numpy_attention.rules.prepare``.
    """
    q, k, v = (validation.float_tensor(name, t) for name, t in (("q", q), ("k", k), ("v", v)))
    dtype = validation.same_dtype(q=q, k=k, v=v)
    compute = compute_dtype(dtype)
    group = _check_shapes(q, k, v, validation.flag("enable_gqa", enable_gqa))
    lead, n, m, d = tuple(q.shape[:-2]), q.shape[-2], k.shape[-2], q.shape[-1]
    score_shape = lead + (n, m)
    device = q.device

    causal = validation.flag("causal", causal)
    if align not in ALIGNS:
        raise ValueError(f"align must be one of {ALIGNS}, got {align!r}")
    left, right = validation.window(window)
    if causal:
        right = 0 if right is None else min(right, 0)
    chunk, start = _check_chunk(chunk_size, chunk_start, tuple(q.shape), len(score_shape), device)

    bias, allowed, padded_rows = None, [], None
    if attn_mask is not None:
        bool_mask, float_mask = masks.split_attn_mask(attn_mask, score_shape, compute, device)
        allowed.append(bool_mask)
        if float_mask is not None:
            hidden = float_mask == float("-inf")  # -inf in a float mask hides: replace, not add
            bias = float_mask.masked_fill(hidden, 0.0)
            allowed.append(~hidden)
    if key_padding_mask is not None:
        padding = masks.key_padding_allowed(key_padding_mask, tuple(q.shape), m, device)
        allowed.append(padding)
        padded_rows = ~padding[..., 0, :, None]  # (B, 1, .., 1, M) -> (B, 1, .., M, 1)

    p = validation.dropout_p(dropout_p)
    keep = None
    if dropout_mask is not None:
        keep = validation.keep_mask("dropout_mask", dropout_mask, p, score_shape, device)

    if d == 0:
        raise ValueError(
            f"q and k have head width D = 0 (q {tuple(q.shape)}): nothing to attend with"
        )
    scale_value = 1.0 / math.sqrt(d) if scale is None else validation.finite_real("scale", scale)
    cap = validation.finite_real("softcap", softcap)
    if cap < 0:
        raise ValueError(f"softcap must be >= 0 (0 = off), got {softcap}")
    sinks = _check_sinks(sinks, lead, dtype, compute, device)
    slopes = _check_slopes(alibi_slopes, lead, compute, device)
    if padded_rows is not None:  # every check passed: the first work
        k, v = _unread(k, padded_rows), _unread(v, padded_rows)
    rules = ScoreRules(
        n=n,
        m=m,
        group=group,
        scale=scale_value,
        softcap=cap,
        slopes=slopes,
        bias=bias,
        allowed=masks.combine(*allowed),
        left=left,
        right=right,
        offset=m - n if align == "bottom-right" else 0,
        sinks=sinks,
        dropout_p=p,
        keep=keep,
        compute=compute,
        chunk=chunk,
        chunk_start=start,
    )
    return Inputs(q, k, v, rules)


def _check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, enable_gqa: bool) -> int:
    """The number of query heads per kv head; ``ValueError`` naming the shapes otherwise."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.ndim < 2:
            raise ValueError(
                f"{name} must have at least 2 axes (..., length, width), got {tuple(t.shape)}"
            )
    qs, ks, vs = tuple(q.shape), tuple(k.shape), tuple(v.shape)
    if qs[-1] != ks[-1]:
        raise ValueError(f"q and k must share the head width D, got q {qs} and k {ks}")
    if ks[:-1] != vs[:-1]:
        raise ValueError(
            f"k and v must share their leading axes and the key length M, got k {ks} and v {vs}"
        )
    if qs[:-2] == ks[:-2]:
        return 1
    if not enable_gqa:
        raise ValueError(
            f"q, k and v must share their leading axes, got q {qs}, k {ks}, v {vs}; k and v "
            f"with fewer heads (GQA/MQA) need enable_gqa=True"
        )
    if q.ndim < 3 or q.ndim != k.ndim or qs[:-3] != ks[:-3]:
        raise ValueError(
            f"with enable_gqa, q (..., H, N, D) and k, v (..., H_kv, M, D) differ only in the "
            f"heads axis -3, got q {qs} and k {ks}"
        )
    heads, kv_heads = qs[-3], ks[-3]
    if kv_heads == 0 or heads % kv_heads != 0:
        raise ValueError(
            f"the query heads H = {heads} must be a multiple of the kv heads H_kv = {kv_heads} "
            f"(q {qs}, k {ks})"
        )
    return heads // kv_heads


def _check_slopes(
    slopes: Any, lead: tuple[int, ...], compute: torch.dtype, device: torch.device
) -> torch.Tensor | None:
    """ALiBi slopes (H,) or (B, H), shaped to broadcast on the scores: (H, 1, 1), or
    (B, 1, ..., 1, H, 1, 1) against q's leading axes (B, ..., H)."""
    if slopes is None:
        return None
    slopes = validation.float_tensor("alibi_slopes", slopes)
    shape = tuple(slopes.shape)
    if len(lead) < 1 or slopes.ndim not in (1, 2) or shape[-1] != lead[-1]:
        raise ValueError(
            f"alibi_slopes must be (H,) or (B, H) with H = the heads axis of q (..., H, N, D); "
            f"got alibi_slopes {shape} for q leading axes {lead}"
        )
    if slopes.ndim == 2 and (len(lead) < 2 or shape[0] != lead[0]):
        raise ValueError(
            f"alibi_slopes (B, H) = {shape} needs q (B, ..., H, N, D) with that B; "
            f"got q leading axes {lead}"
        )
    if not bool(torch.isfinite(slopes).all()):
        raise ValueError(f"alibi_slopes must be finite (None for no ALiBi), got {slopes}")
    if slopes.ndim == 2:
        slopes = slopes.reshape(shape[:1] + (1,) * (len(lead) - 2) + shape[1:])
    return slopes.to(device=device, dtype=compute)[..., None, None]


def _check_sinks(
    sinks: Any, lead: tuple[int, ...], dtype: torch.dtype, compute: torch.dtype, device: Any
) -> torch.Tensor | None:
    """Sink logits (H,), one per query head, shaped (H, 1, 1) to broadcast on the scores."""
    if sinks is None:
        return None
    sinks = validation.float_tensor("sinks", sinks)
    if len(lead) < 1 or tuple(sinks.shape) != lead[-1:]:
        raise ValueError(
            f"sinks must be (H,), one logit per query head of q (..., H, N, D); got sinks "
            f"{tuple(sinks.shape)} for q leading axes {lead}"
        )
    if sinks.dtype != dtype:
        raise TypeError(f"sinks must have the dtype of q, k and v ({dtype}), got {sinks.dtype}")
    if not bool(torch.isfinite(sinks).all()):
        raise ValueError(f"sinks must be finite logits (None for no sinks), got {sinks}")
    return sinks.to(device=device, dtype=compute)[:, None, None]


def _check_chunk(
    chunk_size: Any, chunk_start: Any, q_shape: tuple[int, ...], rank: int, device: Any
) -> tuple[int | None, torch.Tensor | None]:
    """The chunk size C (None: no chunks) and where the chunks start on the key axis: None (key
    0), or int64 full rank, (1, ..., 1) for one start or (B, 1, ..., 1) for one per batch
    element (along q's first axis, as ``key_padding_mask``)."""
    if chunk_size is None:
        if chunk_start is not None:
            raise ValueError("chunk_start is given without chunk_size: it says where chunks start")
        return None, None
    chunk = validation.positive_int("chunk_size", chunk_size)
    if chunk_start is None:
        return chunk, None
    start = torch.as_tensor(chunk_start, device=device)
    if start.dtype == torch.bool or start.is_floating_point() or start.is_complex():
        raise TypeError(f"chunk_start must be an int or (B,) ints, got dtype {start.dtype}")
    if start.ndim == 0:
        return chunk, start.to(torch.int64).reshape((1,) * rank)
    if start.ndim != 1 or len(q_shape) < 3 or start.shape[0] != q_shape[0]:
        raise ValueError(
            f"chunk_start must be an int or (B,) with B the first axis of a batched q "
            f"(B, ..., N, D), got chunk_start {tuple(start.shape)} for q {q_shape}"
        )
    return chunk, start.to(torch.int64).reshape(tuple(start.shape) + (1,) * (rank - 1))


def _unread(t: torch.Tensor, padded: torch.Tensor) -> torch.Tensor:
    """``t`` (k or v, (..., M, W)) with its padded rows set to 0: never read.

    Padding is hidden from every query, so its scores are replaced, but the products P V (and
    dS K in the backward) would still multiply its rows by exact zeros, and IEEE makes
    0 x NaN = NaN: garbage in padding (an unwritten cache slot) would reach every row. Zeroing
    the rows changes nothing else (their weights and gradients are 0); it is done whatever the
    rows hold, a copy of k and v instead of a host sync to look for garbage first.
    """
    return t.masked_fill(padded, 0.0)
