"""torch_attention.kimi_delta: the twin KimiDeltaAttention against the NumPy layer it mirrors,
without transformers (linear_twins.py's checks): the same parameter names, the forward and
autograd's gradients of x and every parameter against the hand-derived backward (float64, a
left-padded batch), decoding over the torch caches (contiguous and paged) equal to the full
forward with the NumPy caches' states, and the same words for a bad padding mask. Against
transformers: tests/parity/test_hf_kimi_delta.py.
"""

from __future__ import annotations

import pytest

from .linear_twins import KINDS, check_backward, check_decoding, check_padding_error

NAMES = ["kimi_delta"]


@pytest.mark.parametrize("name", NAMES)
def test_twin_matches_the_hand_derived_backward(name, rng):
    check_backward(name, rng)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", NAMES)
def test_twin_decodes_to_its_full_forward_with_the_numpy_caches_states(name, kind, rng):
    check_decoding(name, kind, rng)


@pytest.mark.parametrize("name", NAMES)
def test_a_bad_padding_mask_gets_the_numpy_layers_words(name, rng):
    check_padding_error(name, rng)
