"""The backends that call torch's fused kernels, what each refuses, and the rule of ``"auto"``.

``"sdpa"`` runs ``F.scaled_dot_product_attention`` and ``"flex"`` FlexAttention
(``torch.nn.attention.flex_attention``) on a call prepared by ``rules.prepare``; ``"triton"``
the project's own kernel (``torch_attention.triton``, whose limits it asks); ``"math"`` and
``"manual"`` (in ``functional``) take every call. A backend that cannot compute an option
exactly refuses the call (``refusal``) with a ``ValueError`` that names the option and the
backend, before any work; ``choose`` ("auto") takes the first backend of ``AUTO_ORDER`` that
refuses nothing, so it never picks one that would refuse. docs/torch-backends.md has the
measurements behind the order and what each backend supports.

Shape legend: B batch, H query heads, H_kv key/value heads, N query length, M key length, D head
width, Dv value head width; "..." any leading axes of q, the last of them the heads axis H.

Derivation: docs/derivations/sinks.md and merge.md (the sinks folded into FlexAttention's
result). Tests: tests/torch_attention/test_backends.py, and test_functional_options.py (each
backend's results, option by option); the triton backend's refusals and "auto" rule:
tests/torch_attention/triton/test_launch.py.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from . import masks, scores
from .merge import merge_attention
from .rules import ScoreRules

# "auto" takes the first of these that supports the call, by whether a backward will follow.
# SDPA's fused kernels are the fastest where they fit. Behind it, with a backward, "manual"
# (its backward reuses the saved probabilities) was measured faster than autograd's "math";
# without one the two run the same forward and "math" skips the autograd.Function. FlexAttention
# runs unfused outside torch.compile (it materializes the scores) and was measured slower than
# "math" on CPU, so it is never picked (docs/torch-backends.md, "Speed"). "triton" is picked on
# CUDA only, for the calls SDPA refuses (softcap, sinks, lse, ALiBi in half precision): a fused
# kernel there instead of the (N, M) probabilities of "manual" (docs/triton-kernel.md).
AUTO_ORDER = {True: ("sdpa", "triton", "manual"), False: ("sdpa", "triton", "math")}
# Where "auto" may pick each backend; every device if not listed. The Triton kernel runs on CPU
# only under its interpreter, which is for tests: far too slow to pick.
AUTO_DEVICES = {"triton": ("cuda",)}

_HALF = (torch.float16, torch.bfloat16)


class Call(NamedTuple):
    """What decides which backends can compute a call."""

    rules: ScoreRules
    return_lse: bool
    dtype: torch.dtype
    device: torch.device
    needs_grad: bool  # grad mode is on and an input requires grad
    widths: tuple[int, int] = (0, 0)  # (D, Dv), the head widths of q and v


def refusal(backend: str, call: Call) -> str | None:
    """Why ``backend`` cannot compute ``call`` exactly, or None when it can."""
    if backend == "sdpa":
        return _sdpa_refusal(call)
    if backend == "flex":
        return _flex_refusal(call)
    if backend == "triton":
        return _triton_refusal(call)
    return None


def check(backend: str, call: Call) -> str:
    """``backend`` if it can compute ``call``; else a ``ValueError`` saying why."""
    reason = refusal(backend, call)
    if reason is not None:
        raise ValueError(f"backend={backend!r} cannot compute this call: {reason}")
    return backend


def choose(call: Call) -> str:
    """The backend ``"auto"`` runs: the first of ``AUTO_ORDER[call.needs_grad]`` that may run on
    the call's device (``AUTO_DEVICES``) and refuses nothing."""
    order = [
        backend
        for backend in AUTO_ORDER[call.needs_grad]
        if call.device.type in AUTO_DEVICES.get(backend, (call.device.type,))
    ]
    return next(backend for backend in order if refusal(backend, call) is None)


def all_finite(*tensors: torch.Tensor | None) -> bool:
    """Whether every given tensor is free of NaN and inf (one host sync on an accelerator)."""
    return all(bool(torch.isfinite(t).all()) for t in tensors if t is not None)


# -- sdpa -------------------------------------------------------------------------------------


def _sdpa_refusal(call: Call) -> str | None:
    rules = call.rules
    others = "use 'math', 'manual' or 'flex'"
    if rules.softcap:
        return f"softcap (SDPA has no score modifier); {others}"
    if rules.sinks is not None:
        return f"sinks (SDPA has no extra logit in the softmax); {others}"
    if call.return_lse:
        return f"return_lse (SDPA returns no log-sum-exp); {others}"
    if rules.keep is not None:
        return "an explicit dropout_mask (SDPA draws its own); use 'math' or 'manual'"
    if rules.slopes is not None and call.dtype in _HALF:
        return (
            f"alibi_slopes in {call.dtype} (SDPA takes its float mask in the inputs' dtype, "
            f"where -slope * |p_i - j| loses whole logits at long range); {others}"
        )
    if rules.group > 1 and not _sdpa_has_gqa():
        return f"enable_gqa with H != H_kv (this torch's SDPA has no enable_gqa); {others}"
    return None


