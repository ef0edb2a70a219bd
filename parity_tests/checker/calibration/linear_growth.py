"""How a correct linear-attention kernel's error grows with the sequence length T, per dtype: the
measurement behind the "fla_gdn" and "fla_kda" specs' bounds (docs/pitfalls.md, "Linear
attention: error against T"). An opt-in command, not a test:

    python -m parity_tests.checker.calibration.linear_growth [--lengths 64,256,1024,4096]

For each T and dtype (float32, float16, bfloat16) it runs the gated delta rule on one random
case (B = 1, H = 2, K = V = 32, q and k L2-normalized, log-gates in [-0.7, -0.02] or near 0,
beta in [0.05, 0.95]) through the torch twin's two forms in that dtype, the state kept in
float32 for half inputs (the specs' baseline is the recurrent one, their built-in target the
chunked one), and reports each one's error against the float64 golden
(``numpy_attention.linear_attention``'s recurrent form and hand-derived backward) on the same
rounded inputs: the largest absolute error over the largest |golden| of o, of the final state
and of dq, the backward through o with a random upstream gradient.

With typical gates the state forgets: the error settles after a few hundred tokens and stays
flat in T. With gates near 0 (a = exp(g) -> 1) nothing is forgotten and the rounding of every
step stays in the state: the error grows with T. The report prints one table per gate.

Tests: tests/checker/calibration/test_linear_growth.py.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import numpy as np
import torch

from numpy_attention.linear_attention import gated_delta_rule_backward, gated_delta_rule_forward
from torch_attention.linear_attention import gated_delta_rule

LENGTHS = (64, 256, 1024, 4096)
DTYPES = ("float32", "float16", "bfloat16")
GATES = ("typical", "near_zero")
HEADS, WIDTH = 2, 32
FORMS = ("recurrent", "chunk")
TENSORS = ("out", "final_state", "dq")


def inputs(tokens: int, gate: str, seed: int = 0) -> dict[str, np.ndarray]:
    """One case's float64 arrays: q, k (1, T, H, K) unit rows, v (1, T, H, V), g and beta
    (1, T, H), dout (1, T, H, V)."""
    rng = np.random.default_rng(seed)
    shape = (1, tokens, HEADS, WIDTH)
    q, k = rng.standard_normal(shape), rng.standard_normal(shape)
    q /= np.linalg.norm(q, axis=-1, keepdims=True)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    if gate == "typical":
        g = -rng.uniform(0.02, 0.7, shape[:3])
    else:
        g = -1e-4 * rng.uniform(0.5, 1.5, shape[:3])
    return {
        "q": q, "k": k, "v": rng.standard_normal(shape), "g": g,
        "beta": rng.uniform(0.05, 0.95, shape[:3]), "dout": rng.standard_normal(shape),
    }  # fmt: skip


def errors(case: dict[str, np.ndarray], dtype: str) -> dict[str, dict[str, float]]:
    """{form: {tensor: max abs error / max |golden|}} of the twin in ``dtype`` against the
    float64 golden on the inputs rounded to ``dtype``."""
    torch_dtype = getattr(torch, dtype)
    names = ("q", "k", "v", "g", "beta")
    rounded = {n: torch.from_numpy(case[n]).to(torch_dtype) for n in (*names, "dout")}
    arrays = [rounded[n].double().numpy() for n in names]
    golden = gated_delta_rule_forward(*arrays, output_final_state=True, form="recurrent")
    grads = gated_delta_rule_backward(rounded["dout"].double().numpy(), golden.ctx)
    expected = {"out": golden.out, "final_state": golden.final_state, "dq": grads.dq}
    found: dict[str, dict[str, float]] = {}
    for form in FORMS:
        leaves = [rounded[n].clone().requires_grad_(n == "q") for n in names]
        out, final = gated_delta_rule(*leaves, output_final_state=True, form=form)
        (out.float() * rounded["dout"].float()).sum().backward()
        results = {"out": out, "final_state": final, "dq": leaves[0].grad}
        found[form] = {
            name: float(
                np.max(np.abs(results[name].detach().double().numpy() - expected[name]))
                / max(float(np.max(np.abs(expected[name]))), 1e-300)
            )
            for name in TENSORS
        }
    return found


def table(lengths: Sequence[int], gate: str) -> list[str]:
    """One Markdown table: a row per (T, dtype), the three tensors' errors per form."""
    header = " | ".join(f"{form} {name}" for form in FORMS for name in TENSORS)
    lines = [
        f"Gates {gate.replace('_', ' ')}:",
        "",
        f"| T | dtype | {header} |",
        "|" + "---|" * (2 + len(FORMS) * len(TENSORS)),
    ]
    for tokens in lengths:
        case = inputs(tokens, gate)
        for dtype in DTYPES:
            found = errors(case, dtype)
            cells = " | ".join(f"{found[form][name]:.1e}" for form in FORMS for name in TENSORS)
            lines.append(f"| {tokens} | {dtype} | {cells} |")
    return [*lines, ""]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m parity_tests.checker.calibration.linear_growth",
        description="The gated delta rule's error against T per dtype (the torch twin's two "
        "forms against the float64 golden).",
    )
    parser.add_argument(
        "--lengths",
        type=lambda text: tuple(int(part) for part in text.split(",")),
        default=LENGTHS,
        help="comma-separated T values (default 64,256,1024,4096)",
    )
    args = parser.parse_args(argv)
    for gate in GATES:
        print("\n".join(table(args.lengths, gate)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
