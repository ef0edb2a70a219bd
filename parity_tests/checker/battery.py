"""The batteries of cases the kernel checker runs: what each case exercises and how its inputs
are drawn.

A case is a shape plus the options of today's attention family (causal with its alignment, a
bool or float mask, scale, dropout, GQA, a window, softcap, ALiBi, packed variable-length
sequences) plus how the inputs are distributed. Inputs are drawn in float64 from a generator
seeded by (seed, case name), so a verdict is reproducible and does not depend on which other
cases run. Which spec can express which case is ``checker.specs``' business; what a case needs
from a kernel is ``Case.needs`` (the feature names of ``specs.FEATURES``).

Shape legend: B batch, H heads, H_kv key/value heads, N query length, M key/value length,
D head width, Dv value width; for a packed (varlen) case S sequences, T_q and T_k the packed
query and key token counts.

``DEFAULT`` is the battery behind the checker's verdict (``docs/kernel-verification.md`` lists what
each case is for); ``QUICK`` is a subset of it for ``--quick`` that still flags every pitfall;
``STRESS`` holds conditions where real kernels are known to drift (extreme logits), whose results
are findings, not verdicts; ``RING`` the self-attention cases of the distributed spec.

Tests: tests/checker/test_battery.py
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

MASKS = ("none", "bool", "float", "dead-bool", "dead-float")
INPUTS = ("gauss", "heavy")
ALIGNS = ("top-left", "bottom-right")
ALIBI = ("none", "H", "BH")
LAYOUTS = ("contiguous", "zigzag")


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
            "dead-float" (shape (B, H, N, M), with some query rows fully masked: golden 0).
        scale: None lets the kernel use 1 / sqrt(D).
        inputs: "gauss" (standard normal) or "heavy" (Student-t with 3 degrees of freedom, with
            outlier channels in q, k and v, as real activations have).
        logits: the typical magnitude of the scores q k^T * scale (q and k are scaled for it).
        dropout_p: the checker recovers the kernel's keep-mask (``kernels``).
        seqlens: for packed variable-length sequences, the (query, key) length of each
            sequence; lengths, never offsets, so the offsets are monotonic by construction.
        layout: how the distributed spec shards the sequence ("contiguous" or "zigzag").
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

    def __post_init__(self) -> None:
        for field, value, allowed in (
            ("mask", self.mask, MASKS),
            ("inputs", self.inputs, INPUTS),
            ("align", self.align, ALIGNS),
            ("alibi", self.alibi, ALIBI),
            ("layout", self.layout, LAYOUTS),
        ):
            if value not in allowed:
                raise ValueError(
                    f"case {self.name}: {field} must be one of {allowed}, got {value!r}"
                )
        if self.causal and self.mask != "none":
            raise ValueError(f"case {self.name}: SDPA takes is_causal or attn_mask, not both")
        if self.dropout_p and (self.mask != "none" or self.causal or self.value_width != self.m):
            raise ValueError(
                f"case {self.name}: a dropout case needs no mask and Dv == M, so that the "
                "checker can read the keep-mask back from the kernel (see calls.py)"
            )
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
        if self.mask != "none" or self.dropout_p:
            raise ValueError(f"case {self.name}: a packed case takes no mask and no dropout")

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
    def cu_seqlens(self) -> tuple[np.ndarray, np.ndarray]:
        """The cumulative offsets (S + 1,) of queries and keys: one sequence per batch element
        of an ordinary case, ``seqlens`` of a packed one."""
        lengths = self.seqlens or ((self.n, self.m),) * self.batch
        cu_q = np.concatenate([[0], np.cumsum([n for n, _ in lengths])]).astype(np.int64)
        cu_k = np.concatenate([[0], np.cumsum([m for _, m in lengths])]).astype(np.int64)
        return cu_q, cu_k

    @property
    def positioned(self) -> bool:
        """Whether query positions matter: causal, a window or ALiBi with N != M somewhere
        (then top-left and bottom-right differ)."""
        if not (self.causal or self.window is not None or self.alibi != "none"):
            return False
        return any(n != m for n, m in (self.seqlens or ((self.n, self.m),)))

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
    # Scores q k^T * scale have a spread of about sqrt(D) * scale for unit inputs; scale q and k
    # so that the spread is ``case.logits``.
    scale = 1.0 / math.sqrt(d) if case.scale is None else case.scale
    stretch = math.sqrt(case.logits / (math.sqrt(d) * scale))
    dout = rng.standard_normal(shapes[3])
    mask = None if case.packed else _draw_mask(rng, case)
    return CaseInputs(q * stretch, k * stretch, v, mask, dout, _slopes(case))


def _slopes(case: Case) -> np.ndarray | None:
    """ALiBi's usual geometric slopes 2^(-8 (h + 1) / H); per batch element they grow by half
    of themselves per element, so that a kernel reading row 0 for every element is wrong."""
    if case.alibi == "none":
        return None
    slopes = 2.0 ** (-8.0 * np.arange(1, case.heads + 1) / case.heads)  # (H,)
    if case.alibi == "H":
        return slopes
    return slopes[None, :] * (1.0 + 0.5 * np.arange(case.batch))[:, None]  # (B, H)


def _draw(rng: np.random.Generator, kind: str, shape: tuple[int, ...]) -> np.ndarray:
    if kind == "gauss":
        return rng.standard_normal(shape)
    # Unit-variance Student-t(3), with two outlier channels six times larger.
    values = rng.standard_t(3, shape) / math.sqrt(3.0)
    channels = rng.choice(shape[-1], size=2, replace=False)
    values[..., channels] *= 6.0
    return values


def _draw_mask(rng: np.random.Generator, case: Case) -> np.ndarray | None:
    b, h, n, m = case.batch, case.heads, case.n, case.m
    if case.mask == "none":
        return None
    if case.mask == "float":
        slopes = 2.0 ** -np.arange(1, h + 1)  # (H,)
        distance = np.abs(np.arange(n)[:, None] - np.arange(m)[None, :])  # (N, M)
        bias = -slopes[:, None, None] * distance  # (H, N, M)
        holes = _with_one_per_row(rng.random((h, n, m)) < 0.1, rng)
        return np.where(holes, -np.inf, bias)[None]  # (H, N, M) -> (1, H, N, M)
    if case.mask == "bool":
        masked = _with_one_per_row(rng.random((b, 1, n, m)) < 0.4, rng)
        return ~masked  # (B, 1, N, M), True = may attend
    masked = _with_one_per_row(rng.random((b, h, n, m)) < 0.3, rng)
    dead = rng.choice(n, size=max(1, n // 8), replace=False)
    masked[..., dead, :] = True  # these query rows attend to nothing
    if case.mask == "dead-bool":
        return ~masked  # (B, H, N, M)
    return np.where(masked, -np.inf, 0.0)  # (B, H, N, M)


def _with_one_per_row(masked: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Unmask one random key in every row, so that no row is fully masked by chance."""
    keep = rng.integers(0, masked.shape[-1], masked.shape[:-1])
    np.put_along_axis(masked, keep[..., None], False, axis=-1)
    return masked


