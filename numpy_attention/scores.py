"""The score pipeline of attention, applied tile by tile to the rules of the call (every option
checked once, before any work, by ``rules.prepare``), and the results both paths return
(``AttentionOutput``, ``AttentionGrads``).

One pipeline, written once, read by the dense path (one tile: every query, every key) and by the
tiled path (blocks of queries and keys):

1. ``S = (Q * scale) K^T``. With GQA, query head h reads kv head ``h // group``,
   group = H // H_kv (the paths arrange q as (..., H_kv, group, N, D) so K is never repeated).
2. ``softcap > 0``: ``S = softcap * tanh(S / softcap)``.
3. ALiBi: ``S -= slope_h * |p_i - j|``, with p_i = i + offset query i's position on the key axis
   (offset 0 for ``align="top-left"``, M - N for ``"bottom-right"``).
4. A float ``attn_mask`` is added.
5. Visibility: every hidden score is *replaced* by -inf (never added to, so a NaN or inf at a
   hidden key cannot leak): causal (j <= p_i), a window (p_i - left <= j <= p_i + right), a
   chunk (j and p_i in the same chunk of C keys counted from s: (j - s) // C == (p_i - s) // C),
   a bool ``attn_mask``, ``key_padding_mask``, and the -inf entries of a float ``attn_mask``.
6. Sinks: one raw logit per query head joins every row's softmax with no value attached. The
   softmax itself belongs to each path (dense: whole rows; tiled: online); this module gives the
   sink logit of each tile's rows, and the floor below which a shifted score's weight is
   flushed to an exact 0 before exp (``exp_floor``, ``flush_underflow``: no denormals).
7. Dropout: a keep-mask sliced from an explicit one, or regenerated from a seed block by block.

Tiles are (g, bq, bk) arrays, or (g, bk, bq) with ``transposed=True`` (the tiled path works on
S^T); g runs over a slice of the flattened leading axes of q (``groups``).

Shape legend: B batch, H query heads, H_kv key/value heads, N query length, M key length, D head
width, Dv value head width, G the product of q's leading axes (B * H), g a tile's share of them.

Derivation: docs/derivations/attention.md (pipeline), softcap.md, alibi.md, windows.md,
sinks.md, gqa.md, lse.md, tiled.md. Tests: tests/numpy_attention/test_scores.py.
"""

from __future__ import annotations

import functools
import math
import threading
from typing import Any, NamedTuple

import numpy as np

from .rules import ScoreRules

# The keep-mask of a dropout drawn from a seed is defined on a grid of these blocks, each drawn
# from its own Philox stream, whatever tile sizes compute it: dense and tiled paths, at any block
# size, draw the same mask for the same seed.
DROPOUT_BLOCK = 256
# Position grids up to this many entries (a 256 x 256 tile) are cached; larger ones are built per
# call, so that the cache never pins an (N, M) array of a forced dense run.
_GRID_CACHE_ENTRIES = 256 * 256


class AttentionOutput(NamedTuple):
    """What ``attention_forward`` returns, whatever the options: the same three fields.

    out: (..., N, Dv) in the inputs' dtype. lse: (..., N), the natural-log log-sum-exp of each
    row of scores (the sink's term included), in the compute dtype, when ``return_lse=True``;
    else None. ctx: what ``attention_backward`` needs; None under ``no_grad()``.
    """

    out: np.ndarray
    lse: np.ndarray | None
    ctx: Any


class AttentionGrads(NamedTuple):
    """What ``attention_backward`` returns: dq, dk, dv, and dsinks (None without sinks)."""

    dq: np.ndarray
    dk: np.ndarray
    dv: np.ndarray
    dsinks: np.ndarray | None


class Tile(NamedTuple):
    """Which scores a tile holds: leading indices ``groups`` (flattened), query ``rows``, key
    ``cols``; ``transposed`` tiles hold S^T, (g, bk, bq)."""

    groups: slice
    rows: slice
    cols: slice
    transposed: bool


# -- the pipeline on one tile -------------------------------------------------------------------


