"""How the checker calls a kernel: one spec per real library signature, with its layout and the
features (options) it can express.

- "sdpa": ``F.scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
  is_causal=False, scale=None, enable_gqa=False)``; (B, H, N, D); causal top-left.
- "flash": flash-attn's ``flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None,
  causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
  return_attn_probs=False)``; (B, N, H, D), lse (B, H, N) as the second item returned with
  ``return_attn_probs=True``; causal, windows and ALiBi bottom-right.
- "flash_varlen": ``flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
  max_seqlen_k, ...)`` with the keywords above; packed (T, H, D), ``cu_seqlens`` int32, lse
  (H, T); bottom-right per sequence.
- "flex": ``flex_attention(query, key, value, score_mod=None, block_mask=None, scale=None,
  enable_gqa=False, return_lse=False)``, lse asked for as the installed torch does
  (``return_aux`` in torch 2.13); (B, H, N, D); the alignment the checker's mask says.
- "ring": ``torch_attention.distributed.ring_attention(q, k, v, *, group, causal, scale,
  softcap, window, enable_gqa, layout)`` on spawned gloo ranks (``checker.ring``); shards of
  (B, H, N, D); top-left, N = M.
- "flash_kvcache" and "flash_mla" (``DECODE_SPECS``): flash-attn's ``flash_attn_with_kvcache``
  and FlashMLA's ``flash_mla_with_kvcache``, decode kernels over a cache: their own battery
  (``checker.decode_battery``), calls and verdicts (``checker.decode``).

The checker keeps every case in one canonical layout, (B, H, N, D) (a packed case: (T, H, D)
and lse (H, T)); a spec moves the inputs into its layout, calls the kernel, and moves the results
back. The "flash", "flash_varlen", "flex" and "ring" specs pass only the keywords that differ
from the signature's defaults (so that a kernel without, say, a softcap argument still runs the
cases that need none); the "sdpa" spec always passes ``attn_mask``, ``dropout_p``,
``is_causal`` and ``scale`` (None, 0.0, False and None where the case has none: the arguments
every SDPA-compatible kernel takes), and ``enable_gqa=True`` only to cases with fewer key/value
heads. Flash-attn's ALiBi
slopes are float32, its ``cu_seqlens`` int32, as the library requires. For "flex" the checker
builds ``score_mod`` (softcap, ALiBi, the finite part of a float mask) and ``block_mask``
(causal, the window, a bool mask, the -inf entries of a float mask) with the installed torch's
``create_block_mask``.

Shape legend: B batch, H heads, H_kv key/value heads, N query length, M key/value length,
D head width, Dv value width; T packed token count.

Tests: tests/checker/test_specs.py
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import torch

from .battery.catalog import Case
from .battery.decode_case import DECODE_SPECS
from .battery.pairs import ALIGN

FEATURES = ("mask", "causal", "dropout", "gqa", "window", "softcap", "alibi", "lse", "dv")
# The decode specs' own options: rotary embedding of the new keys, a paged cache, appending new
# tokens, left padding, cache rows by batch index, a split count.
DECODE_FEATURES = ("rotary", "paged", "append", "leftpad", "batch_idx", "splits")
FEATURES += DECODE_FEATURES

# The features each spec can express; each is also the spec's default set.
SPEC_FEATURES: dict[str, frozenset[str]] = {
    "sdpa": frozenset({"mask", "causal", "dropout", "gqa", "dv"}),
    "flash": frozenset({"causal", "window", "softcap", "alibi", "gqa", "lse", "dv", "dropout"}),
    "flash_varlen": frozenset(
        {"causal", "window", "softcap", "alibi", "gqa", "lse", "dv", "dropout"}
    ),
    "flex": frozenset({"mask", "causal", "window", "softcap", "alibi", "gqa", "lse", "dv"}),
    "ring": frozenset({"causal", "window", "softcap", "gqa", "dv"}),
    "flash_kvcache": frozenset(
        {"causal", "gqa", "window", "softcap", "alibi", "lse", *DECODE_FEATURES}
    ),
    "flash_mla": frozenset({"causal", "lse"}),
}
SPECS = tuple(SPEC_FEATURES)
# How dropout is judged: the keep-mask read back (SDPA's signature), or draws judged
# statistically (flash-attn's, which returns no mask).
DROPOUT_READBACK = ("sdpa",)
DROPOUT_DRAWS = ("flash", "flash_varlen")


def check_spec(spec: object) -> str:
    """``spec`` if it names a spec, else a ValueError listing them."""
    if not isinstance(spec, str) or spec not in SPEC_FEATURES:
        raise ValueError(f"spec must be one of {list(SPECS)}, got {spec!r}")
    return spec


def resolve_features(spec: str, features: Iterable[str] | str | None) -> frozenset[str]:
    """The features a kernel claims: the spec's default set for None, else the names given
    (an unknown name, or one the spec cannot express, is a ValueError)."""
    if features is None:
        return SPEC_FEATURES[spec]
    if isinstance(features, str):
        raise TypeError(f"features must be a collection of names, got the string {features!r}")
    names = frozenset(features)
    unknown = sorted(str(name) for name in names if name not in FEATURES)
    if unknown:
        raise ValueError(f"unknown features {unknown}; known: {list(FEATURES)}")
    foreign = sorted(names - SPEC_FEATURES[spec])
    if foreign:
        raise ValueError(
            f"spec {spec!r} cannot express the features {foreign}; "
            f"its features: {sorted(SPEC_FEATURES[spec])}"
        )
    return names


def cannot_express(spec: str, case: Case) -> str | None:
    """Why ``spec``'s signature cannot express ``case`` at all, or None when it can."""
    if spec in DECODE_SPECS:
        return f"the {spec} spec runs its own decode battery (checker.decode_battery)"
    if spec == "ring":
        if case.n != case.m or case.packed or case.mask != "none":
            return "the ring spec is self-attention (N = M) with no mask"
        if case.dropout_p or case.alibi != "none":
            return "the ring spec has no dropout and no ALiBi"
        if case.memory != "contiguous":
            return "the ring spec's ranks get shards of their own, contiguous"
        return None
    if case.layout != "contiguous":
        return "only the ring spec shards a sequence"
    if case.packed and spec != "flash_varlen":
        return "packed sequences need the flash_varlen spec"
    if case.mask != "none" and spec not in ("sdpa", "flex"):
        return f"{spec} takes no attention mask"
    if spec == "sdpa" and case.mask != "none" and case.causal:
        return "SDPA takes attn_mask or is_causal, not both"
    if case.dropout_p and spec not in DROPOUT_READBACK + DROPOUT_DRAWS:
        return f"{spec} has no dropout"
    if spec == "sdpa" and (case.window is not None or case.softcap or case.alibi != "none"):
        return "SDPA's signature has no window, softcap or ALiBi"
    align = ALIGN.get(spec) if spec != "ring" else None
    if align is not None and case.positioned and case.align != align:
        return f"{spec} aligns causal, windows and ALiBi {align}, the case {case.align}"
    return None


