"""The rows of ``families.FAMILIES``, one module per kind of family, each row beside the rules it
names: ``classic`` (dense decoders whose attention the layer computes as it stands), ``fused``
(fused projections, Phi's LayerNorm QK-norm), ``hybrids`` (softmax layers beside recurrent,
convolution or linear-attention ones), ``gated`` (an output gate before o_proj) and ``twists``
(the other options the classic decoder lacks: QK-norm after RoPE, query temperature, clip_qkv, the
sub-norm, value width and scale, differential and chunked attention, shared keys and values).
NumPy only.
"""