def apply(
    rules: ScoreRules,
    scores: np.ndarray,
    tile: Tile,
    *,
    keep_capped: bool = False,
    shift: Any = None,
) -> np.ndarray | None:
    """Steps 2-5 of the pipeline, in place, on one tile of U = (Q * query_scale) K^T.

    U is S1 = (Q * scale) K^T, or S1 / softcap with softcap: the paths fold the cap's division
    into Q once (``rules.query_scale``), so a tile needs no pass for it.

    Args:
        rules: the call's rules.
        scores: U, (g, bq, bk), or (g, bk, bq) for a transposed tile; overwritten with S, or
            with S - shift.
        tile: which scores these are.
        keep_capped: return ``tanh(S1 / softcap)``, which a backward needs; a forward alone
            computes it in place.
        shift: what the softmax subtracts next (a scalar, or an array broadcasting to the tile
            with one entry per leading index, (g, 1, 1) or (g, 1, bq) / (g, bq, 1)), or None.
            Subtracted here, it costs no pass of its own with ALiBi: each head's bias
            slope * |p_i - j| + shift is built in cache and subtracted once.

    Returns:
        The softcap's ``tanh(S1 / softcap)`` when asked for (with softcap), else None.
    """
    capped = None
    if rules.softcap:
        cap = scores.dtype.type(rules.softcap)
        capped = np.tanh(scores) if keep_capped else np.tanh(scores, out=scores)
        np.multiply(capped, cap, out=scores)  # S2 = softcap * tanh(S1 / softcap)
        capped = capped if keep_capped else None
    if rules.slopes is not None:
        distance = _grid(_distance, rules, tile, scores.dtype)  # |p_i - j|
        bias = _scratch(distance)  # head by head: the grid and the bias stay in cache
        shifts = _per_head(shift, len(scores))
        for head, slope, head_shift in zip(scores, rules.slopes[tile.groups], shifts, strict=True):
            np.multiply(distance, slope, out=bias)
            head -= bias if head_shift is None else np.add(bias, head_shift, out=bias)
    elif shift is not None:
        scores -= shift
    if rules.bias is not None:
        scores += _tile(rules.bias, rules.lead, tile)
    band = _band_hidden(rules, tile)
    if band is not None:
        np.copyto(scores, scores.dtype.type(-np.inf), where=band)
    chunk = _chunk_hidden(rules, tile)
    if chunk is not None:
        np.copyto(scores, scores.dtype.type(-np.inf), where=chunk)
    for hidden in rules.hidden:
        np.copyto(scores, scores.dtype.type(-np.inf), where=_tile(hidden, rules.lead, tile))
    return capped


def _per_head(shift: Any, heads: int) -> Any:
    """``apply``'s shift as one entry per leading index of the tile (None: no shift)."""
    if shift is None:
        return [None] * heads
    shift = np.asarray(shift)
    return shift if shift.ndim == 3 else np.broadcast_to(shift, (heads, 1, 1))


def backward(rules: ScoreRules, dscores: np.ndarray, capped: np.ndarray | None) -> np.ndarray:
    """Steps 5-2 in reverse, in place: the gradient of S1 from the gradient of S.

    Visibility, the float mask and ALiBi add constants or replace entries whose probability is
    0 (so dS is already 0 there): they pass dS through. The softcap's chain rule:
    S2 = c * tanh(S1 / c)  ->  dS1 = dS2 * (1 - tanh^2(S1 / c)) (``capped``, tanh(S1 / c), is
    left as it is: a ctx may be given to the backward more than once).
    With U = S1 / c in the tile, dQ = dS1 K * scale as ever, and dK = dS1^T (Q * scale)
    = c * dS1^T (Q * query_scale): the paths multiply dK by c once (``key_grad_scale``).
    Derivation: docs/derivations/softcap.md.
    """
    if capped is not None:
        slope = np.square(capped)  # tanh^2, a new array: the ctx keeps tanh for another backward
        np.subtract(1, slope, out=slope)  # 1 - tanh^2
        dscores *= slope
    return dscores


def key_grad_scale(rules: ScoreRules) -> float:
    """What dK = dS1^T (Q * query_scale) is multiplied by to make dS1^T (Q * scale): the cap."""
    return rules.softcap or 1.0


def sink_logits(rules: ScoreRules, groups: slice) -> np.ndarray | None:
    """The sink logit of each row of a tile's groups, (g, 1, 1); None without sinks."""
    return None if rules.sinks is None else rules.sinks[groups, None, None]


