"""Finite-difference check of a hand-derived backward, for any layer or forward/backward pair.

The scalar checked is L = sum(out * G) with G a random (seeded) upstream gradient, never all ones:
the gradient of sum(softmax(s)) is exactly zero, so an all-ones G would hide a wrong softmax
backward. Each input entry and parameter entry t is perturbed by +-eps in float64 and

    numeric dL/dt = (L(t + eps) - L(t - eps)) / (2 eps)

is compared with the analytic gradient from the backward. The error of a tensor is reported as
``max_abs = max |analytic - numeric|`` and ``max_rel = max_abs / scale``, where ``scale`` is the
largest |numeric| entry over *all* checked tensors: a norm-wise relative error of the whole
gradient, reported tensor by tensor. A tensor-local denominator would be meaningless for
gradients that are exactly zero by cancellation (the key projection's bias: softmax ignores a
constant added to a row of scores), where both sides hold only rounding noise; with the global
scale, a wrong gradient still shows: a 100% error in a tensor 1e-4 times smaller than the largest
gradient reads 1e-4, far above the 1e-7 that central differences reach.

``report.passed`` judges every tensor at ``GRADCHECK_RTOL``, the parity suite's tolerance for
finite differences; ``report.within(rtol)`` judges at another one.

Tests: tests/numpy_attention/test_gradcheck.py; every layer's and pure pair's gradcheck in
tests/numpy_attention/.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .module import Module

# With eps = 1e-6 in float64, central differences carry a truncation error ~eps^2 and a
# cancellation error ~eps64 / eps ~ 1e-10; measured at 1e-9 to 1e-10 on the core ops. A wrong
# term in a backward reads 1e-4 or worse. The parity suite's tolerances (parity_tests.tolerances)
# take this constant from here: numpy_attention imports nothing above itself.
GRADCHECK_RTOL = 1e-7

_TINY = 1e-30


@dataclass(frozen=True)
class GradcheckRow:
    name: str
    shape: tuple[int, ...]
    max_abs: float
    max_rel: float


@dataclass
class GradcheckReport:
    """Per-tensor errors; inputs are named ``input0, input1, ...``, parameters by state-dict key.

    ``passed`` is True when every tensor is within ``GRADCHECK_RTOL`` (a bool, like the kernel
    checker's ``KernelReport.passed``); a report without rows checked nothing and has not passed.
    """

    rows: list[GradcheckRow] = field(default_factory=list)

    @property
    def max_rel(self) -> float:
        return max((row.max_rel for row in self.rows), default=0.0)

    @property
    def passed(self) -> bool:
        return self.within(GRADCHECK_RTOL)

    def within(self, rtol: float) -> bool:
        """Whether every tensor's ``max_rel`` is at most ``rtol`` (NaN never is)."""
        return bool(self.rows) and all(row.max_rel <= rtol for row in self.rows)

    def __getitem__(self, name: str) -> GradcheckRow:
        for row in self.rows:
            if row.name == name:
                return row
        raise KeyError(name)

    def __str__(self) -> str:
        lines = [f"{'tensor':<28}{'shape':<20}{'max abs err':>14}{'max rel err':>14}"]
        for row in self.rows:
            lines.append(
                f"{row.name:<28}{str(row.shape):<20}{row.max_abs:>14.3e}{row.max_rel:>14.3e}"
            )
        return "\n".join(lines)


def gradcheck(
    target: Module | Callable[..., Any],
    *inputs: Any,
    backward: Callable[..., Any] | None = None,
    eps: float = 1e-6,
    seed: int = 0,
    **kwargs: Any,
) -> GradcheckReport:
    """Compare a hand-derived backward with central differences, in float64.

    Args:
        target: a ``Module`` (its ``forward`` and ``backward`` are used; it is deep-copied and
            cast to float64, so the caller's module is untouched), or a pure forward function
            ``fn(*inputs, **kwargs) -> (out, ..., ctx)`` (out first, ctx last, as every pure
            forward of this package returns) together with ``backward``.
        *inputs: the differentiated inputs; float arrays, cast to float64.
        backward: for a function target, ``backward(dout, ctx)`` returning one gradient per input
            (a tuple, or a single array for one input); None entries, the gradient of an option
            not in use (``dsinks`` without sinks), are left out.
        eps: the finite-difference step.
        seed: seeds the random upstream gradient.
        **kwargs: passed to the forward unchanged and not differentiated (masks, flags).

    Returns:
        A ``GradcheckReport`` with one row per input and, for modules, per parameter.

    Raises:
        ValueError: if the forward is not deterministic (dropout drawing its own mask: pass an
            explicit keep-mask or call ``eval()``), or if ``backward`` is missing for a function.
    """
    arrays = [np.array(x, dtype=np.float64, order="C") for x in inputs]
    if isinstance(target, Module):
        module = copy.deepcopy(target).astype(np.float64)
        params = module.named_parameters()

        def run(*xs: np.ndarray) -> np.ndarray:
            return np.asarray(module.forward(*xs, **kwargs))

        def analytic(dout: np.ndarray) -> list[np.ndarray]:
            module.zero_grad()
            module.forward(*arrays, **kwargs)
            grads = module.backward(dout)
            grads = list(grads) if isinstance(grads, tuple) else [grads]
            named = module.named_grads()
            return grads + [named[name] for name in params]

        names = [f"input{i}" for i in range(len(arrays))] + list(params)
        tensors = arrays + list(params.values())
    else:
        if backward is None:
            raise ValueError("gradcheck of a function needs backward=(dout, ctx) -> grads")

        def run(*xs: np.ndarray) -> np.ndarray:
            return np.asarray(target(*xs, **kwargs)[0])

        def analytic(dout: np.ndarray) -> list[np.ndarray]:
            ctx = target(*arrays, **kwargs)[-1]
            grads = backward(dout, ctx)
            grads = list(grads) if isinstance(grads, tuple) else [grads]
            return [grad for grad in grads if grad is not None]

        names = [f"input{i}" for i in range(len(arrays))]
        tensors = arrays

    out = run(*arrays)
    if not np.array_equal(out, run(*arrays), equal_nan=True):
        raise ValueError(
            "gradcheck: the forward is not deterministic (dropout drawing its own mask?); "
            "pass explicit keep-masks or call eval()"
        )
    upstream = np.random.default_rng(seed).standard_normal(out.shape)

    def loss() -> float:
        return float(np.sum(run(*arrays) * upstream))

    grads = [np.asarray(grad, dtype=np.float64) for grad in analytic(upstream)]
    if len(grads) != len(tensors):
        raise ValueError(f"backward returned {len(grads)} gradients for {len(tensors)} tensors")
    for name, tensor, grad in zip(names, tensors, grads, strict=True):
        if grad.shape != tensor.shape:
            raise ValueError(f"gradient of {name} has shape {grad.shape}, expected {tensor.shape}")
    numerics = [_central_differences(loss, tensor, eps) for tensor in tensors]
    scale = max([float(np.max(np.abs(n), initial=0.0)) for n in numerics] + [_TINY])
    report = GradcheckReport()
    for name, tensor, grad, numeric in zip(names, tensors, grads, numerics, strict=True):
        max_abs = float(np.max(np.abs(grad - numeric), initial=0.0))
        report.rows.append(GradcheckRow(name, tensor.shape, max_abs, max_abs / scale))
    return report


def _central_differences(loss: Callable[[], float], tensor: np.ndarray, eps: float) -> np.ndarray:
    """Perturb ``tensor`` in place, entry by entry, and restore it."""
    numeric = np.zeros_like(tensor)
    flat, flat_numeric = tensor.reshape(-1), numeric.reshape(-1)
    if not np.shares_memory(flat, tensor):
        raise ValueError("gradcheck needs contiguous tensors to perturb in place")
    for index in range(flat.size):
        original = flat[index]
        flat[index] = original + eps
        plus = loss()
        flat[index] = original - eps
        minus = loss()
        flat[index] = original
        flat_numeric[index] = (plus - minus) / (2 * eps)
    return numeric
