"""Prefill over pages: ragged queries of B sequences, packed on one axis, against keys in a pool of
pages (``paged_prefill_forward``), and the same attention split at a prefix of pages that every
sequence shares (``cascade_prefill_forward``). The reference of FlashInfer's
``BatchPrefillWithPagedKVCacheWrapper`` and vLLM's attention backends, whose conventions
``serving.py`` puts on top; at one query per sequence it is the decode step
(``paged.kvcache_attention_forward``).

Sequence b owns query rows qo_indptr[b]:qo_indptr[b + 1] (n_b of them) and kv_lens[b] keys, its
queries' own tokens included (already in the cache): key t lies in page block_table[b, t // P]
at slot t % P. Query i sits at p_i = kv_lens[b] - n_b + i (bottom-right): causal sees j <= p_i,
``window_left`` w also j >= p_i - w. Every score rule is the one score pipeline's
(``functional.attention_forward`` with ``align="bottom-right"``), called per sequence on the keys
[lo, kv_lens[b]) it can see, read by ``pages.read_tokens`` (a view when the pages are
consecutive): any suffix of the key axis aligned bottom-right keeps p_i where it is, so the read
is exact.

The cascade: when the first prefix_len keys (whole pages) are the same pages for every sequence
and lie before every query, no mask touches them, so one attention of all T queries over them,
unmasked, is the same for every sequence; the attention over each sequence's own keys [prefix_len,
kv_lens[b]), causal and aligned bottom-right, is the rest; the two are disjoint key sets, so
``merge.merge_attention_forward`` of the two gives the attention over all, exactly (up to
rounding). Sinks join the prefix part, so that they count once.

Forward only: serving kernels have no backward (the gradient is ``attention_backward`` of the same
attention on the gathered keys, as for the decode step).

Shape legend: T packed query tokens, B sequences, n_b the queries of sequence b, H query heads,
H_kv key/value heads, D head width, Dv value head width, P page size.

Derivation: docs/decoding.md ("Prefill over pages and the serving APIs"); the merge:
docs/derivations/merge.md.
Tests: tests/numpy_attention/decode/test_prefill.py (against the dense core on each sequence's
gathered keys and against ``varlen``, in float64; one query per sequence against
``kvcache_attention_forward``; cascade against the plain call).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .. import validation
from ..functional import attention_forward
from ..grad_mode import no_grad
from ..merge import merge_attention_forward
from .checks import _integers
from .pages import read_tokens
from .serving_arguments import PrefillPlan, check_prefix, plan_prefill

__all__ = [
    "PrefillCall",
    "PrefillOutput",
    "attend_cascade",
    "attend_pages",
    "cascade_prefill_forward",
    "check_prefill",
    "paged_prefill_forward",
]


class PrefillOutput(NamedTuple):
    """What ``paged_prefill_forward`` returns: out (T, H, Dv) in q's dtype; lse (T, H), natural
    log, in the compute dtype (float32 for float16), -inf for a query with nothing to see (the
    sink logit with sinks), or None unless asked for."""

    out: np.ndarray
    lse: np.ndarray | None


class PrefillCall(NamedTuple):
    """A prefill's arrays and plan, checked."""

    plan: PrefillPlan
    q: np.ndarray  # (T, H, D)
    k_pages: np.ndarray  # (num_pages, P, H_kv, D)
    v_pages: np.ndarray  # (num_pages, P, H_kv, Dv)
    sinks: np.ndarray | None  # (H,)
    compute: np.dtype


