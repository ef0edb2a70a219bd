"""The CPU fallback end to end: weights trained in torch, saved, loaded where torch cannot be
imported, and run by the NumPy layers under no_grad() to the same outputs (docs/cpu-fallback.md).

The torch side trains a few steps and saves the state dicts with ``numpy_attention.convert``;
a child process that blocks any import of torch (and scipy) loads them, converts the layouts that
need it, runs the NumPy layers and saves their outputs; the parent compares in float32.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from numpy_attention import convert, functional
from torch_attention.attention import MultiHeadAttention
from torch_attention.fused import CausalSelfAttention

from ..conftest import assert_close, to_numpy

WIDTH, HEADS, BATCH = 64, 4, 2
# LONG * LONG >= 512 * 512: the attention of these layers runs on the tiled path (impl="auto").
LONG, SHORT = 520, 37

# Runs in a fresh interpreter: argv = [state.npz, inputs.npz, outputs.npz, kind].
NUMPY_ONLY = r"""
import sys

class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "scipy"):
            raise ImportError(f"blocked import of {name}")

sys.meta_path.insert(0, Block())

import numpy as np
from numpy_attention import CausalSelfAttention, MultiHeadAttention, convert, no_grad

state_path, inputs_path, outputs_path, kind = sys.argv[1:]
state = convert.load_state(state_path)
if kind == "fused":
    layer = CausalSelfAttention(64, 4, context_size=1024)
elif kind == "torch_mha":
    layer = CausalSelfAttention(64, 4, context_size=1024)
    state = convert.fused_from_torch_mha(state)
else:
    layer = MultiHeadAttention(64, 64, context_length=64, dropout=0.1, num_heads=4)
layer.load_state_dict(state)
layer.eval()
x = np.load(inputs_path)["x"]
with no_grad():
    out = layer(x)
np.savez(outputs_path, out=out)
assert not [m for m in sys.modules if m.split(".")[0] == "torch"]
"""


def train(module: torch.nn.Module, x: torch.Tensor, forward) -> None:
    """A few SGD steps towards a random target, in train mode (dropout active)."""
    target = torch.randn_like(forward(module, x))
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    module.train()
    for _ in range(3):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(forward(module, x), target).backward()
        optimizer.step()
    module.eval()


def causal_mha(module: torch.nn.MultiheadAttention, x: torch.Tensor) -> torch.Tensor:
    hidden = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).triu(1)  # True = not allowed
    return module(x, x, x, attn_mask=hidden, need_weights=False)[0]


def build(kind: str) -> tuple[torch.nn.Module, object, int]:
    """(torch module, its forward, sequence length) for one source layout."""
    if kind == "fused":
        return CausalSelfAttention(WIDTH, HEADS, context_size=1024), lambda m, x: m(x), LONG
    if kind == "torch_mha":
        module = torch.nn.MultiheadAttention(WIDTH, HEADS, dropout=0.1, batch_first=True)
        return module, causal_mha, LONG
    module = MultiHeadAttention(WIDTH, WIDTH, context_length=64, dropout=0.1, num_heads=HEADS)
    return module, lambda m, x: m(x), SHORT


@pytest.mark.parametrize("kind", ["fused", "torch_mha", "book_mha"])
def test_torch_weights_run_in_numpy_without_torch(tmp_path, kind):
    torch.manual_seed(0)
    module, forward, n = build(kind)
    assert kind == "book_mha" or n * n >= functional._TILED_FROM  # the long ones run tiled
    x = torch.randn(BATCH, n, WIDTH)
    train(module, x, forward)
    with torch.no_grad():
        expected = to_numpy(forward(module, x))
    state_path, inputs_path, outputs_path = (tmp_path / f"{name}.npz" for name in ("s", "i", "o"))
    convert.save_state(state_path, module.state_dict())
    np.savez(inputs_path, x=to_numpy(x))

    result = subprocess.run(
        [sys.executable, "-c", NUMPY_ONLY, state_path, inputs_path, outputs_path, kind],
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert result.returncode == 0, result.stderr
    assert_close(np.load(outputs_path)["out"], expected, name=kind)