def exp_floor(rules: ScoreRules, tile: Tile) -> Any:
    """``rules.floor`` when some shifted score of the tile (S - row max) may fall below it, so
    that ``flush_underflow`` has work to do; None when a bound shows that none can.

    The bound: row max - S_ij <= top + score_bound, plus ALiBi's term. With a slope >= 0 the
    bias only lowers scores, by at most slope * (the tile's largest |p_i - j|); a negative slope
    raises far keys, so the row max may lie up to |slope| * (N + M) above any score. O(1) per
    tile.
    """
    spread = rules.top + rules.score_bound
    if rules.slopes is not None and tile.groups.stop > tile.groups.start:
        slopes = rules.slopes[tile.groups].tolist()  # a few floats: Python is faster here
        rows, cols = tile.rows, tile.cols
        nearest = rows.start + rules.offset - (cols.stop - 1)  # smallest p_i - j of the tile
        farthest = rows.stop - 1 + rules.offset - cols.start  # largest
        reach = max(abs(nearest), abs(farthest))
        spread += max(0.0, max(slopes)) * reach
        spread += max(0.0, -min(slopes)) * (rules.n + rules.m)
    return None if spread < -rules.floor else rules.floor  # NaN: flush, to be safe


def fixed_shift(rules: ScoreRules) -> Any:
    """A shift for the softmax known before any product, in place of the running row max: the
    bound ``top`` on every row max (a compute-dtype scalar), when each row's largest weight
    exp(max - top) is then at least exp(floor); None otherwise.

    exp(S - shift) is the same softmax for any shift that is the same along a row; the row max
    is the usual one because it keeps every weight <= 1 and the largest = 1. A bound keeps them
    <= 1 too, and when it lies within -floor of each row's max, the row keeps its precision (a
    weight below exp(floor) is flushed, as ever, but never the row's largest): the tiled forward
    then needs no pass for the row max and no rescaling of what earlier blocks accumulated.
    That holds when top + score_bound < -floor (unit-variance q and k at head width 64: ~30,
    against 71.4 in float32), and, with ALiBi, only when its slopes are >= 0 (the bias lowers
    scores, so top still bounds them) and every row sees the key at its own position (N <= M
    and no mask hides any key), where the bias is 0.
    """
    if not rules.top + rules.score_bound < -rules.floor:
        return None
    if rules.slopes is not None and (
        rules.slopes.min(initial=0.0) < 0 or rules.hidden or rules.n > rules.m
    ):
        return None
    return rules.compute.type(rules.top)


def flush_underflow(shifted: np.ndarray, exp_floor: Any) -> np.ndarray:
    """In place, before exp: shifted scores (S - row max, or S - lse) below ``exp_floor``
    become -inf, so that their weights are exact zeros.

    The floor is log(tiny / eps) of the compute dtype (-71.4 in float32, -672 in float64): a
    weight below it is more than 1 / eps times smaller than the smallest normal number, against
    a largest weight of 1 in its row, so dropping it changes no result beyond rounding. Kept,
    such weights are denormals, or make denormals in the products (a weight times a value
    below 1), and every multiplication with a denormal is a microcode assist on x86 CPUs:
    measured here, a product of denormal weights ran 160x slower, and ALiBi (whose far keys
    sit hundreds below the row max) or the sharp logits of real models put them in most tiles.
    ``exp_floor`` is ``exp_floor(rules, tile)``: None (nothing to do) when no weight can be
    that small.
    """
    if exp_floor is not None:
        np.copyto(shifted, shifted.dtype.type(-np.inf), where=shifted < exp_floor)
    return shifted


# -- visibility: which key blocks a query block sees -------------------------------------------


def visible_cols(rules: ScoreRules, rows: slice) -> tuple[int, int]:
    """The keys [lo, hi) that some query of ``rows`` may see under causal/window/alignment
    (and chunks: a key shares a chunk of C only with positions less than C away)."""
    left, right = _reach(rules)
    lo = 0 if left is None else max(0, rows.start + rules.offset - left)
    hi = rules.m if right is None else min(rules.m, rows.stop + rules.offset + right)
    return lo, max(lo, hi)


def visible_rows(rules: ScoreRules, cols: slice) -> tuple[int, int]:
    """The queries [lo, hi) that see some key of ``cols`` under causal/window/alignment/chunks."""
    left, right = _reach(rules)
    lo = 0 if right is None else max(0, cols.start - rules.offset - right)
    hi = rules.n if left is None else min(rules.n, cols.stop - rules.offset + left)
    return lo, max(lo, hi)