def judged_case(spec: str, case: Case) -> Case:
    """The case whose golden the kernel's output, gradients and lse are judged against: for a
    spec whose dropout is judged by draws, the case at p = 0 (the draws are judged apart)."""
    if case.dropout_p and spec in DROPOUT_DRAWS:
        return dataclasses.replace(case, dropout_p=0.0)
    return case


def heads_first(spec: str, case: Case) -> bool:
    """Whether the spec's layout puts the heads axis before the length axis ((B, H, L, W)),
    rather than after it (flash-attn's (B, L, H, W), packed (T, H, W))."""
    return spec not in ("flash", "flash_varlen") and not case.packed


def layout(spec: str, case: Case, t: torch.Tensor) -> torch.Tensor:
    """A canonical q, k, v or dout, (B, H, L, W) (packed: (T, H, W)), in the spec's layout."""
    if spec in ("flash", "flash_varlen") and not case.packed:
        t = t.transpose(1, 2)  # (B, H, L, W) -> (B, L, H, W)
        if spec == "flash_varlen":
            t = t.reshape(-1, *t.shape[2:])  # (B, L, H, W) -> (B*L, H, W)
    return t


def unlayout(spec: str, case: Case, t: torch.Tensor, heads: int) -> torch.Tensor:
    """The inverse of ``layout`` for a result with ``heads`` heads."""
    if spec in ("flash", "flash_varlen") and not case.packed:
        if spec == "flash_varlen":
            t = t.reshape(case.batch, -1, heads, t.shape[-1])  # (B*L, H, W) -> (B, L, H, W)
        t = t.transpose(1, 2)  # (B, L, H, W) -> (B, H, L, W)
    return t


