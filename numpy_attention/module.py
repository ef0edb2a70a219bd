"""A small Module base: parameters, gradients, buffers, state dicts, train/eval, and the
arguments each layer was built with.

It mirrors the parts of ``torch.nn.Module`` that the attention layers need, with one difference
that makes the math visible: a layer's ``backward(dout)`` is written by hand. ``backward`` returns
the gradient of the input and *adds* each parameter's gradient into ``named_grads()``, like torch's
``.grad``; ``zero_grad()`` clears them. A module keeps the context of its last forward only, so
each forward is followed by at most one backward; the base checks ``dout`` against that forward's
output (shape, dtype) before it hands the context over, so a rejected ``dout`` can be retried.

Tests: tests/numpy_attention/test_module.py (every layer of the package), and
tests/numpy_attention/test_state.py for the constructor arguments in module files.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple, TypeVar

import numpy as np

from . import validation
from .grad_mode import is_grad_enabled

_ModuleT = TypeVar("_ModuleT", bound="Module")

# Constructor arguments that are not part of a layer's configuration: ``rng`` only draws the
# initial weights (replaced by any loaded state) and seeds the dropout generator.
_NOT_CONFIGURATION = ("rng",)

# Array kinds load_state_dict casts to the module's dtype: bool, signed and unsigned integers,
# floats. Complex would lose its imaginary part, strings would be parsed, objects unpickled.
_REAL_KINDS = "biuf"

BufferCheck = Callable[[str, np.ndarray], None]


class _Saved(NamedTuple):
    """What the last forward left for the backward: its ctx and its output's shape and dtype."""

    ctx: Any
    shape: tuple[int, ...]
    dtype: np.dtype


