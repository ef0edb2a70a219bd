"""The batteries of cases the kernel checker runs: what each case exercises and how its inputs
are drawn.

A case is a shape plus the options of ``F.scaled_dot_product_attention`` (causal, a bool or float
``attn_mask``, ``scale``, ``dropout_p``) plus how the inputs are distributed. Inputs are drawn in
float64 from a generator seeded by (seed, case name), so a verdict is reproducible and does not
depend on which other cases run.

Shape legend: B batch, H heads, N query length, M key/value length, D head width, Dv value width.

``DEFAULT`` is the battery behind the checker's verdict (``docs/kernel-verification.md`` lists what
each case is for); ``QUICK`` is a subset of it for ``--quick`` that still flags every pitfall;
``STRESS`` holds conditions where real kernels are known to drift (extreme logits), whose results
are findings, not verdicts.

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


@dataclass(frozen=True)
class Case:
    """One configuration of the kernel's arguments and inputs.

    Attributes:
        name: unique, used in reports and to seed the inputs.
        batch, heads, n, m, d: B, H, N, M, D.
        dv: Dv, the value head width; None means D.
        causal: passed as ``is_causal`` (top-left aligned, query i sees keys j <= i).
        mask: "none"; "bool" (random, True = may attend, shape (B, 1, N, M)); "float" (an
            ALiBi-like additive bias with -inf holes, shape (1, H, N, M)); "dead-bool" and
            "dead-float" (shape (B, H, N, M), with some query rows fully masked: golden 0).
        scale: passed as ``scale``; None lets the kernel use 1 / sqrt(D).
        inputs: "gauss" (standard normal) or "heavy" (Student-t with 3 degrees of freedom, with
            outlier channels in q, k and v, as real activations have).
        logits: the typical magnitude of the scores q k^T * scale (q and k are scaled for it).
        dropout_p: passed as ``dropout_p``; the checker recovers the kernel's keep-mask.
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

    def __post_init__(self) -> None:
        if self.mask not in MASKS:
            raise ValueError(f"case {self.name}: mask must be one of {MASKS}, got {self.mask!r}")
        if self.inputs not in INPUTS:
            raise ValueError(
                f"case {self.name}: inputs must be one of {INPUTS}, got {self.inputs!r}"
            )
        if self.causal and self.mask != "none":
            raise ValueError(f"case {self.name}: SDPA takes is_causal or attn_mask, not both")
        if self.dropout_p and (self.mask != "none" or self.causal or self.value_width != self.m):
            raise ValueError(
                f"case {self.name}: a dropout case needs no mask and Dv == M, so that the "
                "checker can read the keep-mask back from the kernel (see kernels.py)"
            )

    @property
    def value_width(self) -> int:
        """Dv."""
        return self.d if self.dv is None else self.dv

    @property
    def shape(self) -> dict[str, int]:
        """The sizes of the case by legend letter: B, H, N, M, D, Dv."""
        return {
            "B": self.batch,
            "H": self.heads,
            "N": self.n,
            "M": self.m,
            "D": self.d,
            "Dv": self.value_width,
        }


class CaseInputs(NamedTuple):
    """float64 inputs of one case; ``attn_mask`` is bool, float64 or None."""

    q: np.ndarray  # (B, H, N, D)
    k: np.ndarray  # (B, H, M, D)
    v: np.ndarray  # (B, H, M, Dv)
    attn_mask: np.ndarray | None  # broadcasts to (B, H, N, M)
    dout: np.ndarray  # (B, H, N, Dv), the random upstream gradient


def make_inputs(case: Case, seed: int) -> CaseInputs:
    """The float64 inputs of ``case`` for ``seed``; the same (case, seed) gives the same arrays."""
    rng = np.random.default_rng([seed, zlib.crc32(case.name.encode())])
    b, h, n, m, d, dv = case.batch, case.heads, case.n, case.m, case.d, case.value_width
    q, k, v = (
        _draw(rng, case.inputs, (b, h, length, width))
        for length, width in ((n, d), (m, d), (m, dv))
    )
    # Scores q k^T * scale have a spread of about sqrt(D) * scale for unit inputs; scale q and k
    # so that the spread is ``case.logits``.
    scale = 1.0 / math.sqrt(d) if case.scale is None else case.scale
    stretch = math.sqrt(case.logits / (math.sqrt(d) * scale))
    dout = rng.standard_normal((b, h, n, dv))
    return CaseInputs(q * stretch, k * stretch, v, _draw_mask(rng, case), dout)


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
)

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

BATTERIES = {"default": DEFAULT, "quick": QUICK, "stress": STRESS}


def resolve(cases: str | Sequence[Case | str] | None) -> tuple[Case, ...]:
    """The cases named by ``cases``: None (the default battery), a battery name ("default",
    "quick", "stress"), or a sequence of ``Case`` objects and case names from any battery."""
    if cases is None:
        return DEFAULT
    if isinstance(cases, str):
        if cases not in BATTERIES:
            raise ValueError(
                f"cases must be one of {sorted(BATTERIES)} or a sequence, got {cases!r}"
            )
        return BATTERIES[cases]
    by_name = {case.name: case for case in DEFAULT + STRESS}
    resolved = []
    for case in cases:
        if isinstance(case, Case):
            resolved.append(case)
        elif case in by_name:
            resolved.append(by_name[case])
        else:
            raise ValueError(f"unknown case {case!r}; known: {sorted(by_name)}")
    if not resolved:
        raise ValueError("cases is empty")
    return tuple(resolved)
