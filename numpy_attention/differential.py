"""Differential attention (the Differential Transformer, Hugging Face's ``diffllama``): each pair
of query heads (h, h + H/2) subtracts its second head's attention from its first's, weighted by a
learned scalar lambda, and the difference is RMS-normed without a weight.

The values each query head reads. The H_kv value heads are cut into two halves and laid side by
side, head c of the first half beside head c of the second (c < H_kv / 2), and that pair is
repeated to fill the H_kv heads again:

    V'_j = [v_(j mod H_kv/2) | v_(H_kv/2 + j mod H_kv/2)]       (B, H_kv, M, 2D)

so query head h, whose key head is j = h // (H / H_kv) (GQA's grouping), reads 2D-wide values
through its one softmax map: O_h = P_h V'_j, (B, H, N, 2D). Then, for h < H/2:

    lambda_1 = exp(sum(lambda_q1 * lambda_k1));  lambda_2 = exp(sum(lambda_q2 * lambda_k2))
    lambda   = lambda_1 - lambda_2 + lambda_init
    C_h      = O_h - lambda * O_(h + H/2)                        (B, H/2, N, 2D)
    Y_h      = (1 - lambda_init) * C_h / sqrt(mean(C_h^2) + eps) (over each head's 2D)

Y (B, H/2, N, 2D) merges into (B, N, H*D), o_proj's input. ``lambda_init`` is a constant of the
layer; the model sets it from the layer's depth, ``lambda_init_from_depth``.

Shape legend: B batch, H query heads, H_kv key/value heads (even), N queries, M keys, D head
width.

Derivation: docs/derivations/differential.md.
Tests: tests/numpy_attention/test_differential.py; in the layer,
tests/numpy_attention/test_grouped.py.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from . import validation
from .norms import NormCtx, rmsnorm_backward, rmsnorm_forward

__all__ = [
    "LAMBDA_NAMES",
    "DifferentialCtx",
    "check_differential",
    "differential_backward",
    "differential_forward",
    "differential_values_backward",
    "differential_values_forward",
    "lambda_init_from_depth",
]

LAMBDA_NAMES = ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")  # Hugging Face's names
LAMBDA_STD = 0.1  # the lambda vectors' initial std (DiffLlama's default lambda_std_dev)


def lambda_init_from_depth(layer_idx: int) -> float:
    """The Differential Transformer's lambda_init of layer ``layer_idx`` (counted from 0), as
    DiffLlama computes it: 0.8 - 0.6 * exp(-0.3 * layer_idx)."""
    layer_idx = validation.non_negative_int("layer_idx", layer_idx)
    return 0.8 - 0.6 * math.exp(-0.3 * layer_idx)


def check_differential(
    differential: Any,
    lambda_init: Any,
    eps: Any,
    num_kv_heads: int,
    *,
    output_gate: str | None,
    output_norm: bool,
    dropout: float,
) -> float | None:
    """The differential options checked against each other and the layer's; its lambda_init
    (None: no differential attention) returned. Options given without ``differential`` are
    refused (they would do nothing), and so are the combinations no model has."""
    differential = validation.flag("differential", differential)
    eps = validation.finite_real("differential_eps", eps)
    if eps <= 0:
        raise ValueError(f"differential_eps must be > 0, got {eps}")
    if not differential:
        if lambda_init is not None or eps != 1e-6:
            raise ValueError(
                f"lambda_init={lambda_init!r} and differential_eps={eps} describe differential "
                "attention, but differential is False"
            )
        return None
    if lambda_init is None:
        raise ValueError(
            "differential attention needs lambda_init (a float; DiffLlama's is "
            "lambda_init_from_depth(layer_idx))"
        )
    if num_kv_heads % 2:
        raise ValueError(
            f"differential attention splits the value heads in two halves: num_kv_heads must "
            f"be even, got {num_kv_heads}"
        )
    others = {"output_gate": output_gate, "output_norm": output_norm, "dropout": dropout}
    given = [f"{name}={value!r}" for name, value in others.items() if value]
    if given:
        raise ValueError(
            f"differential attention with {', '.join(given)}: no model has both (DiffLlama "
            "refuses attention dropout: two softmax maps share no dropout mask), and where a "
            "gate or a norm would go beside its own norm would be a guess"
        )
    return validation.finite_real("lambda_init", lambda_init)


# -- the values: both halves of the value heads, side by side -----------------------------------


def differential_values_forward(v: np.ndarray) -> np.ndarray:
    """V'_j = [v_(j mod H_kv/2) | v_(H_kv/2 + j mod H_kv/2)]: v (B, H_kv, M, D) -> (B, H_kv, M,
    2D). A linear map without a ctx (its backward needs only the shape)."""
    half = v.shape[1] // 2
    pair = np.concatenate([v[:, :half], v[:, half:]], axis=-1)  # (B, H_kv/2, M, 2D)
    return np.concatenate([pair, pair], axis=1)  # -> (B, H_kv, M, 2D)


def differential_values_backward(dvalues: np.ndarray) -> np.ndarray:
    """dv_c = sum over the heads j with j mod H_kv/2 = c of dV'_j's first D coordinates, and
    dv_(H_kv/2 + c) of their last D: (B, H_kv, M, 2D) -> (B, H_kv, M, D)."""
    b, heads, m, width = dvalues.shape
    dpair = dvalues.reshape(b, 2, heads // 2, m, width).sum(axis=1)  # forward: [pair, pair]
    return np.concatenate([dpair[..., : width // 2], dpair[..., width // 2 :]], axis=1)


# -- the difference of the paired heads, normed ---------------------------------------------------


class DifferentialCtx(NamedTuple):
    second: np.ndarray  # O_(h + H/2), the subtracted heads, (B, H/2, N, 2D)
    lambdas: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # q1, k1, q2, k2, (D,)
    lambda_1: np.ndarray  # exp(sum(q1 * k1)), a 0-d array
    lambda_2: np.ndarray
    lambda_full: np.ndarray  # lambda_1 - lambda_2 + lambda_init
    norm: NormCtx  # the weightless RMSNorm's
    lambda_init: float


def differential_forward(
    heads: np.ndarray,
    lambdas: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    lambda_init: float,
    eps: float,
) -> tuple[np.ndarray, DifferentialCtx]:
    """Y_h = (1 - lambda_init) * rmsnorm(O_h - lambda * O_(h + H/2)), for h < H/2.

    Args:
        heads: O (B, H, N, 2D), each query head's attention over ``differential_values``.
        lambdas: lambda_q1, lambda_k1, lambda_q2, lambda_k2, each (D,), in heads' dtype.
        lambda_init: the layer's constant.
        eps: > 0, the norm's.

    Returns:
        Y (B, H/2, N, 2D) in heads' dtype and the backward's ctx.
    """
    q1, k1, q2, k2 = lambdas
    lambda_1 = np.exp(np.sum(q1 * k1))
    lambda_2 = np.exp(np.sum(q2 * k2))
    lambda_full = lambda_1 - lambda_2 + lambda_init  # a 0-d array of heads' dtype
    half = heads.shape[1] // 2
    first, second = heads[:, :half], heads[:, half:]  # (B, H/2, N, 2D) each
    diff = first - lambda_full * second
    ones = np.ones(heads.shape[-1], dtype=heads.dtype)  # the norm has no weight
    normed, norm = rmsnorm_forward(diff, ones, eps)
    out = (1 - lambda_init) * normed
    return out, DifferentialCtx(second, lambdas, lambda_1, lambda_2, lambda_full, norm, lambda_init)


def differential_backward(
    dout: np.ndarray, ctx: DifferentialCtx
) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """dC = rmsnorm^T((1 - lambda_init) dY);  dO_h = dC_h, dO_(h + H/2) = -lambda dC_h;
    dlambda = -sum(dC * O_(h + H/2));  dlambda_q1 = dlambda lambda_1 lambda_k1,
    dlambda_k1 = dlambda lambda_1 lambda_q1, dlambda_q2 = -dlambda lambda_2 lambda_k2,
    dlambda_k2 = -dlambda lambda_2 lambda_q2.

    Derivation: docs/derivations/differential.md.

    Args:
        dout: (B, H/2, N, 2D), the gradient of Y.
        ctx: ``differential_forward``'s.

    Returns:
        dO (B, H, N, 2D) and the gradients of lambda_q1, lambda_k1, lambda_q2, lambda_k2.
    """
    second, (q1, k1, q2, k2), lambda_1, lambda_2, lambda_full, norm, lambda_init = ctx
    dout = validation.grad_output(dout, second.shape, second.dtype)
    ddiff, _ = rmsnorm_backward((1 - lambda_init) * dout, norm)  # forward: (1 - li) * norm(C)
    dfirst, dsecond = ddiff, -lambda_full * ddiff  # forward: C = O_1 - lambda * O_2
    dlambda = -np.sum(ddiff * second)
    dq1, dk1 = dlambda * lambda_1 * k1, dlambda * lambda_1 * q1  # lambda_1 = exp(q1 . k1)
    dq2, dk2 = -dlambda * lambda_2 * k2, -dlambda * lambda_2 * q2  # lambda = ... - lambda_2
    dheads = np.concatenate([dfirst, dsecond], axis=1)  # -> (B, H, N, 2D)
    return dheads, (dq1, dk1, dq2, dk2)
