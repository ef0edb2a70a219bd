"""Run the registry's cases on both sides and compare: NumPy layer vs torch twin, output and every
gradient.

``run_case`` builds the NumPy layer from a seeded generator, moves its state dict into the torch
layer unchanged, feeds both the same inputs, masks and upstream gradient, and compares the output,
the input gradient(s) and the gradient of every parameter by name, each tensor on its own scale;
only a structurally zero gradient is judged on a floor, the scale of a named tensor
(``tolerances.structural_floors``, docs/parity.md "Error measure"). ``run_registry`` runs every
case of ``parity_tests.parity.cases`` (or the quick subset) in each dtype and on each torch
backend the case can use (``iter_runs``).

Tests: tests/parity/test_run.py, tests/parity/test_properties.py,
tests/parity/test_tolerances.py.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from numpy_attention.masks import causal_mask

from ..tolerances import at_most_one_key, rel_error, rtol_for, structural_floors
from .cases import CASES, QUICK_CASES, LayerCase

BACKENDS = ("math", "manual", "sdpa")
DTYPES = ("float64", "float32")


@dataclass(frozen=True)
class ParityRow:
    """One compared tensor: ``passed`` iff ``error <= bound``.

    ``error`` is ``max |torch - numpy|`` over the tensor's own ``max |numpy|``, or over its
    structural-zero floor where that is larger (``tolerances.structural_floors``).
    """

    case: str
    layer: str
    dtype: str
    device: str
    backend: str
    tensor: str
    error: float
    bound: float
    passed: bool
    shape: tuple[int, ...] = ()  # the compared tensor's shape (the input's for dx, out's, ...)


@dataclass
class CaseData:
    """What both sides are fed: inputs, forward keywords (NumPy arrays) and the upstream grad."""

    inputs: list[np.ndarray]
    forward_kwargs: dict[str, np.ndarray]
    dout: np.ndarray


def make_data(case: LayerCase, dtype: str) -> CaseData:
    """Seeded inputs, masks and upstream gradient for ``case`` (the same for every backend)."""
    rng = np.random.default_rng(case.seed + 1)
    spec = case.spec
    lead = () if case.batch is None else (case.batch,)
    x = rng.standard_normal((*lead, case.n, case.width)).astype(dtype)
    inputs = [x]
    m = case.n
    if spec.cross:
        m = case.m
        inputs.append(rng.standard_normal((*lead, m, case.width)).astype(dtype))
    kwargs: dict[str, np.ndarray] = {}
    if case.padded and spec.left_padding:
        padding = np.zeros((case.batch, m), dtype=np.bool_)
        padding[-1, : m // 3] = True  # left padding: the last element's first rows see nothing
        kwargs[spec.padding_keyword] = padding
        kwargs["positions"] = np.maximum(np.cumsum(~padding, axis=1) - 1, 0)  # (B, N)
    elif case.padded:
        padding = rng.random((case.batch, m)) < 0.3
        padding[:, 0] = False  # every element but the last keeps a key
        padding[-1] = True  # the last batch element is fully padded: its rows attend to nothing
        kwargs[spec.padding_keyword] = padding
    if case.train and spec.attn_dropout != "none":
        p = _dropout_prob(case, "attn")
        shape = (
            (case.batch, case.n, m)
            if spec.attn_dropout == "single"
            else (case.batch, case.heads, case.n, m)
        )
        kwargs["attn_dropout_mask"] = rng.random(shape) >= p
    if case.train and spec.out_dropout:
        p = _dropout_prob(case, "out")
        kwargs["out_dropout_mask"] = rng.random((case.batch, case.n, case.width)) >= p
    out_width = _out_width(case)
    dout = rng.standard_normal((*lead, case.n, out_width)).astype(dtype)
    return CaseData(inputs, kwargs, dout)


def _dropout_prob(case: LayerCase, which: str) -> float:
    """The dropout probability a train case's constructor sets (used to draw keep-masks)."""
    if case.spec.module in ("grouped", "latent"):
        return float(dict(case.kwargs)["dropout"])
    if case.spec.module == "attention":
        return float(case.args[3])
    offset = 2 if case.layer == "CrossAttention" else 2 + (case.layer == "CausalSelfAttention")
    return float(case.args[offset + (which == "out")])


def _out_width(case: LayerCase) -> int:
    if case.layer == "SimpleSelfAttention":
        return case.width
    if case.layer == "MultiHeadAttentionWrapper":
        return case.args[1] * case.args[4]
    if case.spec.module == "attention":
        return case.args[1]
    return case.width


def build_layers(case: LayerCase, dtype: str, device: str, backend: str) -> tuple[Any, Any]:
    """The NumPy layer (seeded) and its torch twin holding the very same state."""
    import torch

    from torch_attention import from_numpy

    kwargs = dict(case.kwargs)
    if case.spec.parameters:
        kwargs["rng"] = np.random.default_rng(case.seed)
    np_class = getattr(importlib.import_module(f"numpy_attention.{case.spec.module}"), case.layer)
    np_layer = np_class(*case.args, **kwargs)
    kwargs.pop("rng", None)
    np_layer.astype(dtype).train(case.train)
    random = np.random.default_rng(case.seed + 2)
    np_layer.load_state_dict(
        {
            name: random.standard_normal(value.shape)
            if name in case.spec.random_parameters
            else value
            for name, value in np_layer.state_dict().items()
        }
    )
    torch_class = getattr(
        importlib.import_module(f"torch_attention.{case.spec.module}"), case.layer
    )
    torch_layer = torch_class(*case.args, **kwargs, backend=backend)
    torch_layer.to(device=device, dtype=getattr(torch, dtype)).train(case.train)
    from_numpy(torch_layer, np_layer.state_dict())
    return np_layer, torch_layer