BR = "bottom-right"
VARLEN_LENGTHS = ((37, 113), (1, 64), (64, 37), (20, 20))

DEFAULT: tuple[Case, ...] = (
    Case("single-query", 1, 1, 1, 37, 16),
    Case("plain", 2, 3, 37, 113, 64),
    Case("long-keys-d128", 1, 2, 113, 203, 128),
    Case("odd-d33", 2, 1, 203, 37, 33),
    Case("causal-square", 2, 2, 128, 128, 32, causal=True),
    Case("causal-n<m", 1, 2, 37, 113, 64, causal=True),
    Case("causal-n>m", 2, 1, 113, 37, 48, causal=True),
    Case("bool-mask", 2, 2, 37, 113, 64, mask="bool"),
    Case("float-mask", 1, 3, 113, 128, 64, mask="float"),
    Case("dead-rows-bool", 2, 2, 37, 64, 32, mask="dead-bool"),
    Case("dead-rows-float", 1, 2, 37, 64, 32, mask="dead-float"),
    Case("scale-1/d", 2, 2, 37, 113, 64, scale=1.0 / 64),
    # Dv != D with the default scale: the scale is 1 / sqrt(D), never 1 / sqrt(Dv).
    Case("dv>d", 2, 2, 37, 113, 32, dv=64),
    Case("dv<d", 1, 3, 113, 37, 64, dv=16),
    Case("large-logits", 1, 2, 113, 113, 64, logits=30.0),
    Case("heavy-tailed", 2, 2, 128, 128, 64, causal=True, inputs="heavy"),
    Case("dropout", 2, 2, 37, 64, 64, dropout_p=0.3),
    # GQA: 2 and 1 KV heads of 4 (the group sums of dK and dV are judged).
    Case("gqa-2of4", 2, 4, 37, 113, 32, heads_kv=2),
    Case("gqa-1of4-causal", 1, 4, 64, 64, 32, causal=True, heads_kv=1),
    # Bottom-right causal (flash-attn's): N < M, N > M (the first N - M rows see nothing), and
    # one decode step against a long cache.
    Case("causal-br-n<m", 1, 2, 37, 113, 64, causal=True, align=BR),
    Case("causal-br-n>m", 2, 1, 113, 37, 48, causal=True, align=BR),
    Case("decode-n1", 2, 4, 1, 203, 64, causal=True, align=BR, heads_kv=2),
    # Windows: one-sided (a causal sliding window), two-sided with each alignment.
    Case("window-causal", 2, 2, 128, 128, 32, causal=True, window=(16, None)),
    Case("window-br", 1, 2, 37, 113, 32, window=(8, 5), align=BR),
    Case("window-tl", 1, 2, 113, 37, 32, window=(4, 9)),
    # Softcap at logits that it actually bends (spread 30 against a cap of 5), alone and with
    # what it meets in models, in the pipeline's order (cap, then ALiBi, then the masks): a
    # causal sliding window bottom-right (Gemma 2's sliding layers), and ALiBi.
    Case("softcap", 1, 2, 64, 64, 64, softcap=5.0, logits=30.0),
    Case("softcap-window", 2, 2, 64, 96, 32, causal=True, window=(24, None), softcap=2.0,
         logits=30.0, align=BR),
    Case("softcap-alibi", 1, 4, 37, 113, 32, softcap=5.0, logits=30.0, alibi="H", align=BR),
    # ALiBi per head and per batch element; causal with N < M is where flash-attn's lse
    # convention differs from the golden's (docs/derivations/alibi.md).
    Case("alibi-h", 2, 4, 37, 113, 32, alibi="H", align=BR),
    Case("alibi-bh-causal", 2, 2, 37, 113, 32, causal=True, alibi="BH", align=BR),
    # Packed variable-length sequences, unequal lengths and a length-1 sequence.
    Case("varlen", 4, 2, 122, 234, 32, seqlens=VARLEN_LENGTHS),
    Case("varlen-causal-gqa", 4, 4, 122, 234, 32, causal=True, align=BR, heads_kv=2,
         seqlens=VARLEN_LENGTHS),
)  # fmt: skip