def _sdpa_has_gqa() -> bool:
    """Whether this torch's SDPA takes ``enable_gqa`` (added in torch 2.5)."""
    return torch.torch_version.TorchVersion(torch.__version__) >= "2.5"


def sdpa_is_causal(rules: ScoreRules) -> bool:
    """Whether ``sdpa`` hands the call's band to SDPA's own ``is_causal``: top-left causal alone
    (no window, mask or ALiBi), with a scale that is positive in the compute dtype.

    A scale that is 0 or negative there (0.0, -1.0, or 1e-300 in float32) takes the mask
    route instead. Measured on CPU (torch 2.13): SDPA with ``is_causal=True`` and such a scale
    returns NaN in out (and in dv; in dq and dk too for a negative scale or half inputs), in
    float32, float64, float16 and bfloat16 alike, with the scale rounded to float32 for all but
    float64 (7e-46 fails in float32, 7.1e-46 does not); a positive scale, however tiny, is
    right, and so is the same call with an explicit causal mask, or with no mask. That is what a
    kernel that scales its hidden -inf scores gives (-inf * 0 is NaN, -inf * -1 is +inf). CUDA's
    kernels were not measured; the rule holds on every device (docs/torch-backends.md).
    """
    is_causal = rules.left is None and rules.right == 0 and rules.offset == 0
    is_causal = is_causal and rules.allowed is None and rules.bias is None
    is_causal = is_causal and rules.slopes is None and rules.chunk is None
    return is_causal and torch.tensor(rules.scale, dtype=rules.compute).item() > 0


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rules: ScoreRules) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` with our masks, and 0 on rows with nothing to attend to.

    Top-left causal alone uses SDPA's own ``is_causal`` (never a fully masked row) where the
    scale allows it (``sdpa_is_causal``); any other band (bottom-right, windows) and mask becomes
    one SDPA ``attn_mask``, ALiBi is added to its float part. Called with finite inputs only:
    non-finite ones take the plain path, which keeps the edge rules (SDPA's fused CPU kernel
    turns a NaN query row into 0, adds its mask to a hidden NaN score, and a fused kernel may
    skip the hidden values that the reference multiplies by exact zeros).
    """
    is_causal = sdpa_is_causal(rules)
    sdpa_mask, row_valid = None, None
    if not is_causal:
        bias = rules.bias
        if rules.slopes is not None:
            rows = torch.arange(rules.n, device=q.device)[:, None]
            cols = torch.arange(rules.m, device=q.device)[None, :]
            alibi = -rules.slopes * scores.distance(rules, rows, cols)  # (..., H, N, M)
            bias = alibi if bias is None else bias + alibi
        bias = None if bias is None else bias.to(q.dtype)
        sdpa_mask, row_valid = masks.to_sdpa(scores.visible(rules, q.device), bias)
    gqa = {"enable_gqa": True} if rules.group > 1 else {}
    out = F.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=sdpa_mask,
        dropout_p=rules.dropout_p,
        is_causal=is_causal,
        scale=rules.scale,
        **gqa,
    )
    return out if row_valid is None else out.masked_fill(~row_valid, 0.0)


# -- triton -----------------------------------------------------------------------------------


def _triton_refusal(call: Call) -> str | None:
    rules = call.rules
    others = "use 'sdpa', 'flex', 'manual' or 'math'"
    if rules.chunk is not None:
        return f"chunk_size (the Triton kernel masks a band, not chunks); {others}"
    if rules.allowed is not None or rules.bias is not None:
        return (
            "attn_mask and key_padding_mask (the Triton kernel reads no mask tensor, as "
            f"flash-attn's kernels read none); {others}"
        )
    if rules.keep is not None:
        return (
            "an explicit dropout_mask (the Triton kernel draws its own keep-mask from a seed); "
            "use 'manual' or 'math'"
        )
    launch = _triton_launch()
    if launch is None:
        return f"Triton is not installed (pip install 'attention-parity[triton]'); {others}"
    reason: str | None = launch.limit_refusal(call.device, call.dtype, *call.widths)
    return None if reason is None else f"{reason}; {others}"


@functools.cache
def _triton_launch() -> Any:
    """``torch_attention.triton.launch``, or None where Triton is not installed."""
    try:
        from .triton import launch
    except ImportError:
        return None
    return launch


# -- flex -------------------------------------------------------------------------------------


def _flex_refusal(call: Call) -> str | None:
    others = "use 'math' or 'manual'"
    if _flex_module() is None:
        return f"FlexAttention needs torch >= 2.5 (torch.nn.attention.flex_attention); {others}"
    if call.rules.dropout_p > 0.0:
        return f"dropout (FlexAttention has none); {others}"
    if call.needs_grad and call.device.type == "cpu":
        return (
            "a call that requires grad on CPU (FlexAttention has no CPU backward); run it "
            f"under torch.no_grad() or with inputs that do not require grad, or {others}"
        )
    return None


@functools.cache
def _flex_module() -> Any:
    """``torch.nn.attention.flex_attention``, or None where this torch has no FlexAttention."""
    try:
        from torch.nn.attention import flex_attention
    except ImportError:
        return None
    return flex_attention


def flex(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rules: ScoreRules
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlexAttention on the prepared call: out (..., H, N, Dv) and lse (..., H, N).

    Softcap, ALiBi and the float mask go into ``score_mod``, the band (causal, windows) and the
    bool masks into ``mask_mod`` and its ``block_mask``; both call the rules of ``scores.py``.
    Leading axes are flattened into FlexAttention's batch axis, (G, H, N, D). Sinks are merged
    into the result through lse: with s the sink, lse' = logaddexp(lse, s) and out' = out *
    exp(lse - lse') (the sink is an extra key with no value). A problem with no queries or no
    keys never reaches the kernel: its result is known (empty, or 0 with lse -inf).
    """
    lead, n, m = tuple(q.shape[:-2]), rules.n, rules.m
    if n == 0 or m == 0:
        out = q.new_zeros(lead + (n, v.shape[-1]))
        lse = torch.full(lead + (n,), float("-inf"), dtype=rules.compute, device=q.device)
        return out, _merge_sinks(out, lse, rules)[1]
    if not torch.is_grad_enabled():  # FlexAttention refuses CPU tensors that require grad, even
        q, k, v = q.detach(), k.detach(), v.detach()  # under no_grad, where no graph is built
    heads = lead[-1] if lead else 1
    q4, k4, v4 = (
        t.reshape((-1, t.shape[-3] if t.ndim > 2 else 1) + t.shape[-2:]) for t in (q, k, v)
    )
    batch = q4.shape[0]

    def full(t: torch.Tensor) -> torch.Tensor:  # broadcasting on (..., H, N, M) -> (G, H, N, M)
        return t.expand(lead + (n, m)).reshape(batch, heads, n, m)

    slopes = (
        None if rules.slopes is None else rules.slopes.expand(lead + (1, 1)).reshape(batch, heads)
    )
    bias = None if rules.bias is None else full(rules.bias)
    allowed = None if rules.allowed is None else full(rules.allowed)
    starts = (  # chunk_start per flattened batch index and head, (G, H)
        None
        if rules.chunk_start is None
        else rules.chunk_start[..., 0, 0].expand(lead).reshape(batch, heads)
    )

    def score_mod(score: Any, b: Any, h: Any, row: Any, col: Any) -> Any:
        score = scores.cap(score, rules.softcap)
        if slopes is not None:
            score = score - slopes[b, h] * scores.distance(rules, row, col)
        if bias is not None:
            score = score + bias[b, h, row, col]
        return score

    def mask_mod(b: Any, h: Any, row: Any, col: Any) -> Any:
        visible = scores.band(rules, row, col, None if starts is None else starts[b, h])
        if allowed is not None:
            visible = (
                allowed[b, h, row, col] if visible is None else visible & allowed[b, h, row, col]
            )
        return visible

    module = _flex_module()
    block_mask = None
    band = rules.left is not None or rules.right is not None or rules.chunk is not None
    if allowed is not None or band:
        per_head = allowed is not None or starts is not None
        block_mask = module.create_block_mask(
            mask_mod,
            batch if per_head else None,
            heads if per_head else None,
            n,
            m,
            device=q.device,
        )
    lse_request = (
        {"return_aux": module.AuxRequest(lse=True)}
        if "return_aux" in inspect.signature(module.flex_attention).parameters
        else {"return_lse": True}
    )
    with warnings.catch_warnings():
        # Outside torch.compile FlexAttention warns that it runs unfused; that is measured and
        # documented (docs/torch-backends.md), not news to the caller on every call.
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile")
        out4, aux = module.flex_attention(
            q4,
            k4,
            v4,
            score_mod=score_mod if _has_score_mod(rules) else None,
            block_mask=block_mask,
            scale=rules.scale,
            enable_gqa=rules.group > 1,
            **lse_request,
        )
    lse4 = getattr(aux, "lse", aux)
    out = out4.reshape(lead + (n, v.shape[-1]))
    lse = lse4.to(rules.compute).reshape(lead + (n,))
    return _merge_sinks(out, lse, rules)


def _has_score_mod(rules: ScoreRules) -> bool:
    return bool(rules.softcap) or rules.slopes is not None or rules.bias is not None


def _merge_sinks(
    out: torch.Tensor, lse: torch.Tensor, rules: ScoreRules
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fold the sinks into a result computed without them. A sink is a key set of one logit s
    and a zero value, so the result is the merge (``merge.merge_attention``) of (out, lse) with
    (0, s): lse' = logaddexp(lse, s), out' = out * exp(lse - lse'). A row with nothing else to
    see keeps out 0 and gets lse' = s."""
    if rules.sinks is None:
        return out, lse
    sink_lse = rules.sinks[..., 0].expand(lse.shape)  # (H, 1) -> (..., H, N)
    return merge_attention(out, lse, torch.zeros_like(out), sink_lse)
