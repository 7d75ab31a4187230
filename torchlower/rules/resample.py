"""Resampling: interpolate / upsample (nearest, nearest-exact, (bi/tri)linear, bicubic, antialias).

Every mode PyTorch offers is separable, so each spatial axis is resampled on its own with
weights computed at export time *by PyTorch's own kernel* applied to an identity basis: the
weights match torch exactly for any scale factor, ``align_corners`` and output size. Nearest
modes become a ``tract_core_gather`` with constant indices (exact for every dtype, NaN-safe);
the others a ``matmul`` with a constant (n_in × n_out) interpolation matrix.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from torchlower.core.values import SymDim, Value, constant
from torchlower.errors import LoweringError
from torchlower.rules import rule
from torchlower.rules.common import Builder, shape_of
from torchlower.rules.layout import broadcast_to

aten = torch.ops.aten
Scale = float | None


def _basis_1d(n: int) -> torch.Tensor:
    return torch.eye(n, dtype=torch.float64).reshape(n, 1, n)


def _basis_2d(n: int) -> torch.Tensor:
    return torch.eye(n, dtype=torch.float64).reshape(n, 1, 1, n)


# kind → (n_in, n_out, align_corners, scale) ↦ torch output on the basis, shaped (n_in, …, n_out)
_KERNELS: dict[str, Callable[[int, int, bool, Scale], torch.Tensor]] = {
    "nearest": lambda n, m, a, s: aten.upsample_nearest1d.default(_basis_1d(n), [m], s),
    "nearest_exact": lambda n, m, a, s: aten._upsample_nearest_exact1d.default(_basis_1d(n), [m], s),
    "linear": lambda n, m, a, s: aten.upsample_linear1d.default(_basis_1d(n), [m], a, s),
    "cubic": lambda n, m, a, s: aten.upsample_bicubic2d.default(_basis_2d(n), [1, m], a, None, s),
    "linear_aa": lambda n, m, a, s: aten._upsample_bilinear2d_aa.default(_basis_2d(n), [1, m], a, None, s),
    "cubic_aa": lambda n, m, a, s: aten._upsample_bicubic2d_aa.default(_basis_2d(n), [1, m], a, None, s),
}


def axis_weights(kind: str, n: int, m: int, align_corners: bool, scale: Scale) -> torch.Tensor:
    """The (n_in, n_out) matrix W with ``out[j] = sum_k in[k] * W[k, j]`` along one axis."""
    with torch.no_grad():
        return _KERNELS[kind](n, m, align_corners, scale).reshape(n, m)


def _resample_axis(b: Builder, x: Value, axis: int, kind: str, m: int, align: bool, scale: Scale) -> Value:
    shape = list(shape_of(x))
    n = shape[axis]
    if not isinstance(n, int):
        raise LoweringError(f"interpolate: spatial dim {axis} must be static, got {n!r}")
    if n == m and scale in (None, 1.0) and kind in ("nearest", "nearest_exact", "linear", "cubic"):
        return x  # identity resampling
    weights = axis_weights(kind, n, m, align, scale)
    shape[axis] = m
    if kind.startswith("nearest"):
        index = constant(weights.argmax(dim=0).to(torch.int64))
        return b.call("tract_core_gather", [x, index], {"axis": axis}, dtype=x.dtype, shape=tuple(shape))
    rank = len(shape)
    matrix = constant(weights.to(x.dtype).reshape((1,) * (rank - 2) + (n, m)))
    last = rank - 1
    if axis == last:
        return b.call("matmul", [x, matrix], dtype=x.dtype, shape=tuple(shape))
    perm = list(range(rank))
    perm[axis], perm[last] = last, axis
    moved = [shape_of(x)[p] for p in perm]
    t = b.call("transpose", [x], {"axes": perm}, dtype=x.dtype, shape=tuple(moved))
    moved[last] = m
    y = b.call("matmul", [t, matrix], dtype=x.dtype, shape=tuple(moved))
    return b.call("transpose", [y], {"axes": perm}, dtype=x.dtype, shape=tuple(shape))


def resample(
    b: Builder, x: Value, kind: str, size: Sequence[int], scales: Sequence[Scale], align: bool
) -> Value:
    """Resample the trailing ``len(size)`` axes of ``x`` to ``size``."""
    spatial = len(size)
    if x.rank != spatial + 2:
        raise LoweringError(f"interpolate: input must have rank {spatial + 2}, got {x.rank}")
    if not x.dtype or (not x.dtype.is_floating_point and not kind.startswith("nearest")):
        raise LoweringError(f"interpolate: mode {kind} needs a floating input, got {x.dtype}")
    for i, (m, s) in enumerate(zip(size, scales, strict=True)):
        x = _resample_axis(b, x, 2 + i, kind, int(m), align, s)
    return x


def _symbolic(x: Value) -> bool:
    return any(not isinstance(d, int) for d in shape_of(x)[2:])


def _symbolic_size(size: Sequence[Any] | None) -> bool:
    return size is not None and any(isinstance(d, SymDim) for d in size)


def _integer_factors(x: Value, factors: Sequence[float] | None, kind: str, align: bool | None) -> list[int]:
    """Scale factors of a resampling over dynamic H/W, which must be whole numbers (the weights
    then repeat with period ``s`` whatever the size); the weights of other factors depend on it."""
    fs = [float(f) for f in factors or ()]
    if not fs or any(f != int(f) or f < 1 for f in fs) or kind not in ("nearest", "linear"):
        raise LoweringError(
            f"interpolate over dynamic spatial dims {shape_of(x)[2:]} needs whole scale factors with "
            f"mode nearest or (bi/tri)linear (got scale_factor={factors}, mode {kind}, "
            f"align_corners={align}); give static sizes for the others"
        )
    return [int(f) for f in fs]


def _phases(b: Builder, x: Value, axis: int, kind: str, s: int) -> Value:
    """Resample ``axis`` by the whole factor ``s`` on a dynamic size: output ``s·i + r`` is
    ``x[i]`` (nearest) or a blend of ``x[i]`` with its clamped neighbour at torch's source offset
    ``(r + 0.5) / s - 0.5``; the ``s`` phases are interleaved by a stack and a reshape."""
    from torchlower.rules.layout import concat, dims_of, slice_dim, unsqueeze

    n = dims_of(x)[axis]
    ahead = concat(b, [slice_dim(b, x, axis, 0, 1), x], axis)  # x[max(i - 1, 0)] after the slice
    behind = concat(b, [x, slice_dim(b, x, axis, n - 1, n)], axis)  # x[min(i + 1, n - 1)]
    previous, following = slice_dim(b, ahead, axis, 0, n), slice_dim(b, behind, axis, 1, n + 1)
    phases = []
    for r in range(s):
        d = 0.0 if kind == "nearest" else (r + 0.5) / s - 0.5
        p = x
        if d != 0.0:
            other = previous if d < 0 else following
            near = b.call("mul", [x, 1.0 - abs(d)], dtype=x.dtype, shape=x.shape)
            far = b.call("mul", [other, abs(d)], dtype=x.dtype, shape=x.shape)
            p = b.call("add", [near, far], dtype=x.dtype, shape=x.shape)
        phases.append(unsqueeze(b, p, [axis + 1]))
    y = concat(b, phases, axis + 1) if s > 1 else phases[0]
    shape = list(dims_of(x))
    shape[axis] = n * s
    return b.call("reshape", [y], {"shape": shape}, dtype=x.dtype, shape=tuple(shape))


def symbolic_resample(
    b: Builder,
    x: Value,
    kind: str,
    factors: Sequence[float] | None,
    align: bool | None,
    size: Sequence[Any] | None = None,
) -> Value:
    """Resampling on dynamic H/W: by whole factors with fixed weights (``_phases``); to an output
    ``size`` that is no whole multiple of the input (a skip connection's own symbols), by source
    indices computed in the graph (``_gathered``)."""
    whole = factors is not None and all(float(f) == int(f) and f >= 1 for f in factors)
    if not whole and size is not None and kind in ("nearest", "nearest_exact", "linear"):
        for i, m in enumerate(size):
            x = _gathered(b, x, 2 + i, kind, m, bool(align))
        return x
    for i, s in enumerate(_integer_factors(x, factors, kind, align)):
        if s > 1:
            if align and kind == "linear":  # the weights depend on n: computed in the graph
                x = _gathered(b, x, 2 + i, kind, shape_of(x)[2 + i] * s, True)
            else:
                x = _phases(b, x, 2 + i, kind, s)
    return x


def _gathered(b: Builder, x: Value, axis: int, kind: str, m: Any, align: bool) -> Value:
    """``axis`` resampled to ``m`` (sizes symbolic or not) the way torch computes an output
    size's source indices: ``scale = n / m`` in float32 (``(n - 1) / (m - 1)`` aligned), nearest
    ``min(floor(j · scale), n - 1)`` (``j + 0.5`` for nearest-exact), linear a blend of the two
    neighbours of ``max((j + 0.5) · scale - 0.5, 0)``."""
    from torchlower.rules.common import cast, reshape, size_tensor
    from torchlower.rules.layout import dims_of, gather_axis
    from torchlower.rules.math import binary

    n = dims_of(x)[axis]
    if isinstance(m, SymDim) and isinstance(n, int) and n == 1:
        shape = list(dims_of(x))
        shape[axis] = m
        return broadcast_to(b, x, shape, x.dtype)
    j = b.call("tract_core_range", [0, m, 1], dtype=torch.int64, shape=(m,))
    j = cast(b, b.call("tract_core_cast", [j], {"to": "i64"}, dtype=torch.int64, shape=(m,)), torch.float32)
    n_f, m_f = size_tensor(b, n, torch.float32), size_tensor(b, m, torch.float32)
    last = binary(b, "sub", n_f, 1.0)
    if kind == "linear" and align:
        scale = binary(b, "div", last, binary(b, "max", binary(b, "sub", m_f, 1.0), 1.0))
        src = binary(b, "mul", j, scale)
    else:
        scale = binary(b, "div", n_f, m_f)
        shifted = binary(b, "add", j, 0.5) if kind != "nearest" else j
        src = binary(b, "mul", shifted, scale)
        if kind == "linear":
            src = binary(b, "max", binary(b, "sub", src, 0.5), 0.0)
    low = b.call("floor", [src], dtype=torch.float32, shape=(m,))
    i0 = cast(b, binary(b, "min", low, last), torch.int64)
    if kind != "linear":
        return gather_axis(b, x, i0, axis)
    i1 = cast(b, binary(b, "min", binary(b, "add", low, 1.0), last), torch.int64)
    shape: list = [1] * x.rank
    shape[axis] = m
    w = reshape(b, cast(b, binary(b, "sub", src, low), x.dtype or torch.float32), shape)
    lo, hi = gather_axis(b, x, i0, axis), gather_axis(b, x, i1, axis)
    return binary(b, "add", lo, binary(b, "mul", binary(b, "sub", hi, lo), w))


def size_factors(x: Value, size: Sequence[Any] | None) -> list[float] | None:
    """An output ``size`` on dynamic H/W as whole factors of the input's (a U-Net decoder's
    ``interpolate(x, size=skip.shape[2:])`` with ``16*h`` from ``8*h`` is a factor of 2), else None."""
    import sympy

    if size is None or len(size) != x.rank - 2:
        return None
    factors = []
    for o, d in zip(size, shape_of(x)[2:], strict=True):
        ratio = sympy.simplify(sympy.sympify(getattr(o, "expr", o)) / sympy.sympify(getattr(d, "expr", d)))
        if not ratio.is_Integer or ratio < 1:
            return None
        factors.append(float(ratio))
    return factors


def _vec_size(
    name: str, x: Value, size: Sequence[int] | None, align: bool | None, factors: Sequence[float] | None
) -> list[int]:
    """Output size of a ``.vec`` overload, computed by torch itself on a meta tensor."""
    if size is not None:
        return [int(s) for s in size]
    spatial = [int(d) for d in shape_of(x)[2:]]  # type: ignore[arg-type]
    meta = torch.empty((1, 1, *spatial), device="meta")
    op = getattr(aten, name).vec
    out = op(meta, None, factors) if align is None else op(meta, None, align, factors)
    return list(out.shape[2:])


def _scales(factors: Sequence[float] | None, spatial: int) -> list[Scale]:
    return list(factors) if factors is not None else [None] * spatial


_NEAREST = {
    "upsample_nearest1d": "nearest",
    "upsample_nearest2d": "nearest",
    "upsample_nearest3d": "nearest",
    "_upsample_nearest_exact1d": "nearest_exact",
    "_upsample_nearest_exact2d": "nearest_exact",
    "_upsample_nearest_exact3d": "nearest_exact",
}
_INTERPOLATING = {
    "upsample_linear1d": "linear",
    "upsample_bilinear2d": "linear",
    "upsample_trilinear3d": "linear",
    "upsample_bicubic2d": "cubic",
    "_upsample_bilinear2d_aa": "linear_aa",
    "_upsample_bicubic2d_aa": "cubic_aa",
}


def _nearest_rules(name: str, kind: str) -> None:
    @rule(f"aten::{name}.vec")
    def vec(
        b: Builder, x: Value, output_size: Sequence[int] | None, scale_factors: Sequence[float] | None
    ) -> Value:
        if _symbolic(x) or _symbolic_size(output_size):
            factors = scale_factors if output_size is None else size_factors(x, output_size)
            return symbolic_resample(b, x, kind, factors, None, output_size)
        size = _vec_size(name, x, output_size, None, scale_factors)
        return resample(b, x, kind, size, _scales(scale_factors, len(size)), False)

    @rule(f"aten::{name}")
    def default(
        b: Builder, x: Value, output_size: Sequence[int], s0: Scale = None, s1: Scale = None, s2: Scale = None
    ) -> Value:
        return resample(b, x, kind, output_size, [s0, s1, s2][: len(output_size)], False)

    vec.__doc__ = f"{name}.vec(Tensor input, SymInt[]? output_size, float[]? scale_factors) -> Tensor"
    default.__doc__ = f"{name}(Tensor self, SymInt[] output_size, float? scales...) -> Tensor"


def _from_one_pixel(x: Value, size: Sequence[Any]) -> bool:
    """A 1×1 map (an ASPP image-pooling branch) resized to a dynamic size: a broadcast."""
    return all(d == 1 for d in shape_of(x)[2:]) and any(not isinstance(d, int) for d in size)


def _interpolating_rules(name: str, kind: str) -> None:
    @rule(f"aten::{name}.vec")
    def vec(
        b: Builder,
        x: Value,
        output_size: Sequence[int] | None,
        align_corners: bool,
        scale_factors: Sequence[float] | None,
    ) -> Value:
        if output_size is not None and _from_one_pixel(x, output_size):
            return broadcast_to(b, x, [*shape_of(x)[:2], *output_size], x.dtype)  # every output reads it
        if _symbolic(x) or _symbolic_size(output_size):
            factors = scale_factors if output_size is None else size_factors(x, output_size)
            return symbolic_resample(b, x, kind, factors, align_corners, output_size)
        size = _vec_size(name, x, output_size, align_corners, scale_factors)
        return resample(b, x, kind, size, _scales(scale_factors, len(size)), align_corners)

    @rule(f"aten::{name}")
    def default(
        b: Builder,
        x: Value,
        output_size: Sequence[int],
        align_corners: bool,
        s0: Scale = None,
        s1: Scale = None,
        s2: Scale = None,
    ) -> Value:
        return resample(b, x, kind, output_size, [s0, s1, s2][: len(output_size)], align_corners)

    vec.__doc__ = (
        f"{name}.vec(Tensor input, SymInt[]? output_size, bool align_corners, float[]? scale_factors)"
    )
    default.__doc__ = f"{name}(Tensor self, SymInt[] output_size, bool align_corners, float? scales...)"


for _name, _kind in _NEAREST.items():
    _nearest_rules(_name, _kind)
for _name, _kind in _INTERPOLATING.items():
    _interpolating_rules(_name, _kind)
