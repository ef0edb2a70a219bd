"""A GPT-2 attention layer, for ``python -m parity_tests.bench`` (part ``gpt2``; never a timed
test): ``fused.CausalSelfAttention`` (x (10, 512, 768), 12 heads, eval, no_grad) forward in NumPy
(impl="auto") against the torch mirror on SDPA holding the same weights, whole and stage by stage
(projections, attention, head merge), and NumPy's peak traced memory.

Tests: tests/bench/test_gpt2.py.
"""

from __future__ import annotations

import numpy as np
import torch

from numpy_attention import functional, no_grad
from numpy_attention.functional import merge_heads_forward
from numpy_attention.fused import CausalSelfAttention, split_projection_forward
from torch_attention.fused import CausalSelfAttention as TorchCausalSelfAttention

from .attention import sdpa
from .measure import best_time, mib, seconds, traced_peak

GPT2 = {"batch": 10, "tokens": 512, "width": 768, "heads": 12}


def gpt2_layer(repeats: int) -> dict[str, float]:
    """CausalSelfAttention(768, 12) forward in eval mode: NumPy (impl="auto") vs torch (SDPA),
    whole and stage by stage (projections, attention, head merge), each side timed in a group."""
    cfg = GPT2
    b, n, c, h = cfg["batch"], cfg["tokens"], cfg["width"], cfg["heads"]
    layer = CausalSelfAttention(c, h, 1024, rng=0).eval()
    mirror = TorchCausalSelfAttention(c, h, 1024, backend="sdpa").eval()
    mirror.load_state_dict({name: torch.from_numpy(t) for name, t in layer.state_dict().items()})
    x = np.random.default_rng(2).standard_normal((b, n, c), dtype=np.float32)
    tx = torch.from_numpy(x)

    def numpy_forward() -> np.ndarray:
        with no_grad():
            return layer(x)

    def torch_forward() -> torch.Tensor:
        with torch.no_grad():
            return mirror(tx)

    expected = torch_forward().numpy()
    error = np.max(np.abs(numpy_forward() - expected)) / np.max(np.abs(expected))
    result = {
        "numpy": best_time(numpy_forward, repeats),
        "numpy peak": traced_peak(numpy_forward),
        "rel error": float(error),
    }
    with no_grad():
        qkv = layer.Wqkv(x)  # (B, N, C) -> (B, N, 3C)
        (q, k, v), _ = split_projection_forward(qkv, 3, h)  # 3 x (B, H, N, D), views
        heads = functional.attention_forward(q, k, v, causal=True).out
        merged = merge_heads_forward(heads)[0]  # (B, H, N, D) -> (B, N, C)

        result |= {
            "numpy Wqkv": best_time(lambda: layer.Wqkv(x), repeats),
            "numpy attention": best_time(
                lambda: functional.attention_forward(q, k, v, causal=True), repeats
            ),
            "numpy merge": best_time(lambda: merge_heads_forward(heads), repeats),
            "numpy Wo": best_time(lambda: layer.Wo(merged), repeats),
        }
    result["torch"] = best_time(torch_forward, repeats)
    with torch.no_grad():
        tqkv = mirror.Wqkv(tx)
        tq, tk, tv = tqkv.view(b, n, 3, h, c // h).permute(2, 0, 3, 1, 4)  # 3 x (B, H, N, D)
        theads = sdpa(tq, tk, tv)
        tmerged = theads.transpose(1, 2).reshape(b, n, c)
        result |= {
            "torch Wqkv": best_time(lambda: mirror.Wqkv(tx), repeats),
            "torch attention": best_time(lambda: sdpa(tq, tk, tv), repeats),
            "torch merge": best_time(lambda: theads.transpose(1, 2).reshape(b, n, c), repeats),
            "torch Wo": best_time(lambda: mirror.Wo(tmerged), repeats),
        }
    return result


def layer_lines(layer: dict) -> list[str]:
    lines = [
        f"### GPT-2 attention layer forward, x ({GPT2['batch']}, {GPT2['tokens']}, "
        f"{GPT2['width']}), {GPT2['heads']} heads, eval, no_grad",
        "",
        f'- NumPy `fused.CausalSelfAttention` (impl="auto"): {seconds(layer["numpy"])}, '
        f"peak {mib(layer['numpy peak'])}",
        f'- torch `torch_attention.fused.CausalSelfAttention` (backend="sdpa"): '
        f"{seconds(layer['torch'])}",
        f"- ratio NumPy / torch: {layer['numpy'] / layer['torch']:.2f}x; outputs agree to "
        f"{layer['rel error']:.1e} (relative)",
        "",
        "| stage | NumPy | torch | NumPy / torch |",
        "|---|---|---|---|",
    ]
    for stage, label in [
        ("Wqkv", "Wqkv projection (B, N, C) -> (B, N, 3C)"),
        ("attention", "attention (B, H, N, D), causal"),
        ("merge", "merge heads"),
        ("Wo", "Wo projection"),
    ]:
        numpy_time, torch_time = layer[f"numpy {stage}"], layer[f"torch {stage}"]
        ratio = f"{numpy_time / torch_time:.2f}x" if torch_time >= 1e-4 else "- (torch: a view)"
        lines.append(f"| {label} | {seconds(numpy_time)} | {seconds(torch_time)} | {ratio} |")
    return [*lines, ""]
