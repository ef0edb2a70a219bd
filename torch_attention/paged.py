"""Decoding over a KV cache, contiguous or in pages, in torch: the twin of
``numpy_attention.paged`` (flash-attn's ``flash_attn_with_kvcache``, exactly, as
``kvcache_attention``; ``PagedKVCache``, a layer's page pool and block table), on any device.

The same semantics, checks and messages as the NumPy twin (docs/decoding.md): for sequence b with
L_b = cache_seqlens[b] + s_new keys, the new k, v (keys rotated at cache_seqlens[b] + i) are
written in place at [cache_seqlens[b], L_b) of its cache row or of its pages in table order;
queries (rotated at cache_seqlens[b] + i when causal or windowed, else at cache_seqlens[b]) sit
at p_i = L_b - s_q + i; keys before cache_leftpad[b] are hidden. Every score rule is
``functional.attention``'s with ``align="bottom-right"``, on the keys [lo, L_b) each sequence can
see. This is the kernel checker's built-in correct target of the "flash_kvcache" spec (behind
flash-attn's exact signature in ``parity_tests.checker.decode_kernels``); it gathers each
sequence's pages with one ``index_select``, for clarity rather than speed.

Dtypes: float16 and bfloat16 are rotated and attended in float32 (``functional.attention``'s
"math" rule) and returned in their dtype; lse float32. Lengths, tables and indices may live on
any device: they are read on the host (one sync per call), where the checks run.

Shape legend: B sequences, s_q queries and s_new new tokens per sequence, H query heads, H_kv
key/value heads, D head width, Dv value head width, P page size, L_b the keys of sequence b.

Derivation: docs/decoding.md. Tests: tests/torch_attention/test_paged.py (against the NumPy
twin in float64, on every dtype by the kernel checker's policy), tests/torch_attention/
test_grouped.py (the layer over pages), tests/checker/test_decode.py (the checker's verdict).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch

from . import validation
from .functional import attention
from .rope import rotate_pairs
from .scores import AttentionOutput

__all__ = ["KVCacheOutput", "PagedKVCache", "kvcache_attention"]

_HALF = (torch.float16, torch.bfloat16)


class KVCacheOutput(NamedTuple):
    """What ``kvcache_attention`` returns: out (B, s_q, H, Dv) in q's dtype, lse (B, H, s_q)
    (float32 for half inputs, natural log, -inf for a query with nothing to see) or None."""

    out: torch.Tensor
    lse: torch.Tensor | None


class _Call(NamedTuple):
    pages: list[list[int]]  # the pages of each sequence in order (contiguous: [row])
    seqlens: list[int]  # before the new tokens
    s_new: int
    lo: list[int]  # the first key any query of the sequence can see
    rotary: tuple[torch.Tensor, torch.Tensor] | None  # cos, sin (seqlen_ro, rotary_dim / 2)
    q_moves: bool  # rotate query i at seqlens + i (causal or windowed), else all at seqlens
    interleaved: bool
    options: dict[str, Any]  # functional.attention's keywords, but alibi_slopes
    slopes: torch.Tensor | None  # (H,) or (B, H)


def kvcache_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    *,
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    rotary_cos: torch.Tensor | None = None,
    rotary_sin: torch.Tensor | None = None,
    cache_seqlens: Any,
    cache_batch_idx: Any = None,
    cache_leftpad: Any = None,
    block_table: Any = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    alibi_slopes: torch.Tensor | None = None,
    return_lse: bool = False,
) -> KVCacheOutput:
    """flash-attn's ``flash_attn_with_kvcache``: append k, v to the cache in place, then attend;
    ``numpy_attention.paged.kvcache_attention_forward``'s twin (the same arguments, shapes and
    errors; tables and lengths as integer tensors, arrays or ints). Runs under
    ``torch.no_grad()``: a decode kernel has no backward.

    Returns:
        ``KVCacheOutput(out, lse)``: out (B, s_q, H, Dv) in q's dtype, lse (B, H, s_q) or None.
    """
    call = _check_call(
        q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
        cache_leftpad, block_table, softmax_scale, causal, window_size, softcap,
        rotary_interleaved, alibi_slopes, return_lse,
    )  # fmt: skip
    with torch.no_grad():
        q, k = _rotated(call, q, k)
        if k is not None and v is not None:
            for b in range(q.shape[0]):
                positions = list(range(call.seqlens[b], call.seqlens[b] + call.s_new))
                write_tokens(k_cache, call.pages[b], positions, k[b])
                write_tokens(v_cache, call.pages[b], positions, v[b])
        outs, lses = [], []
        for b in range(q.shape[0]):
            hi = call.seqlens[b] + call.s_new
            keys = read_tokens(k_cache, call.pages[b], call.lo[b], hi)  # (M, H_kv, D)
            values = read_tokens(v_cache, call.pages[b], call.lo[b], hi)  # (M, H_kv, Dv)
            slopes = call.slopes
            if slopes is not None and slopes.ndim == 2:
                slopes = slopes[b]
            result = attention(
                q[b].transpose(0, 1)[None],  # (s_q, H, D) -> (1, H, s_q, D)
                keys.transpose(0, 1)[None],  # (M, H_kv, D) -> (1, H_kv, M, D)
                values.transpose(0, 1)[None],
                alibi_slopes=slopes,
                return_lse=True,
                **call.options,
            )
            outs.append(result.out[0].transpose(0, 1))  # (H, s_q, Dv) -> (s_q, H, Dv)
            lses.append(result.lse[0])  # (H, s_q)
    if outs:
        out, lse = torch.stack(outs), torch.stack(lses)
    else:
        out = q.new_zeros(q.shape[:3] + v_cache.shape[-1:])
        lse = q.new_zeros((0, q.shape[2], q.shape[1]), dtype=_compute(q.dtype))
    return KVCacheOutput(out, lse if return_lse else None)


def _compute(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in _HALF else dtype


def _rotated(
    call: _Call, q: torch.Tensor, k: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """q and the new keys with their first rotary_dim coordinates rotated (in float32 for half
    inputs, then rounded to the inputs' dtype); unchanged without rotary."""
    if call.rotary is None or k is None:
        return q, k
    cos, sin = call.rotary
    width = 2 * cos.shape[-1]
    seqlens = torch.tensor(call.seqlens, device=q.device)[:, None]  # (B, 1)
    steps_q = torch.arange(q.shape[1], device=q.device)
    rotated = []
    for x, steps in ((q, steps_q if call.q_moves else 0 * steps_q), (k, None)):
        steps = torch.arange(x.shape[1], device=x.device) if steps is None else steps
        positions = seqlens + steps[None, :]  # (B, s)
        tables = cos[positions][:, :, None], sin[positions][:, :, None]  # (B, s, 1, rot / 2)
        part = x[..., :width].to(cos.dtype)
        turned = rotate_pairs(part, *tables, interleaved=call.interleaved)
        rotated.append(torch.cat([turned.to(x.dtype), x[..., width:]], dim=-1))
    return rotated[0], rotated[1]


def read_tokens(pool: torch.Tensor, pages: list[int], lo: int, hi: int) -> torch.Tensor:
    """Tokens [lo, hi) of the sequence whose pages, in order, are ``pages``, (hi - lo, H_kv, W),
    from the pool (num_pages, P, H_kv, W): the covering pages gathered in table order."""
    size = pool.shape[1]
    if hi <= lo:
        return pool[:0, :0].reshape((0,) + tuple(pool.shape[2:]))
    first, last = lo // size, -(-hi // size)
    ids = torch.tensor(pages[first:last], device=pool.device)
    tokens = pool.index_select(0, ids).reshape((-1,) + tuple(pool.shape[2:]))  # (pages * P, ...)
    return tokens[lo - first * size : hi - first * size]


def write_tokens(
    pool: torch.Tensor, pages: list[int], positions: list[int], tokens: torch.Tensor
) -> None:
    """Write ``tokens`` (len(positions), H_kv, W) at ``positions`` of the sequence whose pages
    are ``pages``, in place: position t goes to page pages[t // P], slot t % P."""
    size = pool.shape[1]
    index = torch.tensor([pages[t // size] for t in positions], device=pool.device)
    slots = torch.tensor([t % size for t in positions], device=pool.device)
    pool[index, slots] = tokens.to(pool.dtype)


def _check_call(
    q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
    cache_leftpad, block_table, softmax_scale, causal, window_size, softcap, rotary_interleaved,
    alibi_slopes, return_lse,
) -> _Call:  # fmt: skip
    """Every argument of ``kvcache_attention`` checked, before anything is written (the NumPy
    twin's checks and messages)."""
    tensors = {"q": q, "k_cache": k_cache, "v_cache": v_cache}
    if (k is None) != (v is None):
        raise ValueError("k and v are appended together: give both or neither")
    if k is not None:
        tensors["k"], tensors["v"] = k, v
    for name, t in tensors.items():
        validation.float_tensor(name, t)
        if t.ndim != 4:
            raise ValueError(f"{name} must have 4 axes, got shape {tuple(t.shape)}")
    validation.same_dtype(**tensors)
    devices = {t.device for t in tensors.values()}
    if len(devices) > 1:
        raise ValueError(
            f"q, the caches, k and v must share one device, got {sorted(map(str, devices))}"
        )
    batch, s_q, heads, width = q.shape
    blocks, size, kv_heads = k_cache.shape[:3]
    if v_cache.shape[:3] != k_cache.shape[:3] or k_cache.shape[-1] != width or width == 0:
        raise ValueError(
            f"k_cache and v_cache must share their first 3 axes, and k_cache the head width "
            f"D > 0 of q: got q {tuple(q.shape)}, k_cache {tuple(k_cache.shape)}, v_cache "
            f"{tuple(v_cache.shape)}"
        )
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(
            f"the query heads H = {heads} must be a multiple of the kv heads H_kv = {kv_heads} "
            f"(q {tuple(q.shape)}, k_cache {tuple(k_cache.shape)})"
        )
    s_new = 0
    if k is not None:
        if tuple(k.shape[:3]) != (batch, k.shape[1], kv_heads) or v.shape[:3] != k.shape[:3]:
            raise ValueError(
                f"k and v must be (B, s_new, H_kv, W) with B = {batch} and H_kv = {kv_heads}, "
                f"got k {tuple(k.shape)} and v {tuple(v.shape)}"
            )
        if k.shape[-1] != width or v.shape[-1] != v_cache.shape[-1]:
            raise ValueError(
                f"k and v must have the head widths of k_cache and v_cache, got k "
                f"{tuple(k.shape)}, v {tuple(v.shape)}, k_cache {tuple(k_cache.shape)}, v_cache "
                f"{tuple(v_cache.shape)}"
            )
        s_new = k.shape[1]

    seqlens = _lengths("cache_seqlens", cache_seqlens, batch)
    if block_table is not None:
        if cache_batch_idx is not None or cache_leftpad is not None:
            raise ValueError(
                "cache_batch_idx and cache_leftpad index a contiguous cache: flash-attn refuses "
                "them with a block_table, and so does this reference"
            )
        pages = _indices("block_table", block_table, (batch, None))
        per_sequence = torch.as_tensor(block_table).shape[1]
        where = "its block table holds"
    else:
        rows = list(range(batch))
        if cache_batch_idx is not None:
            rows = _indices("cache_batch_idx", cache_batch_idx, (batch,))
        pages = [[row] for row in rows]  # a contiguous cache is one page per row
        per_sequence = 1
        where = "the cache holds"
    capacity = per_sequence * size
    totals = [length + s_new for length in seqlens]
    for b, total in enumerate(totals):
        if total > capacity:
            raise ValueError(
                f"sequence {b}: cache_seqlens {seqlens[b]} + {s_new} new tokens = {total} keys, "
                f"but {where} {capacity} ({per_sequence} x {size}); flash-attn would read and "
                f"write out of bounds there (flash-attn #2709)"
            )
    for b, total in enumerate(totals):
        for i, page in enumerate(pages[b][: -(-total // size)]):
            if not 0 <= page < blocks:
                what = (
                    f"block_table[{b}, {i}]" if block_table is not None else f"cache_batch_idx[{b}]"
                )
                pool = "pages" if block_table is not None else "rows"
                raise ValueError(
                    f"sequence {b}: {what} = {page} is not one of the cache's {blocks} {pool}"
                )
    if k is not None:
        _check_distinct_writes(pages, seqlens, s_new, size)

    lo = [0] * batch
    if cache_leftpad is not None:
        lo = _lengths("cache_leftpad", cache_leftpad, batch, scalar=False)
        for b in range(batch):
            if lo[b] > seqlens[b]:
                raise ValueError(
                    f"sequence {b}: cache_leftpad {lo[b]} is past its cache_seqlens {seqlens[b]}"
                )
    causal = validation.flag("causal", causal)
    left, right = _window(window_size)
    if left is not None:  # keys left of the first query's window are hidden from every query
        lo = [max(first, total - s_q - left) for first, total in zip(lo, totals, strict=True)]
    lo = [min(first, total) for first, total in zip(lo, totals, strict=True)]
    # flash-attn drops a window side that spans the whole cache before deciding where q turns
    local = any(side is not None and side < capacity for side in (left, right))
    rotary = _rotary(rotary_cos, rotary_sin, k is not None, width, q)
    q_moves = causal or local
    if rotary is not None:
        last = max(s_new, s_q if q_moves else 1)
        for b in range(batch):
            if seqlens[b] + last > rotary[0].shape[0]:
                raise ValueError(
                    f"sequence {b}: rotary positions reach {seqlens[b] + last - 1}, but "
                    f"rotary_cos and rotary_sin have {rotary[0].shape[0]} rows"
                )
    scale = 1.0 / math.sqrt(width) if softmax_scale is None else softmax_scale
    cap = validation.finite_real("softcap", softcap)
    if cap < 0:
        raise ValueError(f"softcap must be >= 0 (0 = off), got {softcap}")
    slopes = None
    if alibi_slopes is not None:
        slopes = validation.float_tensor("alibi_slopes", torch.as_tensor(alibi_slopes))
        if tuple(slopes.shape) not in ((heads,), (batch, heads)) or not bool(
            torch.isfinite(slopes).all()
        ):
            raise ValueError(
                f"alibi_slopes must be finite, (H,) = ({heads},) or (B, H) = ({batch}, {heads}); "
                f"got shape {tuple(slopes.shape)}"
            )
        slopes = slopes.to(q.device)
    options = {
        "causal": causal,
        "window": None if left is None and right is None else (left, right),
        "align": "bottom-right",
        "scale": validation.finite_real("softmax_scale", scale),
        "softcap": cap,
        "enable_gqa": True,
    }
    interleaved = validation.flag("rotary_interleaved", rotary_interleaved)
    validation.flag("return_lse", return_lse)
    return _Call(pages, seqlens, s_new, lo, rotary, q_moves, interleaved, options, slopes)


def _lengths(name: str, value: Any, batch: int, scalar: bool = True) -> list[int]:
    """A length per sequence (>= 0) from integers (B,) (or one int when ``scalar``)."""
    if scalar and isinstance(value, int) and not isinstance(value, bool):
        value = [value] * batch
    lengths = _indices(name, value, (batch,))
    for b, length in enumerate(lengths):
        if length < 0:
            raise ValueError(f"sequence {b}: {name} is negative ({length})")
    return lengths


def _indices(name: str, value: Any, shape: tuple[int | None, ...]) -> Any:
    """Integers of ``shape`` (None: any size) as (nested) Python lists; ``TypeError`` for another
    dtype, ``ValueError`` for another shape."""
    tensor = value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
    if tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer array, got dtype {tensor.dtype}")
    if tensor.ndim != len(shape) or any(
        want is not None and got != want for got, want in zip(tensor.shape, shape, strict=True)
    ):
        wanted = tuple("any" if want is None else want for want in shape)
        raise ValueError(f"{name} must have shape {wanted}, got {tuple(tensor.shape)}")
    return tensor.tolist()


def _check_distinct_writes(
    pages: list[list[int]], seqlens: list[int], s_new: int, size: int
) -> None:
    """No two sequences write the same cache slot (the result would depend on the order)."""
    owner: dict[tuple[int, int], int] = {}
    for b, start in enumerate(seqlens):
        for t in range(start, start + s_new):
            slot = (pages[b][t // size], t % size)
            if slot in owner:
                raise ValueError(
                    f"sequences {owner[slot]} and {b} both write page/row {slot[0]}, slot "
                    f"{slot[1]}: their new keys would overwrite each other"
                )
            owner[slot] = b


def _window(value: Any) -> tuple[int | None, int | None]:
    """flash-attn's ``window_size`` (left, right), -1 for an unbounded side, as None sides."""
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise TypeError(f"window_size must be (left, right), got {value!r}")
    sides = []
    for i, side in enumerate(value):
        side = validation.integer(f"window_size[{i}]", side)
        if side < -1:
            raise ValueError(f"window_size[{i}] must be >= 0, or -1 for unbounded, got {side}")
        sides.append(None if side == -1 else side)
    return sides[0], sides[1]


def _rotary(
    cos: Any, sin: Any, appends: bool, width: int, q: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """cos and sin (seqlen_ro, rotary_dim / 2) in q's compute dtype on its device."""
    if cos is None and sin is None:
        return None
    if cos is None or sin is None:
        raise ValueError("rotary_cos and rotary_sin go together: give both or neither")
    cos = validation.float_tensor("rotary_cos", cos)
    sin = validation.float_tensor("rotary_sin", sin)
    if cos.ndim != 2 or cos.shape != sin.shape or not 0 < 2 * cos.shape[1] <= width:
        raise ValueError(
            f"rotary_cos and rotary_sin must both be (seqlen_ro, rotary_dim / 2) with rotary_dim "
            f"<= D = {width}, got {tuple(cos.shape)} and {tuple(sin.shape)}"
        )
    if not appends:
        raise ValueError("rotary embeds the new keys: give k and v with rotary_cos and rotary_sin")
    compute = _compute(q.dtype)
    return cos.to(q.device, compute), sin.to(q.device, compute)


# -- the page pool ------------------------------------------------------------------------------


class PagedKVCache:
    """The keys and values of one attention layer in pages of a shared pool; the twin of
    ``numpy_attention.paged.PagedKVCache`` (the same allocation: a sequence's next page is the
    one after its last when free, else the lowest free page).

    ``k`` (num_blocks, P, H_kv, D) and ``v`` (num_blocks, P, H_kv, Dv) live on ``device``.

    Args: those of the NumPy twin, with a torch ``dtype``, and
        device: where the pool lives (the layer's device); None for torch's default.
    """

    def __init__(
        self,
        num_blocks: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        v_head_dim: int | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        num_blocks = validation.positive_int("num_blocks", num_blocks)
        self.page_size = validation.positive_int("page_size", page_size)
        num_kv_heads = validation.positive_int("num_kv_heads", num_kv_heads)
        head_dim = validation.positive_int("head_dim", head_dim)
        v_head_dim = validation.positive_int(
            "v_head_dim", head_dim if v_head_dim is None else v_head_dim
        )
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"PagedKVCache needs a floating torch dtype, got {dtype!r}")
        shape = (num_blocks, self.page_size, num_kv_heads)
        self.k = torch.zeros(shape + (head_dim,), dtype=dtype, device=device)
        self.v = torch.zeros(shape + (v_head_dim,), dtype=dtype, device=device)
        self._owned = [False] * num_blocks
        self._tables: list[list[int]] = []
        self._length = 0

    @property
    def length(self) -> int:
        """How many tokens every sequence holds."""
        return self._length

    @property
    def dtype(self) -> torch.dtype:
        return self.k.dtype

    @property
    def device(self) -> torch.device:
        return self.k.device

    @property
    def batch(self) -> int:
        """How many sequences the cache holds (0 before the first append)."""
        return len(self._tables)

    @property
    def cache_seqlens(self) -> torch.Tensor:
        """(B,) int32 on the pool's device: every sequence's length."""
        return torch.full((self.batch,), self._length, dtype=torch.int32, device=self.device)

    @property
    def block_table(self) -> torch.Tensor:
        """(B, pages held) int32 on the pool's device: each sequence's pages in order."""
        table = torch.tensor(self._tables, dtype=torch.int32, device=self.device)
        return table.reshape(self.batch, -1)

    def check_append(
        self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
    ) -> None:
        """Raise unless keys of ``shape`` (B, H_kv, N, D), ``dtype`` and ``device`` fit: H_kv
        and D the cache's, B its sequences' (any B for an empty cache), enough free pages.
        Writes nothing."""
        _, _, heads, width = self.k.shape
        batch = self.batch or (shape[0] if len(shape) == 4 else -1)
        if len(shape) != 4 or (shape[0], shape[1], shape[3]) != (batch, heads, width):
            raise ValueError(
                f"the cache holds {self.batch or 'B'} sequences of (H_kv, D) = ({heads}, "
                f"{width}); keys and values to append must be ({batch}, {heads}, N, {width}), "
                f"got {tuple(shape)}"
            )
        if dtype != self.dtype:
            raise TypeError(f"the cache holds {self.dtype}, got keys and values of {dtype}")
        if torch.device(device) != self.device:
            raise ValueError(f"the cache lives on {self.device}, got keys and values on {device}")
        needed = batch * self._new_pages(shape[2])
        free = self._owned.count(False)
        if needed > free:
            raise ValueError(
                f"the cache is full: {batch} sequences of {self._length} tokens need {needed} "
                f"more pages of {self.page_size} for {shape[2]} new tokens, {free} are free"
            )

    def reserve(self, batch: int, n: int) -> None:
        """Give each of the ``batch`` sequences the pages for ``n`` more tokens (starting the
        sequences if there are none), without changing their length."""
        self.check_append((batch, self.k.shape[2], n, self.k.shape[3]), self.dtype, self.device)
        if not self._tables:
            self._tables = [[] for _ in range(batch)]
        new = self._new_pages(n)
        for table in self._tables:  # one sequence at a time, so that its new pages are a run
            for _ in range(new):
                table.append(self._take_page(table[-1] + 1 if table else 0))

    def advance(self, n: int) -> None:
        """Count ``n`` more tokens in every sequence, once a kernel has written them."""
        n = validation.non_negative_int("n", n)
        held = len(self._tables[0]) * self.page_size if self._tables else 0
        if self._length + n > held:
            raise ValueError(
                f"the sequences hold pages for {held} tokens, {self._length} + {n} do not fit: "
                "reserve them first"
            )
        self._length += n

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write k (B, H_kv, N, D) and v (B, H_kv, N, Dv) after what is cached (detached: the
        cache is for inference); nothing is written when they are refused."""
        k = validation.float_tensor("k", k)
        v = validation.float_tensor("v", v)
        if k.shape[:3] != v.shape[:3] or v.ndim != 4 or v.shape[3] != self.v.shape[3]:
            raise ValueError(
                f"k and v must be (B, H_kv, N, D) and (B, H_kv, N, Dv) with Dv = "
                f"{self.v.shape[3]}, got k {tuple(k.shape)} and v {tuple(v.shape)}"
            )
        validation.same_dtype(k=k, v=v)
        self.check_append(tuple(k.shape), k.dtype, k.device)
        self.reserve(k.shape[0], k.shape[2])
        positions = list(range(self._length, self._length + k.shape[2]))
        with torch.no_grad():
            for b, table in enumerate(self._tables):
                write_tokens(self.k, table, positions, k[b].transpose(0, 1))  # -> (N, H_kv, D)
                write_tokens(self.v, table, positions, v[b].transpose(0, 1))
        self.advance(k.shape[2])

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **options: Any) -> Any:
        """Append k, v (B, H_kv, N, D) and attend q (B, H, N, D) over everything cached: per
        sequence, ``functional.attention(q_b, keys, values, **options)`` on its gathered pages;
        a (B, M) ``key_padding_mask`` and (B, ...) masks are split by sequence. The twin of the
        NumPy cache's ``attend``, and ``grouped.KVCache.attend``'s partner in the layer.

        Returns:
            what ``functional.attention`` returns: out (B, H, N, Dv), or ``AttentionOutput``
            with ``return_lse=True``.
        """
        self.append(k, v)
        outs, lses = [], []
        for b, table in enumerate(self._tables):
            own = {
                name: value[b : b + 1] if _per_sequence(name, value, self.batch) else value
                for name, value in options.items()
            }
            keys = read_tokens(self.k, table, 0, self._length)  # (M, H_kv, D)
            values = read_tokens(self.v, table, 0, self._length)
            result = attention(
                q[b : b + 1], keys.transpose(0, 1)[None], values.transpose(0, 1)[None], **own
            )
            if isinstance(result, AttentionOutput):
                outs.append(result.out)
                lses.append(result.lse)
            else:
                outs.append(result)
        out = torch.cat(outs)
        return AttentionOutput(out, torch.cat(lses)) if lses else out

    def gather(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every sequence's keys and values, (B, H_kv, length, D) and (B, H_kv, length, Dv):
        copies, in the contiguous cache's layout."""
        keys = [read_tokens(self.k, t, 0, self._length).transpose(0, 1) for t in self._tables]
        values = [read_tokens(self.v, t, 0, self._length).transpose(0, 1) for t in self._tables]
        if not keys:
            shape = (0, self.k.shape[2], self._length)
            return self.k.new_zeros(shape + (self.k.shape[3],)), self.v.new_zeros(
                shape + (self.v.shape[3],)
            )
        return torch.stack(keys), torch.stack(values)

    def reset(self) -> None:
        """Forget every sequence and free every page (the pool's tensors are kept)."""
        self._owned = [False] * len(self._owned)
        self._tables = []
        self._length = 0

    def _new_pages(self, n: int) -> int:
        held = len(self._tables[0]) if self._tables else 0
        return max(0, -(-(self._length + n) // self.page_size) - held)

    def _take_page(self, preferred: int) -> int:
        if not (preferred < len(self._owned) and not self._owned[preferred]):
            preferred = self._owned.index(False)
        self._owned[preferred] = True
        return preferred

    def __repr__(self) -> str:
        return (
            f"PagedKVCache(pages={self.k.shape[0]} x {self.page_size}, kv_heads={self.k.shape[2]}, "
            f"head_dim={self.k.shape[3]}, v_head_dim={self.v.shape[3]}, dtype={self.dtype}, "
            f"device={self.device}, sequences={self.batch}, length={self._length})"
        )


# Options of ``functional.attention`` that may hold one entry per sequence on their first axis,
# by the rank they have then: split by ``PagedKVCache.attend``.
_PER_SEQUENCE = {"key_padding_mask": 2, "attn_mask": 4, "dropout_mask": 4, "alibi_slopes": 2}


def _per_sequence(name: str, value: Any, batch: int) -> bool:
    rank = _PER_SEQUENCE.get(name)
    return (
        rank is not None
        and isinstance(value, torch.Tensor)
        and value.ndim == rank
        and value.shape[0] == batch
    )
