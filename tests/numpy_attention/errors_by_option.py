"""The measured errors of today's options, as a table (an opt-in measurement, not a test).

    python -m tests.numpy_attention.errors_by_option      # from the repository root

For each option of ``cases.OPTIONS``, over three shapes (N < M, N > M, N = M), the largest
relative error over out, lse, dq, dk, dv (and dsinks), each tensor on its own scale
(``parity_tests.tolerances.rel_error``, finite entries): the NumPy dense and tiled paths in
float64 against the torch-autograd oracle of ``oracle.py``; torch_attention's backends in float64
and float32 against the NumPy dense path on the same (rounded) inputs. "refused": the backend
refuses the option (SDPA has no softcap or sinks). docs/torch-backends.md ("Precision") records
a run; the tests hold the same comparisons to FLOAT64_RTOL and FLOAT32_RTOL
(test_functional_options.py in both packages).
"""

from __future__ import annotations

import numpy as np
import torch

from numpy_attention.functional import attention_backward, attention_forward
from parity_tests.tolerances import rel_error
from torch_attention.functional import attention

from . import oracle
from .cases import OPTIONS, make_case

LENGTHS = ("N5-M9", "N9-M5", "N7-M7")
TORCH_BACKENDS = ("math", "manual", "sdpa", "auto")


def numpy_run(arrays, kwargs, dout, dlse, impl="dense", dtype=np.float64):
    given = {name: a.astype(dtype) for name, a in arrays.items()}
    forward = attention_forward(given["q"], given["k"], given["v"], sinks=given.get("sinks"),
                                return_lse=True, impl=impl, **kwargs)  # fmt: skip
    grads = attention_backward(dout.astype(dtype), forward.ctx, dlse.astype(dtype))
    values = {"out": forward.out, "lse": forward.lse, "dq": grads.dq, "dk": grads.dk}
    values["dv"] = grads.dv
    if grads.dsinks is not None:
        values["dsinks"] = grads.dsinks
    return values


def torch_run(arrays, kwargs, dout, dlse, backend, dtype):
    """torch_attention on ``backend``; SDPA returns no lse: out and the gradients of out alone."""
    leaves = {name: torch.tensor(a.astype(dtype), requires_grad=True) for name, a in arrays.items()}
    options = {key: _tensor(value, dtype) for key, value in kwargs.items()}
    with_lse = backend != "sdpa"
    result = attention(leaves["q"], leaves["k"], leaves["v"], sinks=leaves.get("sinks"),
                       backend=backend, return_lse=with_lse, **options)  # fmt: skip
    out = result.out if with_lse else result
    loss = (out * torch.tensor(dout.astype(dtype))).sum()
    if with_lse:
        lse = torch.where(torch.isfinite(result.lse), result.lse, 0.0)
        loss = loss + (lse * torch.tensor(dlse.astype(dtype))).sum()
    loss.backward()
    values = {"out": out} | {f"d{name}": leaf.grad for name, leaf in leaves.items()}
    if with_lse:
        values["lse"] = result.lse
    return {name: value.detach().numpy() for name, value in values.items()}


def _tensor(value, dtype):
    """An array option as a tensor (float ones in ``dtype``, bool masks as they are)."""
    if not isinstance(value, np.ndarray):
        return value
    return torch.tensor(value if value.dtype == bool else value.astype(dtype))


def worst(actual, expected):
    errors = []
    for name, value in expected.items():
        if name in actual:
            finite = np.isfinite(value)
            got = np.where(finite, actual[name].astype(np.float64), 0)
            errors.append(rel_error(got, np.where(finite, value, 0)))
    return max(errors)


def measure() -> dict:
    rng = np.random.default_rng(0)
    table: dict = {}

    def keep(name, column, error):
        table[name, column] = max(table.get((name, column), 0.0), error)

    for name in OPTIONS:
        for lengths in LENGTHS:
            arrays, kwargs, dout, dlse = make_case(rng, name, lengths, d=16, dv=8)
            golden = oracle.attention_and_grads(arrays, dout, dlse, **kwargs)
            for impl in ("dense", "tiled"):
                keep(name, f"numpy {impl} f64", worst(numpy_run(arrays, kwargs, dout, dlse, impl),
                                                      golden))  # fmt: skip
            for backend in TORCH_BACKENDS:
                for dtype, tag in ((np.float64, "f64"), (np.float32, "f32")):
                    try:
                        got = torch_run(arrays, kwargs, dout, dlse, backend, dtype)
                    except ValueError:  # the backend refuses the option
                        continue
                    rounded = {key: a.astype(dtype).astype(np.float64) for key, a in arrays.items()}
                    upstream = dlse if backend != "sdpa" else np.zeros_like(dlse)
                    expected = numpy_run(rounded, kwargs, dout.astype(dtype).astype(np.float64),
                                         upstream.astype(dtype).astype(np.float64))  # fmt: skip
                    keep(name, f"torch {backend} {tag}", worst(got, expected))
    return table


def main() -> None:
    table = measure()
    columns = sorted({column for _, column in table})
    print("| option | " + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    for name in OPTIONS:
        cells = [f"{table[name, c]:.1e}" if (name, c) in table else "refused" for c in columns]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
