"""What a decode kernel is judged against: the inputs of a decode case in the kernel's dtype,
the float64 golden (``numpy_attention``'s ``kvcache_attention_forward`` on the inputs after their
cast, the caches after its own in-place append included) and the plain same-dtype baseline (the
spec's ``baseline``: ``golden.decode_baseline``), both cached per (case, dtype, device, seed) and
shared by every kernel checked.

Shape legend: B sequences, s_q queries and s_new new tokens per sequence, H query heads, H_kv
key/value heads, D head width, Dv value head width, P page size.

Tests: tests/checker/running/test_decode.py (the golden of each case, the other rotary
convention), tests/checker/golden/test_decode_baseline.py
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch

from numpy_attention.decode.paged import kvcache_attention_forward, rotate_new_tokens

from ..battery.decode.case import DecodeCase, make_decode_inputs
from . import DTYPES, stored, to64

if TYPE_CHECKING:
    from ..spec import Spec

CACHES = ("k_cache", "v_cache")


# Both caches hold a whole battery in every dtype (~30 cases x 4), so that each case's golden and
# baseline are computed once per seed however many kernels are checked (the pitfalls, in the
# calibration); a decode case's arrays are small (the largest, FlashMLA's, ~2 MB).
@functools.lru_cache(maxsize=512)
def decode_inputs(
    case: DecodeCase, dtype: str, device: torch.device, seed: int
) -> dict[str, torch.Tensor]:
    """The arguments of a case as tensors: floats in the kernel's dtype (ALiBi slopes float32),
    integers int32; shared by every kernel checked, which only ever gets copies."""
    drawn = make_decode_inputs(case, seed)
    tensors = {}
    for name, array in drawn._asdict().items():
        if array is None:
            continue
        tensor = torch.from_numpy(np.ascontiguousarray(array)).to(device)
        if array.dtype.kind == "f":
            tensor = tensor.to(torch.float32 if name == "alibi_slopes" else DTYPES[dtype])
        tensors[name] = tensor
    return tensors


class Expected(NamedTuple):
    """Golden and baseline of a case (dicts of float64 arrays: out, lse, k_cache, v_cache after
    the call, and ``lse_shifted`` where flash-attn's causal ALiBi convention applies), and the
    cache slots the new tokens go to, (pool pages, P) bool."""

    golden: dict[str, np.ndarray]
    baseline: dict[str, np.ndarray]
    new_slots: np.ndarray | None


@functools.lru_cache(maxsize=512)
def decode_expected(
    spec: Spec, case: DecodeCase, dtype: str, device: torch.device, seed: int
) -> Expected:
    """The golden and the baseline of a case (cached). With rotary, the golden rotates q and the
    new keys in float64 and rounds them once to the kernel's dtype before attending: the cache
    stores the keys in its dtype (every kernel must round them) and flash-attn's kernel reads
    the rotated query in it too, so that rounding is storage, not the kernel's error. Measured
    without it: the torch twin, rounding as flash-attn does, exceeded the float16 bound on 2 of
    60 seeds (4.7x the baseline, where softcap bends logits of 30; docs/decoding.md). A kernel
    may keep the rotated query unrounded instead: the golden of that convention is kept too
    (``out_exact_q``, ``lse_exact_q``), and either passes."""
    inputs = decode_inputs(case, dtype, device, seed)
    arrays = {
        name: to64(t) if t.is_floating_point() else t.cpu().numpy() for name, t in inputs.items()
    }
    if case.latent:
        arrays["v_cache"] = arrays["k_cache"][..., : case.dv]  # FlashMLA's V: K's first Dv
    golden_caches = {name: arrays[name].copy() for name in CACHES}
    options = _golden_options(case, arrays)
    q, exact_q = arrays["q"], None
    if case.rotary != "none":  # rotated exactly, then stored in the kernel's dtype (see above)
        exact_q, k = rotate_new_tokens(
            q, options["k"], options.pop("rotary_cos"), options.pop("rotary_sin"),
            options["cache_seqlens"], moves=case.causal or case.window is not None,
            interleaved=options.pop("rotary_interleaved"),
        )  # fmt: skip
        q, options["k"] = stored(exact_q, dtype), stored(k, dtype)
    result = kvcache_attention_forward(
        q, golden_caches["k_cache"], golden_caches["v_cache"], **options, return_lse=True
    )
    golden = {"out": result.out, "lse": np.asarray(result.lse, np.float64), **golden_caches}
    if exact_q is not None and dtype != "float64":  # the other convention: q kept unrounded
        caches = {name: arrays[name].copy() for name in CACHES}
        other = kvcache_attention_forward(exact_q, *caches.values(), **options, return_lse=True)
        golden["out_exact_q"], golden["lse_exact_q"] = other.out, np.asarray(other.lse)
    shifted = _flash_alibi_shift(case, arrays)
    if shifted is not None:
        golden["lse_shifted"] = golden["lse"] + shifted
    given = {name: t.clone() for name, t in inputs.items()}  # the baseline writes in place
    out, lse, caches = spec.baseline(case, given)
    baseline = {"out": to64(out), "lse": to64(lse), **{n: to64(t) for n, t in caches.items()}}
    return Expected(golden, baseline, _new_slots(case, arrays))


def _golden_options(case: DecodeCase, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    names = ("k", "v", "rotary_cos", "rotary_sin", "cache_batch_idx", "cache_leftpad",
             "block_table", "alibi_slopes")  # fmt: skip
    options: dict[str, Any] = {name: arrays[name] for name in names if name in arrays}
    options.update(
        cache_seqlens=arrays["cache_seqlens"].astype(np.int64),
        softmax_scale=case.scale,
        causal=case.causal,
        window_size=case.window or (-1, -1),
        softcap=case.softcap,
        rotary_interleaved=case.rotary == "interleaved",
    )
    return options


def _flash_alibi_shift(case: DecodeCase, arrays: dict[str, np.ndarray]) -> np.ndarray | None:
    """slope_h * p_i with p_i counted from the first visible key (cache_leftpad), what
    flash-attn's lse adds under causal ALiBi (its causal path drops that per-row constant;
    docs/derivations/alibi.md), (B, H, s_q); None where the convention does not apply."""
    slopes = arrays.get("alibi_slopes")
    if slopes is None or not case.causal or case.window is not None:
        return None
    rows = []
    for b, length in enumerate(case.seqlens):
        rate = slopes if slopes.ndim == 1 else slopes[b]  # (H,)
        lo = 0 if case.leftpad is None else case.leftpad[b]
        p = length + case.s_new - lo - case.s_q + np.arange(case.s_q)  # (s_q,)
        rows.append(rate[:, None] * p[None, :])
    return np.stack(rows)


def _new_slots(case: DecodeCase, arrays: dict[str, np.ndarray]) -> np.ndarray | None:
    """(pool pages, P) bool: the slots the new tokens are written to; None without new tokens."""
    if not case.s_new:
        return None
    slots = np.zeros(arrays["k_cache"].shape[:2], dtype=bool)
    size = slots.shape[1]
    for b, start in enumerate(case.seqlens):
        if "block_table" in arrays:
            pages = arrays["block_table"][b]
        else:
            row = b if "cache_batch_idx" not in arrays else arrays["cache_batch_idx"][b]
            pages = np.array([row])
        positions = np.arange(start, start + case.s_new)
        slots[pages[positions // size], positions % size] = True
    return slots
