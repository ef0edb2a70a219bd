"""transformers' DeepseekV32Indexer as the real client of numpy_attention.indexer: its scores,
captured where the model hands them to ``topk``, against ``indexer_forward`` fed the same
projections (wq_b, wk and its LayerNorm, weights_proj times HI^-0.5) after the indexer's own
half-split RoPE, in float64 (``Float64Math``: the model's ``.float()`` calls run in float64); and
the top-k sets it returns against ``topk_indices``.

Finding kept in the test: the model asks ``topk`` for min(index_topk, S) keys per query whatever
the query sees, so a query with fewer visible keys than that gets -inf positions in its list
(keys in its future); the model's own mask hides them again. ``topk_indices`` marks them -1,
which is what the sparse kernels read as "no entry".
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

from numpy_attention.indexer import indexer_forward, topk_indices
from numpy_attention.norms import LayerNorm
from numpy_attention.rope import rope_forward

from ..conftest import assert_close, to_numpy
from .test_hf_models import Float64Math

transformers = pytest.importorskip("transformers")
from transformers.models.deepseek_v32 import modeling_deepseek_v32 as v32  # noqa: E402

S = 12
CONFIG = {
    "hidden_size": 32,
    "q_lora_rank": 16,
    "index_n_heads": 4,
    "index_head_dim": 8,
    "qk_rope_head_dim": 4,
    "index_topk": 5,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "kv_lora_rank": 8,
    "qk_nope_head_dim": 4,
    "v_head_dim": 4,
    "num_hidden_layers": 1,
}


class CaptureTopk(TorchFunctionMode):
    """Records the tensor each ``topk`` call selects from."""

    def __init__(self) -> None:
        super().__init__()
        self.scores: list[torch.Tensor] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.topk:
            self.scores.append(args[0].detach().clone())
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("seed", [0, 1])
def test_scores_and_topk_match_transformers(seed):
    torch.manual_seed(seed)
    config = v32.DeepseekV32Config(**CONFIG)
    module = v32.DeepseekV32Indexer(config, layer_idx=0).double().eval()
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, 0.5)  # away from relu's flat half
    rotary = v32.DeepseekV32RotaryEmbedding(config)
    x = torch.randn(1, S, CONFIG["hidden_size"], dtype=torch.float64)
    q_resid = torch.randn(1, S, CONFIG["q_lora_rank"], dtype=torch.float64)
    positions = torch.arange(S)[None]
    mask = torch.ones(S, S, dtype=torch.bool).tril()[None]
    capture = CaptureTopk()
    with torch.no_grad(), Float64Math(), capture:
        cos, sin = rotary(x, positions)  # in float64, as the model would under the mode
        chosen = module(x, q_resid, (cos, sin), mask, positions)
    (hf_scores,) = capture.scores

    heads, width, rot = (
        CONFIG["index_n_heads"],
        CONFIG["index_head_dim"],
        CONFIG["qk_rope_head_dim"],
    )
    xn, qn = to_numpy(x[0]), to_numpy(q_resid[0])
    q = (qn @ to_numpy(module.wq_b.weight).T).reshape(S, heads, width)
    norm = LayerNorm(width, eps=module.k_norm.eps, bias=True).astype(np.float64)
    norm.weight[...] = to_numpy(module.k_norm.weight)
    norm.bias[...] = to_numpy(module.k_norm.bias)
    k = norm(xn @ to_numpy(module.wk.weight).T)
    inv_freq = to_numpy(rotary.inv_freq).astype(np.float64)
    q, _ = rope_forward(q.swapaxes(0, 1), np.arange(S), inv_freq=inv_freq, rotary_dim=rot)
    k, _ = rope_forward(k[None], np.arange(S), inv_freq=inv_freq, rotary_dim=rot)
    weights = (xn @ to_numpy(module.weights_proj.weight).T) * heads**-0.5
    ours = indexer_forward(q.swapaxes(0, 1), k[0], weights, scale=width**-0.5).scores

    theirs = to_numpy(hf_scores[0])
    assert np.array_equal(np.isneginf(ours), np.isneginf(theirs))
    assert_close(ours[np.isfinite(ours)], theirs[np.isfinite(theirs)], name="indexer scores")

    topk = CONFIG["index_topk"]
    picked = topk_indices(ours, topk)
    for t in range(S):
        visible = t + 1
        theirs_t = set(to_numpy(chosen[0, t]).tolist())
        ours_t = {int(i) for i in picked[t] if i >= 0}
        if visible >= topk:
            assert ours_t == theirs_t, t
        else:  # the model pads the list with keys from the future; ours with -1
            assert ours_t == set(range(visible)) and ours_t < theirs_t
            assert int((picked[t] == -1).sum()) == topk - visible
