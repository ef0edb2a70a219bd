"""One case of the kernel checker: a shape, the options of today's attention family, how its
inputs are laid out in memory and how they are drawn.

A case is a shape plus causal with its alignment, a bool or float mask, scale, dropout, GQA, a
window, softcap, ALiBi, packed variable-length sequences, plus how the kernel's inputs sit in
memory (``memory``: contiguous, permuted views of one fused projection, k and v with different
strides, a nonzero storage offset) and how the inputs are distributed. Inputs are drawn in
float64 from a generator seeded by (seed, case name), so a verdict is reproducible and does not
depend on which other cases run; the memory layout changes where the values sit, never the
values. What a case needs from a kernel is ``Case.needs`` (the feature names of
``specs.FEATURES``); which cases make up a battery is ``checker.battery``'s business.

Shape legend: B batch, H heads, H_kv key/value heads, N query length, M key/value length,
D head width, Dv value width; for a packed (varlen) case S sequences, T_q and T_k the packed
query and key token counts.

Tests: tests/checker/battery/test_case.py
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

MASKS = ("none", "bool", "float", "dead-bool", "dead-float", "shifted")
INPUTS = ("gauss", "heavy", "outliers", "correlated")
ALIGNS = ("top-left", "bottom-right")
ALIBI = ("none", "H", "BH")
LAYOUTS = ("contiguous", "zigzag")
MEMORY = ("contiguous", "fused", "kv-strides", "offset", "broadcast")
# The shift of a "shifted" mask's rows: far below zero, finite (cast to a dtype that cannot hold
# it, the dtype's largest finite: -65,504 in float16).
SHIFT = -1e5


@dataclass(frozen=True)
class Case:
    """One configuration of the kernel's arguments and inputs.

    Attributes:
        name: unique, used in reports and to seed the inputs.
        batch, heads, n, m, d: B, H, N, M, D. For a packed case (``seqlens`` given) ``batch``
            is the number of sequences S and ``n``, ``m`` the packed totals T_q, T_k.
        dv: Dv, the value head width; None means D.
        heads_kv: H_kv, the key/value heads (GQA when fewer than H); None means H.
        causal: query i sees keys j <= p_i, with p_i = i (``align="top-left"``, SDPA's
            ``is_causal``) or i + M - N (``"bottom-right"``, flash-attn's).
        align: where query i sits on the key axis, for causal, the window and ALiBi.
        window: (left, right): query i sees keys p_i - left <= j <= p_i + right; None on a
            side is unbounded.
        softcap: > 0 caps the scores with ``softcap * tanh(S / softcap)``.
        alibi: "none", "H" (slopes (H,)) or "BH" (slopes (B, H), one row per batch element or
            sequence): ``S -= slope * |p_i - j|``.
        mask: "none"; "bool" (random, True = may attend, shape (B, 1, N, M)); "float" (an
            ALiBi-like additive bias with -inf holes, shape (1, H, N, M)); "dead-bool" and
            "dead-float" (shape (B, H, N, M), with some query rows fully masked: golden 0);
            "shifted" (shape (B, H, N, M), finite: about half the rows shifted by ``SHIFT``,
            which a softmax does not see, so the golden is the unshifted answer). With causal
            or a window the mask's holes leave every row one key that those rules let it see
            (flex; SDPA takes a mask or is_causal, not both).
        scale: None lets the kernel use 1 / sqrt(D).
        inputs: "gauss" (standard normal); "heavy" (Student-t with 3 degrees of freedom,
            clipped at 10 standard deviations, with outlier channels in q, k and v);
            "outliers" (what real activations look like: Gaussian with per-channel scales of a
            log-normal spread, a few channels 5-20 times the median, and a first key of 8 times
            the norm, an attention sink); "correlated" (queries sharing 90% of their variance:
            rows of nearly one direction).
        logits: the typical magnitude of the scores q k^T * scale (q and k are scaled for it).
        dropout_p: inverted dropout on the weights; the checker reads the keep-mask back
            through SDPA's signature and judges flash-attn's statistically
            (``running.calls``).
        seqlens: for packed variable-length sequences, the (query, key) length of each
            sequence; lengths, never offsets, so the offsets are monotonic by construction.
        layout: how the distributed spec shards the sequence ("contiguous" or "zigzag").
        memory: how q, k and v sit in memory when the kernel gets them ("contiguous"; "fused":
            permuted views of one token-major buffer, as a fused QKV projection gives them, or
            of a fused KV one when N != M; "kv-strides": k token-major and v head-major, so k
            and v have different strides; "offset": each at a nonzero storage offset;
            "broadcast": k and v stride-0 views of one head expanded over the kv heads, or of
            one batch element over the batch with one kv head, their values equal along that
            axis).
    """

    name: str
    batch: int
    heads: int
    n: int
    m: int
    d: int
    dv: int | None = None
    causal: bool = False
    mask: str = "none"
    scale: float | None = None
    inputs: str = "gauss"
    logits: float = 1.0
    dropout_p: float = 0.0
    heads_kv: int | None = None
    align: str = "top-left"
    window: tuple[int | None, int | None] | None = None
    softcap: float = 0.0
    alibi: str = "none"
    seqlens: tuple[tuple[int, int], ...] | None = None
    layout: str = "contiguous"
    memory: str = "contiguous"

    def __post_init__(self) -> None:
        for field, value, allowed in (
            ("mask", self.mask, MASKS),
            ("inputs", self.inputs, INPUTS),
            ("align", self.align, ALIGNS),
            ("alibi", self.alibi, ALIBI),
            ("layout", self.layout, LAYOUTS),
            ("memory", self.memory, MEMORY),
        ):
            if value not in allowed:
                raise ValueError(
                    f"case {self.name}: {field} must be one of {allowed}, got {value!r}"
                )
        if not 0.0 <= self.dropout_p < 1.0:
            raise ValueError(f"case {self.name}: dropout_p must be in [0, 1), got {self.dropout_p}")
        if self.kv_heads < 1 or self.heads % self.kv_heads:
            raise ValueError(
                f"case {self.name}: heads_kv must divide heads, got H = {self.heads}, "
                f"H_kv = {self.heads_kv}"
            )
        if self.window is not None and any(
            side is not None and (not isinstance(side, int) or side < 0) for side in self.window
        ):
            raise ValueError(f"case {self.name}: window sides must be ints >= 0 or None")
        if self.seqlens is not None:
            self._check_seqlens()

    def _check_seqlens(self) -> None:
        lengths = self.seqlens or ()
        if any(
            not isinstance(length, int) or isinstance(length, bool) or length < 0
            for pair in lengths
            for length in pair
        ):
            raise ValueError(
                f"case {self.name}: seqlens are (query, key) lengths >= 0, got {lengths}; "
                "offsets that decrease cannot be built from them"
            )
        totals = (len(lengths), sum(n for n, _ in lengths), sum(m for _, m in lengths))
        if totals != (self.batch, self.n, self.m):
            raise ValueError(
                f"case {self.name}: batch, n, m must be S, T_q, T_k = {totals} of seqlens "
                f"{lengths}, got {(self.batch, self.n, self.m)}"
            )
        if self.mask != "none":
            raise ValueError(f"case {self.name}: a packed case takes no mask")

    @property
    def value_width(self) -> int:
        """Dv."""
        return self.d if self.dv is None else self.dv

    @property
    def kv_heads(self) -> int:
        """H_kv."""
        return self.heads if self.heads_kv is None else self.heads_kv

    @property
    def packed(self) -> bool:
        """Whether the case is packed variable-length sequences (flash-attn's varlen layout)."""
        return self.seqlens is not None

    @property
    def lengths(self) -> tuple[tuple[int, int], ...]:
        """The (query, key) length of each sequence: ``seqlens``, or (N, M) per batch element."""
        return self.seqlens or ((self.n, self.m),) * self.batch

    @property
    def cu_seqlens(self) -> tuple[np.ndarray, np.ndarray]:
        """The cumulative offsets (S + 1,) of queries and keys: one sequence per batch element
        of an ordinary case, ``seqlens`` of a packed one."""
        lengths = self.lengths
        cu_q = np.concatenate([[0], np.cumsum([n for n, _ in lengths])]).astype(np.int64)
        cu_k = np.concatenate([[0], np.cumsum([m for _, m in lengths])]).astype(np.int64)
        return cu_q, cu_k

    @property
    def positioned(self) -> bool:
        """Whether query positions matter: causal, a window or ALiBi with N != M somewhere
        (then top-left and bottom-right differ)."""
        if not (self.causal or self.window is not None or self.alibi != "none"):
            return False
        return any(n != m for n, m in self.lengths)

    @property
    def needs(self) -> frozenset[str]:
        """The features (``specs.FEATURES``) a kernel must have to run this case."""
        needs = {
            "mask": self.mask != "none",
            "causal": self.causal,
            "dropout": bool(self.dropout_p),
            "gqa": self.kv_heads != self.heads,
            "window": self.window is not None,
            "softcap": bool(self.softcap),
            "alibi": self.alibi != "none",
            "dv": self.value_width != self.d,
        }
        return frozenset(name for name, needed in needs.items() if needed)

    @property
    def shape(self) -> dict[str, int]:
        """The sizes of the case by legend letter: B, H, N, M, D, Dv (S, T_q, T_k when packed)."""
        return {
            "B": self.batch,
            "H": self.heads,
            "N": self.n,
            "M": self.m,
            "D": self.d,
            "Dv": self.value_width,
        }

    def visible(self, n: int, m: int) -> np.ndarray:
        """Bool (N, M) for one sequence of n queries and m keys: True where the causal and
        window rules let query i see key j (a mask's holes come on top)."""
        offset = m - n if self.align == "bottom-right" else 0
        p = np.arange(n)[:, None] + offset  # (N, 1)
        j = np.arange(m)[None, :]  # (1, M)
        allowed = np.ones((n, m), dtype=bool)
        if self.causal:
            allowed &= j <= p
        left, right = self.window if self.window is not None else (None, None)
        if left is not None:
            allowed &= j >= p - left
        if right is not None:
            allowed &= j <= p + right
        return allowed


class CaseInputs(NamedTuple):
    """float64 inputs of one case. Ordinary cases: q (B, H, N, D), k (B, H_kv, M, D),
    v (B, H_kv, M, Dv), dout (B, H, N, Dv); packed cases: q (T_q, H, D), k (T_k, H_kv, D),
    v (T_k, H_kv, Dv), dout (T_q, H, Dv). ``attn_mask`` is bool, float64 or None;
    ``alibi_slopes`` (H,) or (B, H) or None."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    attn_mask: np.ndarray | None
    dout: np.ndarray
    alibi_slopes: np.ndarray | None = None


def make_inputs(case: Case, seed: int) -> CaseInputs:
    """The float64 inputs of ``case`` for ``seed``; the same (case, seed) gives the same arrays."""
    rng = np.random.default_rng([seed, zlib.crc32(case.name.encode())])
    b, h, h_kv, n, m = case.batch, case.heads, case.kv_heads, case.n, case.m
    d, dv = case.d, case.value_width
    if case.packed:
        shapes = ((n, h, d), (m, h_kv, d), (m, h_kv, dv), (n, h, dv))
    else:
        shapes = ((b, h, n, d), (b, h_kv, m, d), (b, h_kv, m, dv), (b, h, n, dv))
    q, k, v = (_draw(rng, case.inputs, shape) for shape in shapes[:3])
    if case.inputs == "outliers":
        k = _with_sink(case, k)
    if case.inputs == "correlated":
        q = _correlated(rng, q, case.packed)
    if case.memory == "broadcast":
        k, v = _broadcast_values(case, k), _broadcast_values(case, v)
    # Scores q k^T * scale have a spread of about sqrt(D) * scale for unit inputs; scale q and k
    # so that the spread is ``case.logits``.
    scale = 1.0 / math.sqrt(d) if case.scale is None else case.scale
    stretch = math.sqrt(case.logits / (math.sqrt(d) * scale))
    dout = rng.standard_normal(shapes[3])
    mask = None if case.packed else _draw_mask(rng, case)
    return CaseInputs(q * stretch, k * stretch, v, mask, dout, _slopes(case))


def _slopes(case: Case) -> np.ndarray | None:
    """ALiBi's usual geometric slopes 2^(-8 (h + 1) / H); per batch element they grow by half
    of themselves per element, so that a kernel reading row 0 for every element is wrong. Each
    is a float32 number, as flash-attn takes them (2^(-8/3) is not: a float64 kernel given
    float32 slopes would be charged for their rounding)."""
    if case.alibi == "none":
        return None
    slopes = 2.0 ** (-8.0 * np.arange(1, case.heads + 1) / case.heads)  # (H,)
    if case.alibi == "BH":
        slopes = slopes[None, :] * (1.0 + 0.5 * np.arange(case.batch))[:, None]  # (B, H)
    return slopes.astype(np.float32).astype(np.float64)


# Where "heavy" inputs are clipped, in standard deviations (about 4 entries in 10,000 reach it).
# Unclipped, the tail of Student-t(3) reaches 100 standard deviations on some seed (seed 58 of
# float-dv<-scale-heavy-129x129-d64: 107, 640 on an outlier channel), and q k^T then overflows
# float16 in every plain implementation before the scale is applied (78,190 > 65,504): overflow
# is the stress battery's business, not that of the cases built by code.
HEAVY_CLIP = 10.0


# What real activations look like (the "outliers" inputs): per-channel scales of a log-normal
# spread (a few channels 5-20 times the median, the "massive activations" of language models)
# and a first key of SINK times the norm of the others, an attention sink.
CHANNEL_SPREAD = 1.0  # the standard deviation of the channels' log-scales
SINK = 8.0
CORRELATION = 0.9  # the share of a "correlated" query's variance along its (batch, head)'s one


def _draw(rng: np.random.Generator, kind: str, shape: tuple[int, ...]) -> np.ndarray:
    if kind in ("gauss", "correlated"):
        return rng.standard_normal(shape)
    if kind == "outliers":
        scales = np.exp(CHANNEL_SPREAD * rng.standard_normal(shape[-1]))
        scales /= np.sqrt(np.mean(scales**2))  # unit RMS over channels: the logits' spread kept
        return rng.standard_normal(shape) * scales
    # Unit-variance Student-t(3), clipped at HEAVY_CLIP standard deviations, with two outlier
    # channels six times larger.
    values = np.clip(rng.standard_t(3, shape) / math.sqrt(3.0), -HEAVY_CLIP, HEAVY_CLIP)
    channels = rng.choice(shape[-1], size=2, replace=False)
    values[..., channels] *= 6.0
    return values


def _with_sink(case: Case, k: np.ndarray) -> np.ndarray:
    """k with the first key of every sequence ``SINK`` times larger."""
    k = k.copy()
    if case.packed:
        for start in case.cu_seqlens[1][:-1]:
            if start < k.shape[0]:
                k[start] *= SINK  # (T_k, H_kv, D): the sequence's first token
    else:
        k[..., 0, :] *= SINK  # (B, H_kv, M, D)
    return k


def _correlated(rng: np.random.Generator, q: np.ndarray, packed: bool) -> np.ndarray:
    """q whose rows share ``CORRELATION`` of their variance along one direction per (batch,
    head): nearly parallel queries."""
    common_shape = (1, *q.shape[1:]) if packed else (*q.shape[:-2], 1, q.shape[-1])
    common = rng.standard_normal(common_shape)
    return math.sqrt(CORRELATION) * common + math.sqrt(1.0 - CORRELATION) * q


def _broadcast_values(case: Case, t: np.ndarray) -> np.ndarray:
    """t equal along the axis a "broadcast" layout expands: its kv heads, or with one kv head
    its batch (``running.memory``)."""
    if t.shape[1] > 1:  # (B, H_kv, L, W) or (T, H_kv, W): every head the first one
        return np.repeat(t[:, :1], t.shape[1], axis=1)
    if not case.packed and t.shape[0] > 1:
        return np.repeat(t[:1], t.shape[0], axis=0)
    return t


def _draw_mask(rng: np.random.Generator, case: Case) -> np.ndarray | None:
    b, h, n, m = case.batch, case.heads, case.n, case.m
    if case.mask == "none":
        return None
    seen = case.visible(n, m)  # (N, M): what causal and the window let each row see
    if case.mask == "shifted":
        shifted = rng.random((b, h, n, 1)) < 0.5  # about half the rows
        shifted.flat[rng.integers(shifted.size)] = True  # at least one
        return np.broadcast_to(np.where(shifted, SHIFT, 0.0), (b, h, n, m)).copy()
    if case.mask == "float":
        slopes = 2.0 ** -np.arange(1, h + 1)  # (H,)
        distance = np.abs(np.arange(n)[:, None] - np.arange(m)[None, :])  # (N, M)
        bias = -slopes[:, None, None] * distance  # (H, N, M)
        holes = _with_one_per_row(rng.random((h, n, m)) < 0.1, seen, rng)
        return np.where(holes, -np.inf, bias)[None]  # (H, N, M) -> (1, H, N, M)
    if case.mask == "bool":
        masked = _with_one_per_row(rng.random((b, 1, n, m)) < 0.4, seen, rng)
        return ~masked  # (B, 1, N, M), True = may attend
    masked = _with_one_per_row(rng.random((b, h, n, m)) < 0.3, seen, rng)
    dead = rng.random((b, h, n)) < 0.125  # about one query row in 8 attends to nothing ...
    dead.flat[rng.integers(dead.size)] = True  # ... at least one ...
    if dead.all():  # ... and never all of them (N = 1: a dead row in some heads, not all)
        dead.flat[rng.integers(dead.size)] = False
    masked[dead] = True
    if case.mask == "dead-bool":
        return ~masked  # (B, H, N, M)
    return np.where(masked, -np.inf, 0.0)  # (B, H, N, M)


def _with_one_per_row(masked: np.ndarray, seen: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Unmask in every row one random key among those the causal and window rules let it see
    (``seen`` (N, M)), so that no row is fully masked by chance."""
    weights = rng.random(masked.shape) * seen  # 0 where unseen, so argmax picks a seen key
    keep = np.argmax(weights, axis=-1)
    np.put_along_axis(masked, keep[..., None], False, axis=-1)
    return masked
