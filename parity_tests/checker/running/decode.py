"""The decode specs: a kernel with ``flash_attn_with_kvcache``'s or ``flash_mla_with_kvcache``'s
signature called on a decode case and judged, by the policy of every spec, on out, lse and the
caches it leaves behind.

- "flash_kvcache": ``kernel(q, k_cache, v_cache, k=None, v=None, rotary_cos=None,
  rotary_sin=None, cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None,
  block_table=None, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
  rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False)``, called
  with ``cache_seqlens`` and only the arguments that differ from these defaults; returns out
  (B, s_q, H, Dv), or (out, lse (B, H, s_q)) with ``return_softmax_lse=True``.
- "flash_mla": ``kernel(q, k_cache, block_table, cache_seqlens, head_dim_v,
  tile_scheduler_metadata, num_splits, softmax_scale=None, causal=False)``, the metadata and
  num_splits from the user's hook ``mla_metadata(cache_seqlens, s_q * H // H_kv, H_kv)``
  (FlashMLA's ``get_mla_metadata``), or None and None without one; returns (out, lse).

Integers (lengths, tables, indices) are int32 and ALiBi slopes float32, as flash-attn takes
them. The golden is ``numpy_attention.paged.kvcache_attention_forward`` in float64 on the inputs
after their cast (the caches after its own in-place append included); the baseline is
``checker.decode_reference`` in the kernel's dtype. Rows per case and dtype: "out"; "lse" where
the kernel claims the feature (float32 for half inputs; under causal ALiBi flash-attn's
convention, which drops the per-row constant, is accepted as for the "flash" spec); with new
tokens, "k_cache" and "v_cache": the slots they go to judged against the golden's (rotated keys)
by the same bound, and any other slot that changed fails the row, however little; every other
argument (and the caches without new tokens) must be left as it was ("inplace" rows).

Shape legend: B sequences, s_q queries and s_new new tokens per sequence, H query heads, H_kv
key/value heads, D head width, Dv value head width, P page size.

Tests: tests/checker/running/test_decode.py
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from numpy_attention.paged import kvcache_attention_forward, rotate_new_tokens

from ..battery.decode_case import DecodeCase, make_decode_inputs, resolve_decode
from ..golden.decode_baseline import plain_kvcache, plain_mla
from ..golden.expected import DTYPES, to64
from ..judge.policy import judge_lse, judge_tensor, unmeasured, wrong_dtype
from ..report.rows import KernelError, KernelReport, KernelRow
from .calls import BadResult, Outcome, failed_row, run_protected

Kernel = Callable[..., Any]
CACHES = ("k_cache", "v_cache")


class DecodeRequest(NamedTuple):
    """One decode call to make and judge."""

    spec: str
    case: DecodeCase
    dtype: str
    device: torch.device
    seed: int
    want_lse: bool
    mla_metadata: Callable[..., Any] | None = None


def check_decode(
    kernel: Kernel,
    spec: str,
    claimed: frozenset[str],
    device: torch.device,
    dtypes: Sequence[str],
    cases: Any,
    seed: int,
    progress: Callable[[str], None] | None = None,
    mla_metadata: Callable[..., Any] | None = None,
) -> KernelReport:
    """The report of ``kernel`` on the decode battery of ``spec`` (``check_kernel`` dispatches
    here; it has checked the kernel, spec, features, seed and dtypes)."""
    battery = resolve_decode(spec, cases)
    name = getattr(kernel, "__name__", repr(kernel))
    report = KernelReport(name, str(device), cases={case.name: case for case in battery})
    for case in battery:
        for dtype in dtypes:
            if progress is not None:
                progress(f"{name} {case.name} {dtype}")
            missing = case.needs - claimed
            if missing:
                detail = f"needs {', '.join(sorted(missing))}, not in the kernel's features"
                report.rows.append(unmeasured(case.name, dtype, "not-run", detail))
                continue
            request = DecodeRequest(spec, case, dtype, device, seed, "lse" in claimed, mla_metadata)
            report.rows.extend(judge_decode(request, run_decode(kernel, request), report.errors))
    return report


# -- the inputs, the golden and the baseline ----------------------------------------------------


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
def decode_expected(case: DecodeCase, dtype: str, device: torch.device, seed: int) -> Expected:
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
    if case.spec == "flash_mla":
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
        q, options["k"] = _stored(exact_q, dtype), _stored(k, dtype)
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
    if case.spec == "flash_mla":
        out, lse = plain_mla(**_mla_arguments(case, given, None))
        caches = {"k_cache": given["k_cache"], "v_cache": given["k_cache"][..., : case.dv]}
    else:
        q, k_cache, v_cache = given.pop("q"), given.pop("k_cache"), given.pop("v_cache")
        out, lse = plain_kvcache(q, k_cache, v_cache, **_kvcache_keywords(case, given, True))
        caches = {"k_cache": k_cache, "v_cache": v_cache}
    baseline = {"out": to64(out), "lse": to64(lse), **{n: to64(t) for n, t in caches.items()}}
    return Expected(golden, baseline, _new_slots(case, arrays))


def _stored(array: np.ndarray, dtype: str) -> np.ndarray:
    """A float64 array rounded to ``dtype`` (bfloat16 included, through torch) and back."""
    return to64(torch.from_numpy(array).to(DTYPES[dtype]))


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


# -- the call ---------------------------------------------------------------------------------


def _kvcache_keywords(case: DecodeCase, given: dict[str, torch.Tensor], lse: bool) -> dict:
    """flash_attn_with_kvcache's keywords that differ from their defaults (cache_seqlens always)."""
    kwargs: dict[str, Any] = {"cache_seqlens": given["cache_seqlens"]}
    for name in ("k", "v", "rotary_cos", "rotary_sin", "cache_batch_idx", "cache_leftpad",
                 "block_table", "alibi_slopes"):  # fmt: skip
        if name in given:
            kwargs[name] = given[name]
    if case.rotary in ("half", "partial"):
        kwargs["rotary_interleaved"] = False
    if case.scale is not None:
        kwargs["softmax_scale"] = case.scale
    if case.causal:
        kwargs["causal"] = True
    if case.window is not None:
        kwargs["window_size"] = case.window
    if case.softcap:
        kwargs["softcap"] = case.softcap
    if case.num_splits:
        kwargs["num_splits"] = case.num_splits
    if lse:
        kwargs["return_softmax_lse"] = True
    return kwargs


