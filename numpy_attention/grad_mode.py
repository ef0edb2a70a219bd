"""Grad mode: whether forwards keep what their backward needs.

``no_grad()`` is inference mode: inside it, every forward of this package returns a ctx of None
and layers keep nothing, so no memory is held for a backward that will not come. The flag is a
``ContextVar``: each thread and each asyncio task sees its own.

Tests: tests/numpy_attention/test_grad_mode.py.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

_GRAD_ENABLED = contextvars.ContextVar("numpy_attention_grad_enabled", default=True)


def is_grad_enabled() -> bool:
    """Whether forwards should keep what their backward needs (False inside ``no_grad()``)."""
    return _GRAD_ENABLED.get()


@contextlib.contextmanager
def no_grad() -> Iterator[None]:
    """Inference mode: forwards cache nothing, so a later ``backward`` raises."""
    token = _GRAD_ENABLED.set(False)
    try:
        yield
    finally:
        _GRAD_ENABLED.reset(token)