class Module:
    """Base class for NumPy layers.

    Subclasses register parameters with ``register_parameter``, buffers (state that is saved but
    not trained, such as the book's causal ``mask``) with ``register_buffer``, and child modules by
    plain attribute assignment. Names in ``state_dict()`` are dotted paths, identical to the keys
    of the torch twin's ``state_dict()``.
    """

    def __new__(cls: type[_ModuleT], *args: Any, **kwargs: Any) -> _ModuleT:
        # Every layer's constructor arguments, recorded once here rather than by each layer;
        # ``constructor_args()`` reads them. (copy and pickle call __new__ without arguments and
        # then restore the recorded ones with the rest of the instance's state.)
        module = super().__new__(cls)
        object.__setattr__(module, "_init_args", (args, kwargs))
        return module

    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_grads", {})
        object.__setattr__(self, "_buffers", {})
        object.__setattr__(self, "_buffer_checks", {})
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "training", True)
        object.__setattr__(self, "_ctx", None)

    def constructor_args(self) -> dict[str, Any]:
        """The arguments this module was built with, by name, defaults filled in, ``rng`` left
        out; NumPy scalars become Python ones. ``type(module)(**module.constructor_args())``
        builds a module of the same configuration (with fresh weights)."""
        args, kwargs = self._init_args
        bound = inspect.signature(type(self).__init__).bind(self, *args, **kwargs)
        bound.apply_defaults()
        return {
            name: value.item() if isinstance(value, np.generic) else value
            for name, value in list(bound.arguments.items())[1:]  # after self
            if name not in _NOT_CONFIGURATION
        }

    # -- registration ------------------------------------------------------------------------
    def register_parameter(self, name: str, value: np.ndarray) -> None:
        value = validation.float_array(name, value)
        self._parameters[name] = value
        self._grads[name] = np.zeros_like(value)

    def register_buffer(
        self, name: str, value: np.ndarray, check: BufferCheck | None = None
    ) -> None:
        """A buffer is saved and loaded but not trained. ``check(key, array)``, if given, vets
        every array ``load_state_dict`` would put there (raising ``ValueError``)."""
        self._buffers[name] = np.asarray(value)
        if check is not None:
            self._buffer_checks[name] = check

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, Module):
            self._modules[name] = value
        elif name in self._parameters:
            self._parameters[name] = value
            return
        elif name in self._buffers:
            self._buffers[name] = value
            return
        object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> Any:
        # Only reached when normal lookup fails: parameters, buffers and children live in dicts.
        for store in ("_parameters", "_buffers", "_modules"):
            entries = self.__dict__.get(store)
            if entries is not None and name in entries:
                return entries[name]
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    # -- calling -----------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def backward(self, dout: np.ndarray) -> Any:
        raise NotImplementedError

    def _save_ctx(self, ctx: Any, out: np.ndarray) -> None:
        """Keep ``ctx`` and the shape and dtype of the forward's ``out`` for the next backward,
        unless inside ``no_grad()``."""
        self._ctx = _Saved(ctx, out.shape, out.dtype) if is_grad_enabled() else None

    def _pop_ctx(self, dout: Any) -> tuple[np.ndarray, Any]:
        """Check ``dout`` against the last forward's output, then hand over that forward's ctx
        and forget it (one forward, one backward). A rejected ``dout`` leaves the ctx in place.

        Returns:
            ``dout`` as an array of the output's dtype (a gradient takes its tensor's dtype, as
            in torch), and the ctx.
        """
        saved = self._ctx
        if saved is None:
            raise RuntimeError(
                f"{type(self).__name__}.backward needs a forward first (one that did not run "
                "under no_grad(), and whose context was not used by an earlier backward)"
            )
        dout = validation.grad_output(dout, saved.shape, saved.dtype)
        self._ctx = None
        return dout, saved.ctx

    def _accumulate(self, name: str, grad: np.ndarray) -> None:
        """Add ``grad`` into the gradient of parameter ``name`` (a parameter can be used twice)."""
        self._grads[name] += grad

    # -- traversal ---------------------------------------------------------------------------
    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        yield prefix, self
        for name, child in self._modules.items():
            yield from child.named_modules(f"{prefix}{name}.")

    def children(self) -> Iterator[Module]:
        yield from self._modules.values()

    def named_parameters(self) -> dict[str, np.ndarray]:
        """Every parameter, keyed by its dotted state-dict name."""
        return {
            prefix + name: value
            for prefix, module in self.named_modules()
            for name, value in module._parameters.items()
        }

    def named_grads(self) -> dict[str, np.ndarray]:
        """Every parameter's accumulated gradient, keyed like ``named_parameters()``."""
        return {
            prefix + name: value
            for prefix, module in self.named_modules()
            for name, value in module._grads.items()
        }

    def named_buffers(self) -> dict[str, np.ndarray]:
        return {
            prefix + name: value
            for prefix, module in self.named_modules()
            for name, value in module._buffers.items()
        }

    def zero_grad(self) -> None:
        for _, module in self.named_modules():
            for name, grad in module._grads.items():
                module._grads[name] = np.zeros_like(grad)

    # -- modes and dtypes --------------------------------------------------------------------
    def train(self, mode: bool = True) -> Module:
        for _, module in self.named_modules():
            object.__setattr__(module, "training", mode)
        return self

    def eval(self) -> Module:
        return self.train(False)

    @property
    def dtype(self) -> np.dtype | None:
        """The dtype of the parameters (None for a layer without any)."""
        params = self.named_parameters()
        return next(iter(params.values())).dtype if params else None

    def astype(self, dtype: Any) -> Module:
        """Cast parameters, gradients and float buffers in place (torch's ``.to(dtype)``)."""
        dtype = np.dtype(dtype)
        if not np.issubdtype(dtype, np.floating):
            raise TypeError(f"astype needs a floating dtype, got {dtype}")
        for _, module in self.named_modules():
            for store in (module._parameters, module._grads):
                for name, value in store.items():
                    store[name] = value.astype(dtype)
            for name, value in module._buffers.items():
                if np.issubdtype(value.dtype, np.floating):
                    module._buffers[name] = value.astype(dtype)
            object.__setattr__(module, "_ctx", None)
        return self

    # -- state dicts -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, np.ndarray]:
        """Parameters then buffers of each module, children after their parent, as copies."""
        state: dict[str, np.ndarray] = {}
        for prefix, module in self.named_modules():
            for name, value in {**module._parameters, **module._buffers}.items():
                state[prefix + name] = value.copy()
        return state

    def load_state_dict(self, state: Mapping[str, Any], strict: bool = True) -> None:
        """Copy arrays from ``state`` into this module, cast to each entry's dtype.

        Accepts anything ``np.asarray`` takes (so a torch state dict of CPU tensors works) that
        holds real numbers: bool, integer and float arrays are cast, as torch does; complex,
        string and object arrays raise ``TypeError`` naming the key. With ``strict=True``
        missing or unexpected keys raise ``KeyError`` naming them; a wrong shape, or a buffer
        its check refuses (the book's causal ``mask`` must be the causal triangle), raises
        ``ValueError`` whatever ``strict`` says. Nothing is changed unless all entries fit.
        """
        slots = {}
        for prefix, module in self.named_modules():
            for store_name in ("_parameters", "_buffers"):
                for name in getattr(module, store_name):
                    slots[prefix + name] = (module, store_name, name)
        if strict:
            missing = sorted(set(slots) - set(state))
            unexpected = sorted(set(state) - set(slots))
            if missing or unexpected:
                raise KeyError(
                    f"load_state_dict: missing keys {missing}, unexpected keys {unexpected}"
                )
        updates = []
        for key, (module, store_name, name) in slots.items():
            if key not in state:
                continue
            current = getattr(module, store_name)[name]
            value = _to_numpy(state[key])
            if value.dtype.kind not in _REAL_KINDS:
                raise TypeError(
                    f"load_state_dict: {key!r} has dtype {value.dtype}; a parameter or buffer "
                    "takes real numbers (bool, integer or float)"
                )
            if value.shape != current.shape:
                raise ValueError(
                    f"load_state_dict: {key!r} has shape {value.shape}, "
                    f"the module expects {current.shape}"
                )
            value = value.astype(current.dtype, copy=True)
            if store_name == "_buffers" and name in module._buffer_checks:
                module._buffer_checks[name](f"load_state_dict: {key!r}", value)
            updates.append((module, store_name, name, value))
        for module, store_name, name, value in updates:
            getattr(module, store_name)[name] = value

    def __repr__(self) -> str:
        """torch's layout: ``Name(args)``, or with children the arguments and then each child
        on its own indented line."""
        extra = self.extra_repr()
        if not self._modules:
            return f"{type(self).__name__}({extra})"
        lines = [f"{type(self).__name__}("] + ([f"  {extra}"] if extra else [])
        for name, child in self._modules.items():
            child_repr = repr(child).replace("\n", "\n  ")
            lines.append(f"  ({name}): {child_repr}")
        return "\n".join(lines + [")"])

    def extra_repr(self) -> str:
        """The constructor arguments, as ``name=value`` (what torch layers print by hand)."""
        return ", ".join(f"{name}={value!r}" for name, value in self.constructor_args().items())


def _to_numpy(value: Any) -> np.ndarray:
    """``np.asarray`` that also takes tensors needing ``.detach().cpu()`` (duck-typed, no torch)."""
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        value = value.detach().cpu()
        if hasattr(value, "float") and str(getattr(value, "dtype", "")) == "torch.bfloat16":
            value = value.float()
    return np.asarray(value)


class ModuleList(Module):
    """Children named ``0, 1, ...`` so state-dict keys read ``heads.0.W_query.weight``."""

    def __init__(self, modules: list[Module]) -> None:
        super().__init__()
        for index, module in enumerate(modules):
            self._modules[str(index)] = module

    def __getitem__(self, index: int) -> Module:
        return self._modules[str(index)]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def extra_repr(self) -> str:
        return ""  # the children are listed below the name