def lse_shape(spec: str, case: Case) -> tuple[int, ...]:
    """The shape of lse as the spec's library returns it."""
    if spec == "flash_varlen":
        return (case.heads, case.n * (1 if case.packed else case.batch))
    return (case.heads, case.n) if case.packed else (case.batch, case.heads, case.n)


def unlayout_lse(spec: str, case: Case, lse: torch.Tensor) -> torch.Tensor:
    """The kernel's lse in the canonical layout: (B, H, N), or (H, T) for a packed case."""
    if spec == "flash_varlen" and not case.packed:
        lse = lse.reshape(case.heads, case.batch, case.n).transpose(0, 1)  # (H, B*N) -> (B, H, N)
    return lse


def extras(
    spec: str,
    case: Case,
    attn_mask: torch.Tensor | None,
    slopes: torch.Tensor | None,
    device: torch.device,
) -> dict[str, torch.Tensor]:
    """The tensors besides q, k, v that the kernel gets (and must leave as they were), by name."""
    given: dict[str, torch.Tensor] = {}
    if attn_mask is not None:
        given["attn_mask"] = attn_mask
    if slopes is not None:
        given["alibi_slopes"] = slopes.float()  # flash-attn takes float32 slopes
    if spec == "flash_varlen":
        for name, offsets in zip(("cu_seqlens_q", "cu_seqlens_k"), case.cu_seqlens, strict=True):
            given[name] = torch.as_tensor(offsets, dtype=torch.int32, device=device)
    return given


def invoke(
    spec: str,
    kernel: Callable[..., Any],
    case: Case,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    given: dict[str, torch.Tensor],
    want_lse: bool,
) -> Any:
    """Call ``kernel`` as ``spec``'s library would be called, with q, k, v in its layout; returns
    whatever the kernel returned."""
    gqa = case.kv_heads != case.heads
    if spec == "sdpa":
        kwargs: dict[str, Any] = {
            "attn_mask": given.get("attn_mask"),
            "dropout_p": case.dropout_p,
            "is_causal": case.causal,
            "scale": case.scale,
        }
        if gqa:
            kwargs["enable_gqa"] = True
        return kernel(q, k, v, **kwargs)
    if spec in ("flash", "flash_varlen"):
        kwargs = _flash_keywords(case, given.get("alibi_slopes"), want_lse)
        if spec == "flash":
            return kernel(q, k, v, **kwargs)
        lengths = case.seqlens or ((case.n, case.m),)
        return kernel(
            q,
            k,
            v,
            given["cu_seqlens_q"],
            given["cu_seqlens_k"],
            max(n for n, _ in lengths),
            max(m for _, m in lengths),
            **kwargs,
        )
    if spec == "flex":
        kwargs = flex_mods(case, given.get("attn_mask"), given.get("alibi_slopes"), q.device)
        if case.scale is not None:
            kwargs["scale"] = case.scale
        if gqa:
            kwargs["enable_gqa"] = True
        if want_lse:
            kwargs.update(_flex_lse_request())
        with warnings.catch_warnings():
            # Eager FlexAttention warns on every new shape that it runs unfused: known, and what
            # a forward-only check of it on CPU means.
            warnings.filterwarnings("ignore", message=".*flex_attention called without torch")
            return kernel(q, k, v, **kwargs)
    raise ValueError(f"spec {spec!r} is not called in-process")


def split_result(spec: str, result: Any, want_lse: bool) -> tuple[Any, Any]:
    """(out, lse) from what the kernel returned; lse None when not asked for. A result that is
    not shaped as the library's raises ``TypeError`` saying what was expected."""
    if not want_lse:
        if spec == "flash" or spec == "flash_varlen":
            return (result[0] if isinstance(result, (tuple, list)) else result), None
        return result, None
    if not isinstance(result, (tuple, list)) or len(result) < 2:
        raise TypeError(
            f"asked for lse, the kernel returned {type(result).__name__}; the {spec} spec "
            "expects a tuple (out, lse, ...)"
        )
    out, lse = result[0], result[1]
    return out, getattr(lse, "lse", lse)  # torch 2.13's AuxOutput holds lse as a field