def case_tensors(
    case: LayerCase, data: CaseData, *, dtype: str, device: str, backend: str
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Run ``case`` on both sides: ``{name: (numpy, torch)}`` for the output (``out``), each
    input's gradient (``dx``, and ``dy`` for cross attention) and each parameter's gradient
    (``d[<state-dict name>]``). A gradient torch did not produce comes back as NaN, except for
    the parameters the torch layer names in ``NO_GRADIENT`` (DSA's indexer, which selects under
    ``no_grad``): zero, as the NumPy twin reports it."""
    import torch

    np_layer, torch_layer = build_layers(case, dtype, device, backend)
    call = dict(case.call)
    np_out = np_layer(*data.inputs, **data.forward_kwargs, **call)
    np_input_grads = np_layer.backward(data.dout)
    if not isinstance(np_input_grads, tuple):
        np_input_grads = (np_input_grads,)

    def tensor(array: np.ndarray, grad: bool = False) -> torch.Tensor:
        return torch.from_numpy(array).to(device).requires_grad_(grad)

    def numpy(value: torch.Tensor | None, like: np.ndarray) -> np.ndarray:
        return np.full_like(like, np.nan) if value is None else value.detach().cpu().numpy()

    torch_inputs = [tensor(x, grad=True) for x in data.inputs]
    torch_kwargs = {name: tensor(value) for name, value in data.forward_kwargs.items()}
    torch_out = torch_layer(*torch_inputs, **torch_kwargs, **call)
    torch_out.backward(tensor(data.dout))

    tensors = {"out": (np_out, numpy(torch_out, np_out))}
    for name, grad, t in zip(("dx", "dy"), np_input_grads, torch_inputs, strict=False):
        tensors[name] = (grad, numpy(t.grad, grad))
    np_grads = np_layer.named_grads()
    gradient_free = getattr(torch_layer, "NO_GRADIENT", ())  # by design: zero, not missing
    for name, param in torch_layer.named_parameters():
        theirs = param.grad
        if theirs is None and name.startswith(gradient_free):
            theirs = torch.zeros_like(param)
        tensors[f"d[{name}]"] = (np_grads[name], numpy(theirs, np_grads[name]))
    return tensors


def one_key_per_query(case: LayerCase, data: CaseData) -> bool:
    """True when no query row of ``case`` may see two or more keys (causal mask and padding):
    the query and key paths then have exactly zero gradient (``tolerances.structural_floors``)."""
    m = case.m if case.spec.cross and case.m is not None else case.n
    allowed = causal_mask(case.n, m) if case.causal else np.ones((case.n, m), dtype=np.bool_)
    window = dict(case.kwargs).get("window")
    if window is not None and window[0] is not None:  # keys i - left .. i (causal layers only)
        allowed = allowed & ~np.tri(case.n, m, k=-window[0] - 1, dtype=np.bool_)
    padding = data.forward_kwargs.get(case.spec.padding_keyword)
    if padding is not None:
        allowed = allowed & ~padding[:, None, :]  # (N, M) & (B, 1, M) -> (B, N, M)
    return at_most_one_key(allowed, m)


def run_case(
    case: LayerCase, *, dtype: str = "float64", device: str = "cpu", backend: str = "math"
) -> list[ParityRow]:
    """Run ``case`` on both sides and compare the output and every gradient by name, each on its
    own scale, structural zeros on their floor."""
    if not case.applies_to(backend):
        raise ValueError(f"{case.name} does not apply to backend {backend!r}")
    data = make_data(case, dtype)
    tensors = case_tensors(case, data, dtype=dtype, device=device, backend=backend)
    grads = {_bare(name): expected for name, (expected, _) in tensors.items() if name != "out"}
    floors = structural_floors(grads, one_key=one_key_per_query(case, data))
    bound = rtol_for(dtype)
    rows = []
    for name, (expected, actual) in tensors.items():
        floor = floors.get(_bare(name), 0.0)
        error = rel_error(actual, expected, scale=floor)
        rows.append(
            ParityRow(
                case.name,
                case.layer,
                dtype,
                device,
                backend,
                name,
                error,
                bound,
                error <= bound,
                tuple(np.shape(expected)),
            )
        )
    return rows


def _bare(name: str) -> str:
    """A row's tensor name as ``structural_floors`` reads it: ``d[W_key.bias]`` -> W_key.bias."""
    return name.removeprefix("d[").removesuffix("]")


def iter_runs(
    *,
    dtypes: Iterable[str] = DTYPES,
    backends: Iterable[str] = BACKENDS,
    quick: bool = False,
) -> list[tuple[LayerCase, str, str]]:
    """Every (case, dtype, backend) the registry runs; a case skips backends it cannot use."""
    cases = QUICK_CASES if quick else CASES
    return [
        (case, dtype, backend)
        for case in cases
        for dtype in dtypes
        for backend in backends
        if case.applies_to(backend)
    ]


def run_registry(
    *,
    device: str = "cpu",
    dtypes: tuple[str, ...] = DTYPES,
    backends: tuple[str, ...] = BACKENDS,
    quick: bool = False,
    progress: Callable[[str], None] | None = None,
) -> list[ParityRow]:
    """Run the whole registry (or the quick subset) and return one row per compared tensor."""
    rows: list[ParityRow] = []
    runs = iter_runs(dtypes=dtypes, backends=backends, quick=quick)
    for index, (case, dtype, backend) in enumerate(runs, start=1):
        if progress is not None:
            progress(f"[{index}/{len(runs)}] {case.name} {dtype} {backend}")
        rows += run_case(case, dtype=dtype, device=device, backend=backend)
    return rows
