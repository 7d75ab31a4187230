"""Python autograd Functions traced through (``prim::PythonOp`` under ``torch.jit.trace``).

``torch.jit.trace`` records a ``torch.autograd.Function`` as one opaque ``prim::PythonOp``
(Bloom's GELU, custom activations, straight-through estimators), which no rule can lower.
Exporting is inference: the backward is never needed, so while tracing, ``Function.apply``
calls the Function's ``forward`` directly and the tracer records the ops it is made of. FX
tracing does the same (it would hand proxies to ``ctx.mark_dirty``); torch.export looks
inside on its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch


class _Context:
    """What a Function's ``forward`` may call on ``ctx`` when nothing will run backward."""

    needs_input_grad: tuple[bool, ...] = ()
    materialize_grads = True

    def __init__(self) -> None:
        self.saved_tensors: tuple[Any, ...] = ()

    def save_for_backward(self, *tensors: Any) -> None:
        self.saved_tensors = tensors

    def save_for_forward(self, *tensors: Any) -> None:
        """Forward-mode AD only: nothing to keep."""

    def mark_dirty(self, *tensors: Any) -> None:
        """In-place outputs need no autograd bookkeeping here."""

    def mark_non_differentiable(self, *tensors: Any) -> None:
        """No gradients are computed."""

    def set_materialize_grads(self, value: bool) -> None:
        self.materialize_grads = value


def _has_setup_context(cls: type) -> bool:
    """New-style Functions (``forward(*args)`` + ``setup_context``) take no ``ctx`` in forward."""
    base = torch.autograd.function._SingleLevelFunction.setup_context
    return getattr(cls.setup_context, "__func__", cls.setup_context) is not getattr(base, "__func__", base)


def _apply_inline(cls: type, *args: Any, **kwargs: Any) -> Any:
    if _has_setup_context(cls):
        return cls.forward(*args, **kwargs)
    return cls.forward(_Context(), *args, **kwargs)


@contextlib.contextmanager
def functions_inlined() -> Iterator[None]:
    """``torch.autograd.Function.apply`` runs ``forward`` in place for the duration."""
    original = torch.autograd.Function.__dict__["apply"]
    torch.autograd.Function.apply = classmethod(_apply_inline)  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        torch.autograd.Function.apply = original  # type: ignore[method-assign]
