"""The cases of the linear-attention specs ("fla_gdn", "fla_kda"): the gated delta rule as a
recurrence over tokens, with one gate per head (gated DeltaNet) or per key channel (KDA)
(docs/derivations/linear-attention.md), what one call holds, how its inputs are drawn, and the
default battery built for the features a kernel claims.

A linear case is token-major, as flash-linear-attention's kernels are: q, k (B, T, H, K), v
(B, T, H, V), log-gates g (B, T, H), or (B, T, H, K) for KDA (``VARIANTS``), write strengths beta
(B, T, H), a state (N, H, K, V) per sequence.
Without varlen, B = 2 sequences of ``length`` tokens each; with it, B = 1 and three sequences are
packed along T by ``cu_seqlens``: 17 tokens, 1 token (a sequence whose first state is its last),
then ``length`` tokens, which start off a chunk edge of the packed tensor. The lengths cross the
64-token chunks of the chunked kernels (1, 63, 64, 65, 129).

The inputs are drawn as the layers make them: q and k L2-normalized per token and head (Qwen3-
Next's ``GatedDeltaNet`` normalizes them; the delta rule is stable for beta |k|^2 <= 2); v
standard normal; the gate by ``GATES``: "typical" (g in [-0.7, -0.02]), "near_zero" (g ~ -1e-4:
the gate -> 1, nothing is forgotten, flash-linear-attention #389), "negative" (typical, with g =
-20 on every 5th token from the first: the state all but wiped, at each chunk start too, and a
64-token chunk's cumulative log-gate near -260, where a chunked kernel's float32 rounding of it
is what ``judge.linear``'s chunk allowance admits), and
for KDA's per-channel gate "channels" (``KDA_GATES``: the key channels in three groups by
channel mod 3, near 0, typical, and typical with -20 on every 8th token from the channel's own
offset, so that channels forget at different tokens and some all but nothing); beta
by ``BETAS``: "typical" (0.05 .. 0.95) or "extremes" (a third of the tokens exactly 0, a third
exactly 1); an initial state of spread 1 when the case has one; random upstream gradients for o
and for the final state.

The battery (``default_battery``) is the covering array of the spec's factors (``battery.pairs``,
as every spec's) for the claimed features, each row given the key width that meets the most
requirements still unmet (``Spec.requirements``: every width of ``spec.widths``); a requirement
no row met gets a row of its own.

Shape legend: B batch, T tokens, H heads, K key width, V value width, N states (sequences).

Tests: tests/checker/specs/test_linear.py
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

if TYPE_CHECKING:
    pass

# Each spec's recurrence: the name of numpy_attention.linear_attention's pair and of the twin's.
VARIANTS = {"fla_gdn": "gated_delta_rule", "fla_kda": "kda"}
LINEAR_SPECS = tuple(VARIANTS)
GATES = ("typical", "near_zero", "negative")
KDA_GATES = (*GATES, "channels")  # a gate that differs across the key channels
BETAS = ("typical", "extremes")
CHUNK = 64  # the chunk of flash-linear-attention's chunked kernels
LENGTHS = (1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK + 1)
PACKED_BEFORE = (17, 1)  # the sequences packed before the case's own with varlen
NEGATIVE_GATE = -20.0
NEAR_ZERO_GATE = -1e-4
WIPE_EVERY = 5  # the tokens of NEGATIVE_GATE: 13 per 64-token chunk, |G| near 260
CHANNEL_WIPE_EVERY = 8  # the tokens of NEGATIVE_GATE in the "channels" gate's third group


@dataclass(frozen=True)
class LinearCase:
    """One gated-delta-rule call: the spec's arguments and how its inputs are drawn.

    Attributes:
        name: unique; seeds the inputs.
        spec: "fla_gdn" or "fla_kda" (``VARIANTS``: its recurrence, and g's shape).
        seqlens: the tokens of each sequence (without varlen all equal: one per batch row).
        varlen: the sequences packed along T (B = 1) with ``cu_seqlens``.
        heads, k, v: H, K, V.
        gate: how g is drawn (``GATES``; ``KDA_GATES`` for "fla_kda").
        beta: how beta is drawn (``BETAS``).
        initial_state: an initial state is given.
        scale: ``scale``; None for the default K^-0.5.
    """

    name: str
    spec: str
    seqlens: tuple[int, ...]
    varlen: bool
    heads: int
    k: int
    v: int
    gate: str = "typical"
    beta: str = "typical"
    initial_state: bool = False
    scale: float | None = None

    def __post_init__(self) -> None:
        gates = KDA_GATES if self.per_channel else GATES
        if self.spec not in LINEAR_SPECS or self.gate not in gates or self.beta not in BETAS:
            raise ValueError(f"case {self.name}: spec in {LINEAR_SPECS}, gate in {gates}, "
                             f"beta in {BETAS}")  # fmt: skip
        if not self.seqlens or min(self.seqlens) < 1 or min(self.heads, self.k, self.v) < 1:
            raise ValueError(f"case {self.name}: every sequence, H, K and V at least 1")
        if not self.varlen and len(set(self.seqlens)) != 1:
            raise ValueError(f"case {self.name}: without varlen every sequence has one length")

    @property
    def variant(self) -> str:
        """The recurrence: "gated_delta_rule" or "kda" (``VARIANTS``)."""
        return VARIANTS[self.spec]

    @property
    def per_channel(self) -> bool:
        """g has one gate per key channel, (B, T, H, K) (KDA), not one per head."""
        return self.spec == "fla_kda"

    @property
    def needs(self) -> frozenset[str]:
        """The features a kernel must have to run this case."""
        needs = {"varlen": self.varlen, "initial_state": self.initial_state}
        return frozenset(name for name, held in needs.items() if held)

    @property
    def batch(self) -> int:
        return 1 if self.varlen else len(self.seqlens)

    @property
    def tokens(self) -> int:
        """T: every sequence's tokens packed (varlen), else one sequence's."""
        return sum(self.seqlens) if self.varlen else self.seqlens[0]

    @property
    def cu_seqlens(self) -> tuple[int, ...] | None:
        """The (N + 1,) offsets of the packed sequences, None without varlen."""
        if not self.varlen:
            return None
        return (0, *np.cumsum(self.seqlens).tolist())

    @property
    def shape(self) -> dict[str, int]:
        """The sizes by legend letter, as the reports show every case's."""
        return {"B": self.batch, "T": self.tokens, "H": self.heads, "K": self.k, "V": self.v,
                "N": len(self.seqlens)}  # fmt: skip


class LinearInputs(NamedTuple):
    """A case's float64 inputs (``initial_state`` None when off), its upstream gradients and its
    offsets (None without varlen)."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    g: np.ndarray
    beta: np.ndarray
    initial_state: np.ndarray | None
    dout: np.ndarray
    dfinal_state: np.ndarray
    cu_seqlens: np.ndarray | None


def make_linear_inputs(case: LinearCase, seed: int) -> LinearInputs:
    """The inputs of ``case`` for ``seed``; the same (case, seed) gives the same arrays."""
    rng = np.random.default_rng([seed, zlib.crc32(case.name.encode())])
    b, t, h = case.batch, case.tokens, case.heads
    q = _l2_normalized(rng.standard_normal((b, t, h, case.k)))
    k = _l2_normalized(rng.standard_normal((b, t, h, case.k)))
    v = rng.standard_normal((b, t, h, case.v))
    g = _gates(case.gate, rng, (b, t, h, case.k) if case.per_channel else (b, t, h))
    beta = _betas(case.beta, rng, (b, t, h))
    states = (len(case.seqlens), h, case.k, case.v)
    initial = rng.standard_normal(states) if case.initial_state else None
    dout = rng.standard_normal((b, t, h, case.v))
    dfinal = rng.standard_normal(states)
    offsets = None if case.cu_seqlens is None else np.array(case.cu_seqlens, dtype=np.int64)
    return LinearInputs(q, k, v, g, beta, initial, dout, dfinal, offsets)


def _l2_normalized(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _gates(kind: str, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Log-gates (B, T, H), or (B, T, H, K) per key channel, of ``kind`` (``KDA_GATES``)."""
    if kind == "near_zero":
        return NEAR_ZERO_GATE * rng.uniform(0.5, 1.5, shape)
    g = rng.uniform(-0.7, -0.02, shape)
    if kind == "negative":  # the state all but wiped at the first token and every 5th after
        g[:, ::WIPE_EVERY] = NEGATIVE_GATE
    if kind == "channels":  # (B, T, H, K): channel c near 0, typical, or wiped, by c mod 3
        g[..., 0::3] = NEAR_ZERO_GATE * rng.uniform(0.5, 1.5, g[..., 0::3].shape)
        for c in range(2, shape[-1], 3):  # wiped every 8th token, from the channel's offset
            g[:, c % CHANNEL_WIPE_EVERY :: CHANNEL_WIPE_EVERY, :, c] = NEGATIVE_GATE
    return g


def _betas(kind: str, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Write strengths (B, T, H) of ``kind`` (``BETAS``)."""
    beta = rng.uniform(0.05, 0.95, shape)
    if kind == "extremes":  # exactly 0 (no write) and exactly 1 (a full overwrite)
        pick = rng.integers(3, size=shape)
        beta = np.where(pick == 0, 0.0, np.where(pick == 1, 1.0, beta))
    return beta


def seqlens_of(length: int, varlen: bool) -> tuple[int, ...]:
    """The sequences of a case whose own sequence has ``length`` tokens."""
    return (*PACKED_BEFORE, length) if varlen else (length, length)


class Requirement(NamedTuple):
    """A size a linear battery must hold: key width K = ``value``."""

    label: str
    kind: str
    value: int

    def met(self, case: LinearCase) -> bool:
        return case.k == self.value
