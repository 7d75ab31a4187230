"""The kernels every graph of a model must run, recorded from one PyTorch run, and each as a
one-op module to measure alone (``bench/kernel_floor.py`` measures them).

What is recorded, and what is not, is described in ``bench/kernel_floor.py``'s docstring.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode


@dataclass(frozen=True)
class Kernel:
    """One irreducible computation: a kind and everything that fixes its cost (shapes, options)."""

    kind: str  # linear | conv | sdpa | layer_norm | rms_norm | group_norm | gelu | embedding
    key: tuple[Any, ...]

    def label(self) -> str:
        return f"{self.kind}{list(self.key)}"


# ---- (2) what the model computes --------------------------------------------------------------
class Recorder(TorchFunctionMode):
    """Kernels in call order, from the torch functions a module's forward calls."""

    def __init__(self) -> None:
        super().__init__()
        self.kernels: list[Kernel] = []
        self.masks: dict[Kernel, torch.Tensor] = {}
        self.weights: dict[Kernel, tuple[torch.Tensor, ...]] = {}
        self._pending: list[tuple[str, Any]] = []  # eager attention in progress
        self.depth = 0  # > 0 inside a recorded norm module
        self.lookups: list[tuple[int, torch.Tensor]] = []  # (kernel index, indices) of each embedding

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.depth:
            return out
        name = getattr(func, "__name__", "")
        a = list(args)
        if func is F.linear:
            x, w = a[0], a[1]
            b = a[2] if len(a) > 2 else kwargs.get("bias")
            self._add(Kernel("linear", (tuple(x.shape), tuple(w.shape), b is not None)), (w, b))
        elif func in (F.conv1d, F.conv2d):
            x, w = a[0], a[1]
            b = a[2] if len(a) > 2 else kwargs.get("bias")
            names = (("stride", 1), ("padding", 0), ("dilation", 1), ("groups", 1))
            opts = [kwargs.get(k, a[i] if len(a) > i else d) for i, (k, d) in enumerate(names, start=3)]
            norm = tuple(tuple(o) if isinstance(o, (list, tuple)) else o for o in opts)
            self._add(Kernel("conv", (tuple(x.shape), tuple(w.shape), b is not None, *norm)), (w, b))
        elif func is F.scaled_dot_product_attention:
            q, k, v = a[0], a[1], a[2]
            mask = a[3] if len(a) > 3 else kwargs.get("attn_mask")
            causal = bool(kwargs.get("is_causal", a[5] if len(a) > 5 else False))
            scale = kwargs.get("scale")
            kern = Kernel("sdpa", (tuple(q.shape), tuple(k.shape), tuple(v.shape),
                                   None if mask is None else tuple(mask.shape), causal, scale))  # fmt: skip
            self._add(kern, ())
            if mask is not None:
                self.masks[kern] = mask.detach().clone()
        elif func is F.layer_norm:
            x, shape = a[0], tuple(a[1])
            w = a[2] if len(a) > 2 else kwargs.get("weight")
            self._add(Kernel("layer_norm", (tuple(x.shape), shape, w is not None)), ())
        elif func is F.group_norm:
            x, groups = a[0], a[1]
            self._add(Kernel("group_norm", (tuple(x.shape), groups)), ())
        elif func is F.gelu:
            self._add(Kernel("gelu", (tuple(a[0].shape), kwargs.get("approximate", "none"))), ())
        elif func is F.embedding:
            idx, w = a[0], a[1]
            self.lookups.append((len(self.kernels), idx.detach().clone()))
            self._add(Kernel("embedding", (tuple(idx.shape), tuple(w.shape))), ())
        elif name in ("matmul", "__matmul__", "bmm") and _activation(a[0]) and _activation(a[1]):
            self._eager_matmul(a[0], a[1], out)
        elif name in ("softmax", "_softmax") and self._pending:
            self._pending.append(("softmax", None))
        elif name in ("add", "__add__", "__iadd__") and self._pending and len(a) > 1:
            other = a[1] if isinstance(a[1], torch.Tensor) and a[1].ndim >= 2 else None
            if other is not None:
                self._pending.append(("mask", other.detach().clone()))
        return out

    def _add(self, kernel: Kernel, weights: tuple[Any, ...]) -> None:
        self.kernels.append(kernel)
        self.weights.setdefault(kernel, weights)

    def _eager_matmul(self, x: torch.Tensor, y: torch.Tensor, out: torch.Tensor) -> None:
        """``q·kᵀ`` opens an eager attention; the ``p·v`` after its softmax closes it."""
        if self._pending and any(k == "softmax" for k, _ in self._pending):
            q_shape, k_shape = self._pending[0][1]
            mask = next((m for k, m in self._pending if k == "mask"), None)
            kern = Kernel("sdpa", (q_shape, k_shape, tuple(y.shape),
                                   None if mask is None else tuple(mask.shape), False, 1.0))  # fmt: skip
            self._add(kern, ())
            if mask is not None:
                self.masks[kern] = mask
            self._pending = []
        elif x.ndim >= 3:
            q_shape = tuple(x.shape)
            k_shape = (*y.shape[:-2], y.shape[-1], y.shape[-2])  # y is kᵀ
            self._pending = [("qk", (q_shape, k_shape))]


