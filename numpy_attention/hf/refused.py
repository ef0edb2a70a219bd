"""The model types ``grouped_from_hf`` refuses by name, each with its reason: the twist its
attention has that ``GroupedQueryAttention`` lacks (an output gate, QK-norm after RoPE,
a mixture of attention heads, a drafter's mask over its target's keys...), what the model
is instead (a state-space model, a wrapper whose ``text_config`` to pass), or where it goes
(DeepSeek Sparse Attention: step 19). ``families.model_type`` raises with it. NumPy only.

Tests: tests/numpy_attention/hf/test_refused.py.
"""

from __future__ import annotations

REFUSED = {
    "doge": "doge: a dynamic mask, computed from the values (dt_proj, A) and kept to the top "
    "keep_window_size keys, is added to the scores; the layer has no such mask (issue 28)",
    "inkling_text": "inkling_text: short convolutions over time on the keys and values "
    "(k_sconv, v_sconv) and learned relative-position logits (r_proj) added to the scores, "
    "instead of RoPE; the layer has neither (issue 28)",
    "inkling2_text": "inkling2_text: an output gate, sigmoid(x W_g) per element (gate_proj), "
    "sinks computed from the input (sink_proj) and L2 clips of q and k; the layer has no output "
    "gate, and its sinks are learned constants (issue 28)",
    "jetmoe": "jetmoe: a mixture of attention heads (JetMoeMoA): a router (experts.router) "
    "picks each token's top num_experts_per_tok of num_local_experts experts; each pick's "
    "expert projects that token's num_key_value_heads query heads (experts.input_linear.weight"
    "[e]; query head h reads key/value head h mod num_key_value_heads, kv_proj's [k; v] "
    "repeated, not grouped), and the output is the sum over the picks of the softmax of their "
    "router logits times the expert's output projection (experts.output_linear.weight[e]), plus "
    "experts.bias. The projections change per token with a discrete choice whose gates the "
    "router is trained through: a layer of its own, not GroupedQueryAttention's one q_proj and "
    "o_proj (issue 28)",
    "gemma3n": "gemma3n: the multimodal Gemma 3n config; its language model 'gemma3n_text' is "
    "exact (pass text_config and the language model's state dict), but the wrapper itself is "
    "not proven: Gemma3nModel builds its vision tower with timm and Pillow, which the test "
    "environment lacks, so no parity case can build it",
    **{
        name: f"{name}: a drafter whose every layer reuses the target model's keys and values "
        "(KV sharing, num_kv_shared_layers = num_hidden_layers: the target's shared_kv_states) "
        "under a bidirectional mask over them; the layer's kv_shared attends causally, "
        "bottom-right aligned, so the mask is not the layer's (issue 28)"
        for name in ("gemma4_assistant", "gemma4_unified_assistant")
    },
    "deepseek_v4": "deepseek_v4: shared-KV multi-query attention (one kv_proj read as both key "
    "and value), a low-rank query with a weightless RMSNorm, RoPE applied again at position -i "
    "to the output's rotary slice, a grouped low-rank output projection, per-head sinks, and "
    "compressed sparse attention layers (CSA/HCA); neither the grouped nor the latent layer",
    "qwen4_exp_text": "qwen4_exp_text: every softmax layer is 'indexed_attention': a QSA "
    "indexer (index_qk_proj) mean-pools the keys into blocks and keeps each query's top "
    "indexer_budget tokens of them (plus the unfinished block), hiding the rest; the layer "
    "attends to every key. Its output gate (q_proj's per-head half, sigmoid) and QK-norm are "
    "qwen3_5_text's, which loads. Its linear_attention layers are gated DeltaNet (step 20)",
    "qwen4_exp": "qwen4_exp: the multimodal wrapper; its language model is qwen4_exp_text, "
    "itself refused by name: a QSA indexer hides keys per query on every softmax layer",
    "cohere_compass_text": "cohere_compass_text: multimodal RoPE (mrope_section): each "
    "frequency reads the temporal, height or width position from 3-D position_ids (text, H, W "
    "rows interleaved every third frequency), and a layer whose rope_parameters entry is null "
    "gets none; the layer rotates by one position per token",
    "zaya": "zaya: Compressed Convolutional Attention: q and k come from a causal 1-D "
    "convolution over the sequence (ZayaCCAProjection), v from a delayed recurrent state, then "
    "q and k are L2-normed to sqrt(head_dim) and k scaled by a learned per-kv-head temperature "
    "(ZayaQKNorm); the layer projects each token alone",
    "minimax_m3_vl_text": "minimax_m3_vl_text: its 'minimax_m3_sparse' layers attend only to "
    "the key blocks a Lightning Indexer picks per query (top-k blocks plus local ones, "
    "MiniMaxM3VLIndexer); the layer has no indexer. Its dense layers (Gemma QK-norm, partial "
    "RoPE) are not a row yet",
    "minimax_m3_vl": "minimax_m3_vl: the multimodal wrapper; its language model is "
    "minimax_m3_vl_text, whose sparse layers a Lightning Indexer selects (refused by name)",
    # DeepSeek Sparse Attention: the text configs of latent.py's REFUSED wrappers; their
    # attention is MLA, and its indexed layers a DSA indexer hides keys on
    "glm5_next_text": "glm5_next_text: DeepSeek Sparse Attention: a top-k indexer hides keys "
    "per query, shared across layers; and its attention is multi-head latent attention "
    "(latent_from_hf refuses it for the same reason)",
    "mistral_large4_text": "mistral_large4_text: DeepSeek Sparse Attention: a top-k indexer "
    "hides keys per query, with NoPE layers and KV sharing across layers; and its attention is "
    "multi-head latent attention (latent_from_hf refuses it for the same reason)",
    "dots3_note_text": "dots3_note_text: DeepSeek Sparse Attention on its 'indexed_attention' "
    "layers (a top-k indexer hides keys per query), an output gate sigmoid(g_proj(x)) per head "
    "before o_proj, and a normed rope key; its attention is multi-head latent attention "
    "(latent_from_hf refuses it for the same reason)",
    **{
        name: f"{name}: the multimodal wrapper of {name}_text, whose attention is DeepSeek Sparse "
        "Attention (a top-k indexer hides keys per query) over multi-head latent attention"
        for name in ("glm5_next", "mistral_large4", "dots3_note")
    },
    "blt": "blt: the Byte Latent Transformer: a local byte encoder and decoder that "
    "cross-attend to patches, a global transformer over patches and an entropy patcher; no "
    "single decoder stack of self-attention layers to convert",
    "falcon_mamba": "falcon_mamba: a state-space model (Mamba with RMS-normed B, C and dt) "
    "with no softmax attention layer",
    "mamba": "mamba: a state-space model with no softmax attention layer",
    "mamba2": "mamba2: a state-space model (Mamba-2, structured state space duality) with no "
    "softmax attention layer",
    "rwkv": "rwkv: an RNN (RWKV time mixing, a decayed weighted key-value recurrence) with no "
    "softmax attention layer",
    "xlstm": "xlstm: a recurrent model (mLSTM matrix-memory blocks) with no softmax attention "
    "layer",
}