def paged_prefill_forward(
    q: np.ndarray,
    k_pages: np.ndarray,
    v_pages: np.ndarray,
    *,
    qo_indptr: Any,
    block_table: Any,
    kv_lens: Any,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_left: int = -1,
    softcap: float = 0.0,
    sinks: np.ndarray | None = None,
    return_lse: bool = False,
) -> PrefillOutput:
    """Attention of B sequences' packed queries over their keys in pages.

    For each sequence b: O = softmax(S) V over keys [0, kv_lens[b]) of its pages, with the
    score pipeline of ``attention_forward`` aligned bottom-right (query i at p_i = kv_lens[b] -
    n_b + i).

    Args:
        q: (T, H, D) queries, sequence b's rows qo_indptr[b]:qo_indptr[b + 1].
        k_pages: (num_pages, P, H_kv, D) the key pool (NHD).
        v_pages: (num_pages, P, H_kv, Dv) the value pool.
        qo_indptr: (B + 1,) integers from 0 to T, never decreasing.
        block_table: (B, max_pages) integers: sequence b's key t is in page block_table[b, t //
            P], slot t % P; entries past the ceil(kv_lens[b] / P) it needs are never read.
        kv_lens: (B,) integers, each sequence's keys, its queries' own tokens included
            (n_b <= kv_lens[b]).
        softmax_scale: multiplies q k^T; default 1 / sqrt(D).
        causal: query i sees keys j <= p_i.
        window_left: w >= 0: query i also sees only keys j >= p_i - w (FlashInfer's
            window_left); -1 for none. Without causal the right side is unbounded.
        softcap: > 0 caps the scores, softcap * tanh(S / softcap); 0 = off.
        sinks: (H,) sink logits in q's dtype (``attention_forward``'s ``sinks``).
        return_lse: also return lse (T, H).

    Returns:
        ``PrefillOutput(out, lse)``: out (T, H, Dv) in q's dtype, lse (T, H) or None.

    Raises:
        TypeError, ValueError: naming the argument, the shapes or the sequence (more queries
            than keys, a length past the table, a page outside the pool).
    """
    call = check_prefill(
        q, k_pages, v_pages, qo_indptr, block_table, kv_lens, softmax_scale, causal,
        window_left, softcap, sinks, return_lse,
    )  # fmt: skip
    out, lse = attend_pages(call, call.plan.lo, sinks=call.sinks)
    return PrefillOutput(out, lse if return_lse else None)


def cascade_prefill_forward(
    q: np.ndarray,
    k_pages: np.ndarray,
    v_pages: np.ndarray,
    *,
    qo_indptr: Any,
    block_table: Any,
    kv_lens: Any,
    prefix_len: int,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_left: int = -1,
    softcap: float = 0.0,
    sinks: np.ndarray | None = None,
    return_lse: bool = False,
) -> PrefillOutput:
    """``paged_prefill_forward`` computed as a cascade: every query over the shared prefix
    [0, prefix_len), unmasked, merged with each sequence's attention over its keys [prefix_len,
    kv_lens[b]) under the causal rule. Equal to ``paged_prefill_forward`` up to rounding.

    Args:
        prefix_len: a multiple of P; the first prefix_len // P pages are the same in every row
            of block_table, and prefix_len <= kv_lens[b] - n_b for every sequence (the prefix
            lies before every query). With a window it must be 0.
        The others: as ``paged_prefill_forward``.

    Returns:
        ``PrefillOutput(out, lse)``, as ``paged_prefill_forward``.

    Raises:
        TypeError, ValueError: ``paged_prefill_forward``'s, and a prefix that is not whole
            pages, not shared by every row, past a sequence's first query, or with a window.
    """
    call = check_prefill(
        q, k_pages, v_pages, qo_indptr, block_table, kv_lens, softmax_scale, causal,
        window_left, softcap, sinks, return_lse,
    )  # fmt: skip
    prefix = check_prefix(call.plan, prefix_len, k_pages.shape[1])
    out, lse = attend_cascade(call, prefix)
    return PrefillOutput(out, lse if return_lse else None)


def check_prefill(
    q, k_pages, v_pages, qo_indptr, block_table, kv_lens, softmax_scale, causal, window_left,
    softcap, sinks, return_lse,
) -> PrefillCall:  # fmt: skip
    """Every argument of a prefill over pages checked: the arrays here (floating, one dtype,
    finite sinks), the rest by ``serving_arguments.plan_prefill``."""
    arrays = {
        "q": validation.float_array("q", q),
        "k_pages": validation.float_array("k_pages", k_pages),
        "v_pages": validation.float_array("v_pages", v_pages),
    }
    if sinks is not None:
        arrays["sinks"] = validation.float_array("sinks", sinks)
    dtype = validation.same_dtype(**arrays)
    plan = plan_prefill(
        q=arrays["q"].shape,
        k_pages=arrays["k_pages"].shape,
        v_pages=arrays["v_pages"].shape,
        qo_indptr=_integers(qo_indptr),
        block_table=_integers(block_table),
        kv_lens=_integers(kv_lens),
        softmax_scale=softmax_scale,
        causal=validation.flag("causal", causal),
        window_left=window_left,
        softcap=softcap,
        sinks=None if sinks is None else arrays["sinks"].shape,
    )
    if sinks is not None and not np.all(np.isfinite(arrays["sinks"])):
        raise ValueError("sinks must be finite logits (None for no sinks)")
    validation.flag("return_lse", return_lse)
    compute = np.dtype(np.float32) if dtype == np.float16 else dtype
    return PrefillCall(
        plan, arrays["q"], arrays["k_pages"], arrays["v_pages"], arrays.get("sinks"), compute
    )