QUICK: tuple[Case, ...] = tuple(
    case
    for case in DEFAULT
    if case.name
    in (
        "plain",
        "causal-n<m",
        "bool-mask",
        "float-mask",
        "dead-rows-bool",
        "scale-1/d",
        "dv>d",
        "heavy-tailed",
        "dropout",
        "gqa-2of4",
        "causal-br-n<m",
        "window-causal",
        "softcap",
        "softcap-alibi",
        "alibi-h",
        "alibi-bh-causal",
        "varlen",
    )
)

STRESS: tuple[Case, ...] = (
    Case("logits-1e3", 1, 2, 113, 113, 64, logits=1e3),
    Case("logits-1e4", 1, 2, 113, 113, 64, logits=1e4),
    Case("logits-1e6", 1, 2, 113, 113, 64, logits=1e6),
    Case("causal-logits-1e3", 1, 2, 113, 113, 64, causal=True, logits=1e3),
    Case("long-1024", 1, 1, 1024, 1024, 64, causal=True),
    Case("d256", 1, 2, 113, 203, 256),
    Case("heavy-logits-100", 2, 2, 128, 128, 64, inputs="heavy", logits=100.0),
)

# Self-attention (N = M) for the distributed spec; 48 positions split into 2W equal chunks for
# W in 2, 3, 4, 6 (zigzag) and more (contiguous).
RING: tuple[Case, ...] = (
    Case("ring-plain", 2, 2, 48, 48, 16),
    Case("ring-causal", 2, 2, 48, 48, 16, causal=True),
    Case("ring-causal-zigzag", 2, 2, 48, 48, 16, causal=True, layout="zigzag"),
    Case("ring-gqa", 1, 4, 48, 48, 16, heads_kv=2, causal=True),
    Case("ring-window", 1, 2, 48, 48, 16, window=(5, 3), layout="zigzag"),
    Case("ring-softcap", 1, 2, 48, 48, 16, softcap=2.0, logits=5.0, causal=True),
)

BATTERIES = {"default": DEFAULT, "quick": QUICK, "stress": STRESS, "ring": RING}


def resolve(cases: str | Sequence[Case | str] | None) -> tuple[Case, ...]:
    """The cases named by ``cases``: None (the default battery), a battery name ("default",
    "quick", "stress", "ring"), or a sequence of ``Case`` objects and case names from any
    battery."""
    if cases is None:
        return DEFAULT
    if isinstance(cases, str):
        if cases not in BATTERIES:
            raise ValueError(
                f"cases must be one of {sorted(BATTERIES)} or a sequence, got {cases!r}"
            )
        return BATTERIES[cases]
    by_name = {case.name: case for case in DEFAULT + STRESS + RING}
    resolved = []
    for case in cases:
        if isinstance(case, Case):
            resolved.append(case)
        elif isinstance(case, str) and case in by_name:
            resolved.append(by_name[case])
        else:
            raise ValueError(f"unknown case {case!r}; known: {sorted(by_name)}")
    if not resolved:
        raise ValueError("cases is empty")
    names = [case.name for case in resolved]
    if len(set(names)) != len(names):
        repeated = sorted({name for name in names if names.count(name) > 1})
        raise ValueError(f"cases has repeated names: {repeated}")
    return tuple(resolved)
