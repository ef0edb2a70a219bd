"""numpy_attention.hf.family: the machinery every row of ``families.FAMILIES`` shares, read through
plain rows: a config's own ``layer_types`` read and checked (``layer_kind``), and the sizes as the
attention module takes them (``sizes``). What each row's rules read: tests/numpy_attention/hf/rows/;
against transformers, tests/parity/test_hf_models.py. ``SIZES`` are the sizes every HF family
test starts from."""

from __future__ import annotations

import pytest

from numpy_attention.hf.families import FAMILIES
from numpy_attention.hf.family import FULL, SLIDING, layer_kind, sizes

LAYERS = 6
SIZES = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
             num_hidden_layers=LAYERS, sliding_window=8)  # fmt: skip


def test_a_config_list_of_layer_types_is_read_and_checked():
    family = FAMILIES["gemma2"]
    config = {**SIZES, "layer_types": [FULL, SLIDING]}

    assert [layer_kind(config, family, i) for i in range(2)] == [FULL, SLIDING]
    with pytest.raises(ValueError, match="layer_types has 2 entries"):
        layer_kind(config, family, 2)
    with pytest.raises(ValueError, match="'chunked_attention'"):
        layer_kind({**config, "layer_types": ["chunked_attention"]}, family, 0)


def test_sizes_as_the_attention_module_takes_them():
    llama, gemma = FAMILIES["llama"], FAMILIES["gemma2"]
    config = {**SIZES, "head_dim": 16}

    assert sizes(config, llama) == {"hidden_size": 32, "num_heads": 4, "num_kv_heads": 2,
                                    "head_dim": 16}  # fmt: skip
    assert sizes({**SIZES, "num_key_value_heads": None}, llama)["num_kv_heads"] == 4
    assert sizes(config, gemma)["head_dim"] == 16
    with pytest.raises(ValueError, match="not a multiple of its 3 key/value heads"):
        sizes({**SIZES, "num_key_value_heads": 3}, llama)
