"""The tolerance constants of the parity suite, shared by pytest and the CLI.

Every error is norm-wise relative and per tensor: ``max |actual - expected| / max |expected|``,
each tensor (an output, an input's gradient, one parameter's gradient) on its own scale, never on
the scale of another tensor of the same run. Element-wise relative error is avoided on purpose:
attention outputs and gradients have entries near zero, where an element-wise ratio measures
nothing but rounding noise. The one exception is a tensor that is structurally zero (zero in exact
arithmetic, so both sides hold rounding noise): it is judged on a floor, the scale of the tensor
whose rounding it carries, named per case in ``structural_floors``
(docs/parity.md, "Error measure").

Tests: tests/parity/test_tolerances.py, tests/parity/test_run.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from numpy_attention.gradcheck import GRADCHECK_RTOL as GRADCHECK_RTOL

# float64 against float64 (NumPy hand-derived backward vs torch autograd): both sides round at
# eps64 = 2.2e-16 and reductions of up to ~1e4 terms grow that by at most ~1e2-1e3, so 1e-10 leaves
# a wide margin while a wrong term in a backward shows up at 1e-3 or worse.
FLOAT64_RTOL = 1e-10

# Finite differences (GRADCHECK_RTOL, imported above) is defined beside the tool that uses it,
# numpy_attention.gradcheck, which cannot import this package; its reasoning is there.

# float32 against float32 (NumPy vs torch, same weights and inputs). Measured on the functional
# core (B, H, N, M, D) in {(2,3,37,113,16), (1,1,203,128,64), (2,4,128,128,128)}, causal, 20 seeds:
# the worst NumPy-f32 vs torch-f32 error was 1.4e-6 (on dk), each side about 1e-6 from float64.
# Layers add projections and weight gradients that sum over B*N rows (up to ~1e3 terms), each
# growing the rounding error by up to ~sqrt(terms). 2e-5 is ~170 eps32 (eps32 = 1.19e-7): above
# rounding with margin, and still 50x below what a wrong mask or a missing rescale produces.
FLOAT32_RTOL = 2e-5

# float16 results computed in float32 and rounded once to float16 (the NumPy core's float16
# path), against a float64 golden computed on the same float16 inputs. One rounding moves an entry
# by at most half a float16 ulp, 2^-11 = 4.9e-4 of its value, so the norm-wise error is at most
# 2^-11 plus the float32 error (~1e-6). Measured (docs/parity.md, "float16"): worst 4.79e-4 over
# out, dq, dk, dv of the dense and tiled paths, 5 shapes x 4 options x 40 seeds. 1e-3 is twice the
# bound (torch.testing's float16 default rtol too), and still below the subtlest wrong mask: one
# query of 37 seeing one future key of 113 reads 8e-3 to 6e-2. It holds while the tensor's largest
# entry is a normal float16 (>= 6.1e-5); below that, float16's spacing is absolute. bfloat16 has
# no NumPy dtype: the kernel checker's policy judges it.
FLOAT16_RTOL = 1e-3

# The absorbed and the expanded computations of MultiHeadLatentAttention, both in float64: the
# same sums in another order (q_nope . (W_UK c) against (W_UK^T q_nope) . c), so they differ by
# rounding alone, ~1e-15 on tiny layers (docs/derivations/latent.md); 1e-12 is the contract's
# bound (docs/design.md, "Latent attention"), a wrong term shows at 1e-3 or worse.
LATENT_FORMS_RTOL = 1e-12

RTOL = {
    np.dtype(np.float64): FLOAT64_RTOL,
    np.dtype(np.float32): FLOAT32_RTOL,
    np.dtype(np.float16): FLOAT16_RTOL,
}


def rel_error(actual: np.ndarray, expected: np.ndarray, scale: float = 0.0) -> float:
    """Norm-wise relative error ``max |actual - expected| / max(max |expected|, scale)``.

    With the default ``scale=0`` the tensor is judged on its own scale, the suite's rule. A
    positive ``scale`` is a floor for a tensor that is structurally zero (its exact value is 0:
    the key projection's bias gradient; the query and key paths when no query sees two keys), and
    the caller names the tensor whose scale it is (``structural_floors``); it is never
    the largest gradient of a run, which would hide errors in every smaller gradient. Both
    exactly zero reads 0; ``actual`` nonzero against an all-zero ``expected`` with no floor reads
    inf. NaN or inf in ``actual`` (``expected`` finite) reads inf; a NaN or inf in ``expected``
    reads NaN: neither is ever within a tolerance.
    """
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    if actual.shape != expected.shape:
        raise ValueError(f"shapes differ: actual {actual.shape}, expected {expected.shape}")
    if not np.all(np.isfinite(expected)):
        return float("nan")  # nothing to be close to: never within a tolerance
    if not np.all(np.isfinite(actual)):
        return float("inf")
    max_abs = float(np.max(np.abs(actual - expected), initial=0.0))
    scale = max(float(np.max(np.abs(expected), initial=0.0)), scale)
    if scale == 0.0:
        return 0.0 if max_abs == 0.0 else float("inf")
    return max_abs / scale


def rtol_for(dtype: Any) -> float:
    """The parity tolerance for a NumPy or torch float dtype (float64, float32 or float16).

    ``ValueError`` for any other dtype (bfloat16 included): judge those with the kernel checker's
    policy, relative to a same-dtype baseline.
    """
    name = str(dtype)
    try:
        resolved = np.dtype(name.removeprefix("torch.") if name.startswith("torch.") else dtype)
    except TypeError:
        resolved = None  # a dtype NumPy does not know, such as torch.bfloat16
    if resolved not in RTOL:
        raise ValueError(f"no parity tolerance for dtype {name}; use the kernel checker's policy")
    return RTOL[resolved]


def at_most_one_key(allowed: np.ndarray | None, m: int) -> bool:
    """True when no query row may attend to two or more of the ``m`` keys.

    ``allowed`` is a bool "may attend" mask broadcasting to the scores (..., N, M), or None when
    every key is visible. Softmax of a single entry is the constant 1, so when this holds the
    gradients of the scores, and with them the whole query and key paths, are exactly zero.
    """
    if allowed is None:
        return m <= 1
    return int(np.max(np.sum(allowed, axis=-1), initial=0)) <= 1


def structural_floors(grads: Mapping[str, np.ndarray], *, one_key: bool) -> dict[str, float]:
    """The floor of each gradient in ``grads`` that is structurally zero, and only of those.

    ``grads`` maps state-dict names (and ``dx``, ``dy`` for the inputs) to the reference
    gradients. A structurally zero gradient is exactly 0 in exact arithmetic, so both sides hold
    the rounding noise of a sum that cancels, and its own scale is that noise. It is judged on the
    scale of the gradient whose rounding it carries:

    - ``<prefix>W_key.bias``, always: dk summed over keys, and each row of dS sums to 0 (softmax
      ignores a constant added to a row of scores, such as q . b_key). Floor: the same
      projection's ``<prefix>W_key.weight`` gradient, the other sum over the same dk rows.
    - when ``one_key`` (no query sees two keys: ``at_most_one_key``, or for a layer case
      ``parity.run.one_key_per_query``): dS = 0, so the whole query and key paths are 0:
      ``W_query``, ``W_key`` (weight and bias), ``Wq``, and ``dx`` of cross attention (x feeds
      only the queries there). Floor: the value path beside them (``W_value``, ``Wkv`` whose
      value rows are nonzero, ``dy``), whose dO and V set the size of the noise.

    The fused self-attention layers' ``Wqkv`` and cross attention's ``Wkv`` hold the value rows
    too, so they are never zero as a whole and are judged on their own scale.
    """

    def size(name: str) -> float:
        return float(np.max(np.abs(grads[name]), initial=0.0)) if name in grads else 0.0

    def weight_size(owner: str, projection: str) -> float:  # Linear's .weight, or V1's matrix
        return size(f"{owner}{projection}.weight") or size(f"{owner}{projection}")

    floors = {}
    for name in grads:
        owner, projection, leaf = _split_name(name)
        if one_key and projection in ("W_query", "W_key"):
            floors[name] = weight_size(owner, "W_value")
        elif one_key and projection == "Wq":
            floors[name] = weight_size(owner, "Wkv")
        elif one_key and name == "dx" and "dy" in grads:
            floors[name] = size("dy")
        elif projection == "W_key" and leaf == "bias":
            floors[name] = weight_size(owner, "W_key")
    return floors


def _split_name(name: str) -> tuple[str, str, str]:
    """(owner, projection, leaf): ``heads.0.W_key.bias`` -> (``heads.0.``, ``W_key``, ``bias``),
    ``W_key`` (a bare matrix) -> ("", ``W_key``, "")."""
    *path, last = name.split(".")
    leaf = last if path and last in ("weight", "bias") else ""
    if leaf:
        *path, last = path
    return "".join(f"{part}." for part in path), last, leaf


# -- The kernel checker's policy (parity_tests.checker) ------------------------------------------
# A kernel K is judged against the float64 golden G with a plain same-dtype baseline Bl:
#     max|K - G| <= c * max|Bl - G| + FLOOR[dtype] * max|G|
# c is how many times the baseline's error a kernel may make: OUTPUT_FACTOR for the output,
# GRAD_FACTOR for dq, dk, dv (flash-attention's tests use 2 and 3). The floor covers seeds where
# the baseline happens to round luckily; its values were set by measurement over 60 seeds of the
# default battery, every correct built-in target and every pitfall
# (``python -m parity_tests --calibrate 60``, docs/kernel-verification.md has the tables).
# GRAD_FACTOR was 3 until step 17's batteries were calibrated over 60 seeds: SDPA's CPU flash
# backward, a correct kernel, made 3.19x the baseline's dk error on a row shifted by -1e5 in
# float32 (seed 56; 1.16x at the median seed), where the scores are rounded at the shift's
# magnitude in both passes; it needs c >= 3.17, and every pitfall flag measured at 3 is at least
# 3/4 of itself at 4 (the two thinnest, measured again at 4 over 60 seeds: 1.13 and 1.41, both by
# the bias statistic): "GRAD_FACTOR 4" in that document.
OUTPUT_FACTOR = 2.0
GRAD_FACTOR = 4.0
FLOOR = {"float64": 1e-12, "float32": 1e-5, "float16": 1e-3, "bfloat16": 1e-2}
# The bias statistic beside the max bound: rms(K - G) <= BIAS_FACTOR * max(rms(Bl - G), rms(rd(G) -
# G)) + BIAS_FLOOR[dtype] * rms(G), rd(G) the golden stored in the kernel's dtype (the rounding no
# kernel avoids; it stands in for the baseline's where that overflowed). A correct kernel's rounding
# is spread like the baseline's: over 60 seeds of every correct target its RMS error reached 2.64x
# the baseline's in half precision (on the tiny tensors of single-query, where the baseline's own
# RMS is a noisy sample) and 5.9x in float32 (fused kernels, which the float32 floor covers); a 1%
# temperature error in bfloat16 is 2-4.5x on every case. 3 leaves 0.88 of the bound for the first
# and still flags the second on every seed (docs/kernel-verification.md, "The bias statistic").
BIAS_FACTOR = 3.0
BIAS_FLOOR = {"float64": 1e-12, "float32": 1e-5, "float16": 1e-4, "bfloat16": 1e-3}
# A kernel run with isolate=True that has not answered within this many seconds is stopped and
# judged "error" (a hang); the first call of a compiled kernel compiles, which takes ~10-40 s
# per shape on the 2-core CPU machines.
ISOLATE_TIME_LIMIT_S = 300.0
# A kernel's dropout keep-fraction must lie within this many binomial standard deviations of
# 1 - dropout_p (about one false alarm in 5e8 for a correct kernel).
DROPOUT_SIGMAS = 6.0