def _mla_arguments(
    case: DecodeCase, given: dict[str, torch.Tensor], hook: Callable[..., Any] | None
) -> dict[str, Any]:
    """flash_mla_with_kvcache's arguments, the metadata from the user's hook (or None)."""
    metadata, splits = None, None
    if hook is not None:
        metadata, splits = hook(given["cache_seqlens"], case.s_q * case.heads, case.heads_kv)
    arguments: dict[str, Any] = {
        "q": given["q"],
        "k_cache": given["k_cache"],
        "block_table": given["block_table"],
        "cache_seqlens": given["cache_seqlens"],
        "head_dim_v": case.dv,
        "tile_scheduler_metadata": metadata,
        "num_splits": splits,
        "softmax_scale": case.scale,
    }
    if case.causal:
        arguments["causal"] = True
    return arguments


def run_decode(kernel: Kernel, request: DecodeRequest) -> Outcome:
    """One case and dtype of ``kernel``: the call on copies of the inputs, the in-place checks;
    every failure of the kernel is an ``Outcome``, never an exception (but Ctrl-C)."""
    changed: list[KernelRow] = []
    value, failure = run_protected(lambda: _call(kernel, request, changed), changed)
    if failure is not None:
        return failure
    arrays, dtypes = value
    return Outcome("ok", arrays, dtypes, changed)


def _call(kernel: Kernel, request: DecodeRequest, changed: list[KernelRow]) -> tuple[dict, dict]:
    spec, case, dtype, device, seed, want_lse, hook = request
    inputs = decode_inputs(case, dtype, device, seed)
    given = {name: t.clone() for name, t in inputs.items()}
    cuda = [] if device.type != "cuda" else [device.index or torch.cuda.current_device()]
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(seed)
        if spec == "flash_mla":
            result = kernel(**_mla_arguments(case, given, hook))
        else:
            keywords = {n: t for n, t in given.items() if n not in ("q", *CACHES)}
            result = kernel(given["q"], given["k_cache"], given["v_cache"],
                            **_kvcache_keywords(case, keywords, want_lse))  # fmt: skip
    appended = case.s_new > 0
    for name, before in inputs.items():
        if appended and name in CACHES:
            continue  # judged slot by slot
        if not torch.equal(given[name], before):
            changed.append(_inplace_row(case.name, dtype, name, given[name], before))
    if spec == "flash_mla" or want_lse:
        if not isinstance(result, (tuple, list)) or len(result) < 2:
            what = f"{type(result).__name__}"
            raise BadResult(f"the kernel returned {what}, the {spec} spec expects (out, lse)")
        out, lse = result[0], result[1]
    else:
        out, lse = (result[0] if isinstance(result, (tuple, list)) else result), None
    _check_tensor("out", out, (case.batch, case.s_q, case.heads, case.dv))
    arrays, dtypes = {"out": to64(out)}, {"out": _name(out.dtype)}
    if want_lse:
        _check_tensor("lse", lse, (case.batch, case.heads, case.s_q))
        arrays["lse"], dtypes["lse"] = to64(lse), _name(lse.dtype)
    if appended:
        for name in CACHES:
            arrays[name], arrays[f"{name}_before"] = to64(given[name]), to64(inputs[name])
    return arrays, dtypes