def _reach(rules: ScoreRules) -> tuple[int | None, int | None]:
    """How far from p_i a visible key may lie, (left, right): the band's, narrowed to C - 1 on
    each side by chunks of C (wherever they start)."""
    if rules.chunk is None:
        return rules.left, rules.right
    reach = rules.chunk - 1
    left = reach if rules.left is None else min(rules.left, reach)
    right = reach if rules.right is None else min(rules.right, reach)
    return left, right


def _chunk_hidden(rules: ScoreRules, tile: Tile) -> np.ndarray | None:
    """Bool, True where query and key lie in different chunks: (bq, bk) (or (bk, bq)), or
    (g, bq, bk) with a start per batch element; None without chunks or when the whole tile
    lies in one chunk (floor division, so keys before the start form chunks -1, -2, ...)."""
    if rules.chunk is None:
        return None
    size, rows, cols = rules.chunk, tile.rows, tile.cols
    start: Any = 0 if rules.chunk_start is None else _tile(rules.chunk_start, rules.lead, tile)
    if np.size(start) == 1:  # one start for every row of the tile
        start = int(np.ravel(start)[0])
        ends = (cols.start, cols.stop - 1, rows.start + rules.offset, rows.stop - 1 + rules.offset)
        if len({(end - start) // size for end in ends}) == 1:
            return None
    p = np.arange(rows.start, rows.stop) + rules.offset  # (bq,)
    j = np.arange(cols.start, cols.stop)  # (bk,)
    if tile.transposed:  # (bk, bq)
        return (j[:, None] - start) // size != (p[None, :] - start) // size
    return (p[:, None] - start) // size != (j[None, :] - start) // size


def _band_hidden(rules: ScoreRules, tile: Tile) -> np.ndarray | None:
    """Bool (bq, bk) (or (bk, bq)), True where causal/window hide; None when the whole tile lies
    inside the band (the common case: no work at all)."""
    if rules.left is None and rules.right is None:
        return None
    rows, cols = tile.rows, tile.cols
    first = cols.start - (rows.stop - 1 + rules.offset)  # smallest j - p_i in the tile
    last = cols.stop - 1 - (rows.start + rules.offset)  # largest j - p_i in the tile
    if (rules.right is None or last <= rules.right) and (
        rules.left is None or first >= -rules.left
    ):
        return None
    return _grid(_outside_band, rules, tile, np.dtype(bool))


def _grid(build: Any, rules: ScoreRules, tile: Tile, dtype: np.dtype) -> np.ndarray:
    """A grid that depends on positions only, (bq, bk) or (bk, bq): cached when tile-sized."""
    rows, cols = tile.rows, tile.cols
    key = (
        rows.start + rules.offset - cols.start,  # p_i - j at the tile's corner
        rows.stop - rows.start,
        cols.stop - cols.start,
        tile.transposed,
        rules.left,
        rules.right,
        dtype,
    )
    if key[1] * key[2] <= _GRID_CACHE_ENTRIES:
        return _cached_grid(build, *key)
    return build(*key)


_SCRATCH = threading.local()


def _scratch(like: np.ndarray) -> np.ndarray:
    """A scratch array shaped and typed like ``like``, one buffer per thread, reused from tile
    to tile (a fresh temporary per tile costs an allocation and page faults)."""
    size = like.size
    buffer = getattr(_SCRATCH, "buffer", None)
    if buffer is None or buffer.dtype != like.dtype or buffer.size < size:
        buffer = _SCRATCH.buffer = np.empty(size, like.dtype)
    return buffer[:size].reshape(like.shape)


@functools.lru_cache(maxsize=256)
def _cached_grid(build: Any, *key: Any) -> np.ndarray:
    grid = build(*key)
    grid.flags.writeable = False
    return grid


def _positions(corner: int, rows: int, cols: int, transposed: bool) -> np.ndarray:
    """p_i - j over the tile, (rows, cols) or (cols, rows)."""
    if transposed:  # built as (cols, rows), C-contiguous: a transposed view is 5x slower to use
        return corner + np.arange(rows)[None, :] - np.arange(cols)[:, None]
    return corner + np.arange(rows)[:, None] - np.arange(cols)[None, :]


def _distance(
    corner: int, rows: int, cols: int, transposed: bool, left: Any, right: Any, dtype: np.dtype
) -> np.ndarray:
    return np.abs(_positions(corner, rows, cols, transposed)).astype(dtype)


def _outside_band(
    corner: int, rows: int, cols: int, transposed: bool, left: Any, right: Any, dtype: np.dtype
) -> np.ndarray:
    ahead = -_positions(corner, rows, cols, transposed)  # j - p_i
    hidden = np.zeros(ahead.shape, dtype=bool)
    if right is not None:
        hidden |= ahead > right
    if left is not None:
        hidden |= ahead < -left
    return hidden


# -- masks and dropout on one tile --------------------------------------------------------------


def _tile(mask: np.ndarray, lead: tuple[int, ...], tile: Tile) -> np.ndarray:
    """One tile of a full-rank ``mask`` that broadcasts to (..., N, M), as an array that
    broadcasts to the tile (g, bq, bk) (or (g, bk, bq)): unit axes of the mask stay unit axes."""
    rows = tile.rows if mask.shape[-2] > 1 else slice(None)
    cols = tile.cols if mask.shape[-1] > 1 else slice(None)
    block = mask[..., rows, cols]
    if all(size == 1 for size in mask.shape[:-2]):
        block = block.reshape((1,) + block.shape[-2:])  # (1, ..., 1, bq, bk) -> (1, bq, bk)
    else:
        flat = np.unravel_index(np.arange(tile.groups.start, tile.groups.stop), lead)
        index = tuple(i if size > 1 else 0 for i, size in zip(flat, mask.shape[:-2], strict=True))
        block = block[index]  # (g, bq, bk)
    return block.swapaxes(-1, -2) if tile.transposed else block


def keep_tile(rules: ScoreRules, tile: Tile) -> np.ndarray | None:
    """The dropout keep-mask of a tile, shaped like it; None without dropout."""
    if rules.keep is not None:
        return _tile(rules.keep, rules.lead, tile)
    if rules.seed is None:
        return None
    keep = _seeded_keep(rules.seed, rules.dropout_p, tile.groups, tile.rows, tile.cols)
    return keep.swapaxes(-1, -2) if tile.transposed else keep


def dropout_mask_from_seed(seed: int, shape: tuple[int, ...], dropout_p: float) -> np.ndarray:
    """The whole keep-mask that a seeded dropout regenerates tile by tile, (..., N, M), bool.

    Entry (g, i, j), g the flattened leading index, lies in block (i // 256, j // 256) of the
    ``DROPOUT_BLOCK`` grid; that block is ``U >= dropout_p`` with U float32 uniform from a
    Philox generator keyed by ``seed`` with counter ``(g << 192) | (bi << 128) | (bj << 64)``:
    every block has its own stream, independent of threads, tiles and paths.
    """
    *lead, n, m = shape
    groups = slice(0, math.prod(lead))
    return _seeded_keep(seed, dropout_p, groups, slice(0, n), slice(0, m)).reshape(shape)


def _seeded_keep(seed: int, p: float, groups: slice, rows: slice, cols: slice) -> np.ndarray:
    """(g, bq, bk) keep-mask of any rectangle, from the blocks of the dropout grid it covers.

    A generator's stream is sequential, so drawing the first r rows of a block gives the same
    values as drawing the whole block: only the rows up to the rectangle's last are drawn.
    """
    size = DROPOUT_BLOCK
    shape = (groups.stop - groups.start, rows.stop - rows.start, cols.stop - cols.start)
    keep = np.empty(shape, dtype=bool)
    for bi in range(rows.start // size, -(-rows.stop // size)):
        r0, r1 = max(rows.start, bi * size), min(rows.stop, (bi + 1) * size)
        for bj in range(cols.start // size, -(-cols.stop // size)):
            c0, c1 = max(cols.start, bj * size), min(cols.stop, (bj + 1) * size)
            target = (
                slice(r0 - rows.start, r1 - rows.start),
                slice(c0 - cols.start, c1 - cols.start),
            )
            for g in range(groups.start, groups.stop):
                stream = np.random.Philox(key=seed, counter=(g << 192) | (bi << 128) | (bj << 64))
                drawn = np.random.Generator(stream).random((r1 - bi * size, size), np.float32)
                block = drawn[r0 - bi * size :, c0 - bj * size : c1 - bj * size]
                keep[(g - groups.start,) + target] = block >= p
    return keep