def _activation(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and not isinstance(t, nn.Parameter) and t.ndim >= 3


def record(model: nn.Module, args: tuple[torch.Tensor, ...]) -> Recorder:
    """The model's kernels; an embedding lookup whose indices do not change with the input
    (position ids, token types, T5's relative buckets) is a constant tract folds, not a kernel."""
    rec = _record(model, args)
    g = torch.Generator().manual_seed(1)
    other = tuple(torch.randn(a.shape, generator=g) if a.is_floating_point()
                  else torch.randint(0, int(a.max()) + 1, a.shape, generator=g) for a in args)  # fmt: skip
    again = _record(model, other)
    constant = {i for (i, x), (_, y) in zip(rec.lookups, again.lookups, strict=True) if torch.equal(x, y)}
    rec.kernels = [k for i, k in enumerate(rec.kernels) if i not in constant]
    return rec


def _record(model: nn.Module, args: tuple[torch.Tensor, ...]) -> Recorder:
    rec = Recorder()
    hooks = []
    for m in model.modules():
        n = type(m).__name__
        if (n.endswith("LayerNorm") or n.endswith("RMSNorm")) and not isinstance(m, nn.LayerNorm):

            def pre(mod: nn.Module, inp: tuple[Any, ...]) -> None:
                rec._add(Kernel("rms_norm", (tuple(inp[0].shape),)), ())
                rec.depth += 1

            def post(mod: nn.Module, inp: Any, out: Any) -> None:
                rec.depth -= 1

            hooks += [m.register_forward_pre_hook(pre), m.register_forward_hook(post)]
    try:
        with torch.no_grad(), rec:
            model(*args)
    finally:
        for h in hooks:
            h.remove()
    return rec


# ---- (3) each kernel standalone -----------------------------------------------------------------
class _RMS(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.rand(c) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))


class _Fn(nn.Module):
    """A one-kernel module: ``fn(x, *params)``."""

    def __init__(self, fn: Any, params: tuple[torch.Tensor | None, ...] = (), mask: Any = None) -> None:
        super().__init__()
        self.fn = fn
        self.params = nn.ParameterList([nn.Parameter(p.detach().clone()) for p in params if p is not None])
        self.has = [p is not None for p in params]
        self.register_buffer("mask", mask)

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        it = iter(self.params)
        ps = [next(it) if h else None for h in self.has]
        return self.fn(*xs, *ps, *([self.mask] if self.mask is not None else []))


def standalone(k: Kernel, rec: Recorder) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    if k.kind == "linear":
        x, _, _ = k.key
        w, b = rec.weights[k]
        return _Fn(F.linear, (w, b)), (rand(*x),)
    if k.kind == "conv":
        x, _, _, stride, padding, dilation, groups = k.key
        w, b = rec.weights[k]
        conv = F.conv1d if len(x) == 3 else F.conv2d

        def fn(t: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
            return conv(t, w, b, stride, padding, dilation, groups)

        return _Fn(fn, (w, b)), (rand(*x),)
    if k.kind == "sdpa":
        q, kk, v, _, causal, scale = k.key

        def att(q_: torch.Tensor, k_: torch.Tensor, v_: torch.Tensor, m: Any = None) -> torch.Tensor:
            return F.scaled_dot_product_attention(q_, k_, v_, attn_mask=m, is_causal=causal, scale=scale)

        return _Fn(att, (), rec.masks.get(k)), (rand(*q), rand(*kk), rand(*v))
    if k.kind == "layer_norm":
        x, shape, affine = k.key
        return nn.LayerNorm(shape, elementwise_affine=affine), (rand(*x),)
    if k.kind == "rms_norm":
        (x,) = k.key
        return _RMS(x[-1]), (rand(*x),)
    if k.kind == "group_norm":
        x, groups = k.key
        return nn.GroupNorm(groups, x[1]), (rand(*x),)
    if k.kind == "gelu":
        x, approximate = k.key
        return nn.GELU(approximate=approximate), (rand(*x),)
    if k.kind == "embedding":
        idx, (n, d) = k.key
        return nn.Embedding(n, d), (torch.randint(0, n, idx, generator=g),)
    raise ValueError(k.kind)


@contextlib.contextmanager
def decomposed() -> Iterator[None]:
    """torchlower without the flash-SDPA fusion: attention as matmul → softmax → matmul."""
    from torchlower.nnef import fusions

    saved = fusions.fuse_attention
    fusions.fuse_attention = lambda b: False
    try:
        yield
    finally:
        fusions.fuse_attention = saved