def _check_tensor(name: str, value: Any, shape: tuple[int, ...]) -> None:
    if not isinstance(value, torch.Tensor) or tuple(value.shape) != shape:
        got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise BadResult(f"kernel returned {name} {got}, expected a tensor of shape {shape}")


def _inplace_row(case: str, dtype: str, name: str, after: torch.Tensor, before: torch.Tensor):
    if not before.is_floating_point():
        error = float((after != before).sum())
    else:
        error = (after.double() - before.double()).abs().max().item()
        error = error if math.isfinite(error) else math.inf
    nan = math.nan
    detail = f"{name} changed in place by the kernel"
    return KernelRow(case, dtype, name, error, nan, nan, 0.0, "inplace", detail)


# -- the verdict ------------------------------------------------------------------------------


def judge_decode(
    request: DecodeRequest, outcome: Outcome, errors: list[KernelError]
) -> list[KernelRow]:
    """The rows of one case and dtype from what the kernel gave."""
    case, dtype = request.case, request.dtype
    rows = list(outcome.changed)
    if outcome.kind != "ok":  # "skip", "refused" or "error"
        return rows + [failed_row(case.name, dtype, outcome.kind, outcome.message,
                                  outcome.error, errors)]  # fmt: skip
    golden, baseline, slots = decode_expected(case, dtype, request.device, request.seed)
    arrays = outcome.arrays
    row = judge_tensor(case.name, dtype, "out", arrays["out"], golden["out"], baseline["out"])
    row = _either(row, golden, "out", lambda gold: judge_tensor(
        case.name, dtype, "out", arrays["out"], gold, baseline["out"]))  # fmt: skip
    rows.append(_dtype_checked(row, outcome.dtypes["out"], dtype))
    if request.want_lse:
        row = judge_lse(case.name, dtype, arrays["lse"], golden["lse"], baseline["lse"],
                        golden.get("lse_shifted"))  # fmt: skip
        row = _either(row, golden, "lse", lambda gold: judge_lse(
            case.name, dtype, arrays["lse"], gold, baseline["lse"]))  # fmt: skip
        expected = "float32" if dtype in ("float16", "bfloat16") else dtype
        rows.append(_dtype_checked(row, outcome.dtypes["lse"], expected))
    if slots is not None:
        for name in CACHES:
            rows.append(_judge_cache(case.name, dtype, name, arrays, golden, baseline, slots))
    return rows


def _either(row: KernelRow, golden: dict, tensor: str, judge: Callable) -> KernelRow:
    """``row``, or where it fails and the golden has the other rotary convention (the rotated
    query kept unrounded: ``<tensor>_exact_q``), that convention's row when it passes, saying
    so."""
    other = golden.get(f"{tensor}_exact_q")
    if not row.failed or other is None:
        return row
    alternative = judge(other)
    if alternative.failed:
        return row
    return dataclasses.replace(alternative, detail="the rotated query kept unrounded")


def _judge_cache(case, dtype, name, arrays, golden, baseline, slots) -> KernelRow:
    """A cache after the call: every slot but the new tokens' exactly as before (else "fail",
    however small the change), the new ones within the bound of the golden's."""
    after, before = arrays[name], arrays[f"{name}_before"]
    changed = after != before  # (pool pages, P, H_kv, W); the inputs hold no NaN
    changed[slots] = False
    if changed.any():
        change = np.abs(after[changed] - before[changed])
        error = float(np.max(change)) if np.all(np.isfinite(change)) else math.inf
        nan = math.nan
        detail = "slots outside the new tokens' [cache_seqlens, cache_seqlens + s_new) changed"
        return KernelRow(case, dtype, name, error, nan, nan, 0.0, "fail", detail)
    return judge_tensor(case, dtype, name, after[slots], golden[name][slots], baseline[name][slots])


def _dtype_checked(row: KernelRow, got: str, expected: str) -> KernelRow:
    if got == expected:
        return row
    if row.tensor != "lse":
        return wrong_dtype(row, got)
    detail = f"lse is {got}, the libraries return {expected} for inputs of {row.dtype}"
    return dataclasses.replace(row, verdict="dtype", detail=detail)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