def _flash_keywords(case: Case, slopes: torch.Tensor | None, want_lse: bool) -> dict[str, Any]:
    """flash-attn's keywords that differ from their defaults. ``window_size`` uses -1 for an
    unbounded side; under causal the right side is 0 (what flash-attn sets itself)."""
    kwargs: dict[str, Any] = {}
    if case.dropout_p:
        kwargs["dropout_p"] = case.dropout_p
    if case.scale is not None:
        kwargs["softmax_scale"] = case.scale
    if case.causal:
        kwargs["causal"] = True
    if case.window is not None:
        left, right = case.window
        right = 0 if case.causal and right is None else right
        kwargs["window_size"] = (-1 if left is None else left, -1 if right is None else right)
    if case.softcap:
        kwargs["softcap"] = case.softcap
    if slopes is not None:
        kwargs["alibi_slopes"] = slopes
    if want_lse:
        kwargs["return_attn_probs"] = True
    return kwargs


@functools.cache
def _flex_module() -> Any:
    from torch.nn.attention import flex_attention

    return flex_attention


def _flex_lse_request() -> dict[str, Any]:
    """How the installed torch's ``flex_attention`` is asked for lse."""
    module = _flex_module()
    if "return_aux" in inspect.signature(module.flex_attention).parameters:
        return {"return_aux": module.AuxRequest(lse=True)}
    return {"return_lse": True}


def flex_mods(
    case: Case, attn_mask: torch.Tensor | None, slopes: torch.Tensor | None, device: torch.device
) -> dict[str, Any]:
    """``score_mod`` and ``block_mask`` expressing ``case`` for FlexAttention (only those needed).

    score_mod: softcap, then ALiBi ``- slope * |p_i - j|``, then the finite part of a float mask.
    block_mask (``create_block_mask``): causal and the window on p_i, a bool mask, and the -inf
    entries of a float mask (hidden, as the golden hides them).
    """
    b, h, n, m = case.batch, case.heads, case.n, case.m
    offset = m - n if case.align == "bottom-right" else 0
    bias = allowed = None
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        allowed = attn_mask.expand(b, h, n, m)
    elif attn_mask is not None:
        allowed = ~torch.isneginf(attn_mask).expand(b, h, n, m)
        bias = torch.where(allowed, attn_mask.expand(b, h, n, m), 0.0)
    rates = None
    if slopes is not None:  # float32 numbers, kept in float64: the bias is formed in float64
        # and rounded to float32 or the scores' dtype if wider (formed in float32, a float64
        # kernel's -slope * |p_i - j| carried 1e-8 of rounding: the float64 calibration)
        rates = (slopes.expand(b, h) if slopes.ndim == 1 else slopes).double()
    cap = case.softcap
    left, right = case.window if case.window is not None else (None, None)
    if case.causal:
        right = 0 if right is None else min(right, 0)
    result: dict[str, Any] = {}
    if cap or rates is not None or bias is not None:

        def score_mod(score: Any, bi: Any, hi: Any, row: Any, col: Any) -> Any:
            if cap:
                score = cap * torch.tanh(score / cap)
            if rates is not None:
                at_least_float32 = torch.promote_types(score.dtype, torch.float32)
                score = score - (rates[bi, hi] * (row + offset - col).abs()).to(at_least_float32)
            if bias is not None:
                score = score + bias[bi, hi, row, col]
            return score

        result["score_mod"] = score_mod
    if allowed is not None or left is not None or right is not None:

        def mask_mod(bi: Any, hi: Any, row: Any, col: Any) -> Any:
            seen = col >= 0  # all True, in the index's type
            if left is not None:
                seen = seen & (col >= row + offset - left)
            if right is not None:
                seen = seen & (col <= row + offset + right)
            if allowed is not None:
                seen = seen & allowed[bi, hi, row, col]
            return seen

        per_head = allowed is not None
        result["block_mask"] = _flex_module().create_block_mask(
            mask_mod, b if per_head else None, h if per_head else None, n, m, device=device
        )
    return result
