"""Grad mode (numpy_attention.grad_mode): ``no_grad()`` switches the caching of forwards off,
nests, survives exceptions, and is private to each thread."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from numpy_attention import attention_forward, is_grad_enabled, no_grad


def test_no_grad_switches_caching_off_and_back_on(rng):
    q = rng.standard_normal((1, 3, 4))

    with no_grad():
        inside = attention_forward(q, q, q).ctx
        assert not is_grad_enabled()

    assert inside is None
    assert is_grad_enabled() and attention_forward(q, q, q).ctx is not None


def test_no_grad_nests_and_survives_an_exception():
    with pytest.raises(KeyError):
        with no_grad():
            with no_grad():
                assert not is_grad_enabled()
            assert not is_grad_enabled()
            raise KeyError("inside")

    assert is_grad_enabled()


def test_each_thread_has_its_own_grad_mode():
    seen = []
    inside, release = threading.Event(), threading.Event()

    def other_thread():
        inside.wait()
        seen.append(is_grad_enabled())  # while the main thread is inside no_grad()
        release.set()

    worker = threading.Thread(target=other_thread)
    worker.start()
    with no_grad():
        inside.set()
        release.wait()
    worker.join()

    assert seen == [True]


def test_layers_keep_nothing_under_no_grad(rng):
    from numpy_attention import SelfAttentionV2

    layer = SelfAttentionV2(3, 4, rng=0).astype(np.float64)
    with no_grad():
        layer(rng.standard_normal((2, 5, 3)))

    with pytest.raises(RuntimeError, match="needs a forward first"):
        layer.backward(np.ones((2, 5, 4)))