def attend_pages(
    call: PrefillCall, lo: list[int], *, sinks: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """Each sequence's queries over its keys [lo[b], kv_lens[b]) with the plan's score options:
    out (T, H, Dv) in q's dtype, lse (T, H) in the compute dtype (rows of no sequence: 0, -inf)."""
    q, k_pages, v_pages, plan = call.q, call.k_pages, call.v_pages, call.plan
    out = np.zeros(q.shape[:2] + v_pages.shape[-1:], q.dtype)  # (T, H, Dv)
    lse = np.full(q.shape[:2], -np.inf, call.compute)  # (T, H)
    for b, pages in enumerate(plan.pages):
        start, stop = plan.starts[b], plan.starts[b + 1]
        if start == stop:
            continue
        table = np.asarray(pages, np.int64)
        # views, or gathered into this thread's two buffers, used up before the next sequence
        keys = read_tokens(k_pages, table, lo[b], plan.kv_lens[b], scratch=0)  # (M, H_kv, D)
        values = read_tokens(v_pages, table, lo[b], plan.kv_lens[b], scratch=1)
        with no_grad():  # forward only: nothing kept
            result = attention_forward(
                q[start:stop].swapaxes(0, 1)[None],  # (n_b, H, D) -> (1, H, n_b, D)
                keys.swapaxes(0, 1)[None],  # (M, H_kv, D) -> (1, H_kv, M, D), a view
                values.swapaxes(0, 1)[None],
                sinks=sinks,
                return_lse=True,
                **plan.options,
            )
        out[start:stop] = result.out[0].swapaxes(0, 1)  # (H, n_b, Dv) -> (n_b, H, Dv)
        if result.lse is not None:  # always: asked for
            lse[start:stop] = result.lse[0].T  # (H, n_b) -> (n_b, H)
    return out, lse


def attend_cascade(call: PrefillCall, prefix_len: int) -> tuple[np.ndarray, np.ndarray]:
    """The cascade of a checked call (``check_prefix`` passed): out (T, H, Dv) in q's dtype,
    lse (T, H) in the compute dtype."""
    q, plan = call.q, call.plan
    shared = np.asarray(plan.pages[0] if plan.pages else [], np.int64)
    keys = read_tokens(call.k_pages, shared, 0, prefix_len)  # (prefix_len, H_kv, D)
    values = read_tokens(call.v_pages, shared, 0, prefix_len)
    unmasked = {**plan.options, "causal": False, "window": None}
    with no_grad():
        head = attention_forward(
            q.swapaxes(0, 1)[None],  # (T, H, D) -> (1, H, T, D): every query, one call
            keys.swapaxes(0, 1)[None],  # (prefix_len, H_kv, D) -> (1, H_kv, prefix_len, D)
            values.swapaxes(0, 1)[None],
            sinks=call.sinks,  # once, here
            return_lse=True,
            **unmasked,
        )
    head_lse = np.full(q.shape[:2], -np.inf, call.compute)  # (T, H); always given: asked for
    if head.lse is not None:
        head_lse = head.lse[0].T  # (H, T) -> (T, H)
    tail_out, tail_lse = attend_pages(call, [max(lo, prefix_len) for lo in plan.lo], sinks=None)
    with no_grad():
        merged = merge_attention_forward(
            head.out[0].swapaxes(0, 1),
            head_lse,
            tail_out,
            tail_lse,  # (T, H, Dv), (T, H)
        )
    return merged.out, merged.lse
