"""Complex tensors as a trailing real dim of 2, the layout tract's FFT ops read and write.

A ``Value`` with a complex dtype keeps torch's (logical) shape; the NNEF tensor behind it is
real with one more trailing axis ``[re, im]``. Only rules marked ``complex_aware`` receive such
values (the session refuses the others by name, so no real-valued rule ever misreads one):
``view_as_real`` / ``view_as_complex`` relabel the same tensor; ``real``, ``imag``, ``abs``,
``angle``, ``conj`` and products are written on the two parts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from torchlower.core.values import Dim, Value, constant
from torchlower.errors import LoweringError
from torchlower.rules import rule
from torchlower.rules.common import Builder, Operand, broadcast_shapes, unsqueeze_to
from torchlower.rules.layout import concat, dims_of, slice_dim

COMPLEX_OF = {torch.float32: torch.complex64, torch.float16: torch.complex32, torch.float64: torch.complex128}
REAL_OF = {c: r for r, c in COMPLEX_OF.items()}


def complex_aware(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a rule as reading complex values in the ``[re, im]`` layout."""
    fn.complex_aware = True  # type: ignore[attr-defined]
    return fn


def is_complex(x: object) -> bool:
    return isinstance(x, Value) and x.dtype is not None and x.dtype.is_complex


def physical(z: Value) -> Value:
    """The real ``[..., 2]`` tensor behind a complex value (same NNEF name)."""
    if z.dtype not in REAL_OF:
        raise LoweringError(f"complex dtype {z.dtype} is not supported (complex64 is)")
    if z.is_const:
        return constant(torch.view_as_real(z.const.resolve_conj()).contiguous())
    return z.with_meta(REAL_OF[z.dtype], (*dims_of(z), 2))


def logical(x: Value) -> Value:
    """A real ``[..., 2]`` tensor seen as the complex value it holds."""
    if x.dtype not in COMPLEX_OF:
        raise LoweringError(f"a complex value needs float parts, got {x.dtype}")
    return Value(x.name, COMPLEX_OF[x.dtype], tuple(dims_of(x)[:-1]), x.const, x.label)


def to_complex(b: Builder, x: Value) -> Value:
    """A real tensor as complex ``[x, 0]`` (physical)."""
    if is_complex(x):
        return physical(x)
    if x.dtype is None or not x.dtype.is_floating_point:
        x = b.call("tract_core_cast", [x], {"to": "f32"}, dtype=torch.float32, shape=x.shape)
    if x.is_const:
        return constant(torch.stack([x.const, torch.zeros_like(x.const)], -1))
    shape = (*dims_of(x), 1)
    col = b.call("unsqueeze", [x], {"axes": [len(shape) - 1]}, dtype=x.dtype, shape=shape)
    pads = [(0, 0)] * (len(shape) - 1) + [(0, 1)]
    return b.call("pad", [col], {"padding": pads, "border": "constant", "value": 0.0}, dtype=x.dtype,
                  shape=(*shape[:-1], 2))  # fmt: skip


def part(b: Builder, p: Value, k: int) -> Value:
    """Real (k = 0) or imaginary (k = 1) part of a physical complex tensor."""
    last = p.rank - 1
    s = slice_dim(b, p, last, k, k + 1)
    return b.call("squeeze", [s], {"axes": [last]}, dtype=p.dtype, shape=tuple(dims_of(p)[:-1]))


def join(b: Builder, re: Value, im: Value) -> Value:
    """The physical complex tensor ``[re, im]``."""
    shape: list[Dim] = [*dims_of(re), 1]
    cols = [
        b.call("unsqueeze", [v], {"axes": [len(shape) - 1]}, dtype=v.dtype, shape=tuple(shape))
        for v in (re, im)
    ]
    return concat(b, cols, len(shape) - 1)


def _bin(b: Builder, op: str, x: Operand, y: Operand) -> Value:
    """``x op y`` broadcast as torch does: the lower-rank side gets leading axes (tract wants
    equal ranks), the result the broadcast shape."""
    values = [v for v in (x, y) if isinstance(v, Value)]
    assert values
    rank = max(v.rank for v in values)
    x, y = unsqueeze_to(b, x, rank), unsqueeze_to(b, y, rank)
    shape = broadcast_shapes(*(dims_of(v) for v in (x, y) if isinstance(v, Value)))
    return b.call(op, [x, y], dtype=values[0].dtype, shape=tuple(shape))


def scale(b: Builder, p: Value, factor: float) -> Value:
    return p if factor == 1.0 else b.call("mul", [p, float(factor)], dtype=p.dtype, shape=p.shape)


def conj_physical(b: Builder, p: Value) -> Value:
    signs = constant(torch.tensor([1.0, -1.0], dtype=p.dtype).reshape([1] * (p.rank - 1) + [2]))
    return b.call("mul", [p, signs], dtype=p.dtype, shape=p.shape)


def squared_magnitude(b: Builder, p: Value) -> Value:
    sq = b.call("mul", [p, p], dtype=p.dtype, shape=p.shape)
    s = b.call("sum_reduce", [sq], {"axes": [p.rank - 1]}, dtype=p.dtype, shape=(*dims_of(p)[:-1], 1))
    return b.call("squeeze", [s], {"axes": [p.rank - 1]}, dtype=p.dtype, shape=tuple(dims_of(p)[:-1]))


@rule("aten::view_as_real")
@complex_aware
def view_as_real(b: Builder, z: Value) -> Value:
    """view_as_real(Tensor(a) self) -> Tensor(a): the same tensor, its ``[re, im]`` axis shown."""
    if not is_complex(z):
        raise LoweringError("view_as_real: expects a complex tensor")
    return physical(z)


@rule("aten::view_as_complex")
@complex_aware
def view_as_complex(b: Builder, x: Value) -> Value:
    """view_as_complex(Tensor(a) self) -> Tensor(a): a trailing axis of 2 read as ``[re, im]``."""
    if dims_of(x)[-1] != 2:
        raise LoweringError(f"view_as_complex: the last dim must be 2, got shape {dims_of(x)}")
    return logical(x)


@rule("aten::real")
@complex_aware
def real(b: Builder, z: Value) -> Value:
    """real(Tensor(a) self) -> Tensor(a)"""
    return part(b, physical(z), 0) if is_complex(z) else z


@rule("aten::imag")
@complex_aware
def imag(b: Builder, z: Value) -> Value:
    """imag(Tensor(a) self) -> Tensor(a)"""
    if not is_complex(z):
        raise LoweringError("imag: expects a complex tensor (torch refuses real ones)")
    return part(b, physical(z), 1)


@rule("aten::angle")
@complex_aware
def angle(b: Builder, z: Value) -> Value:
    """angle(Tensor self) -> Tensor: atan2(imag, real) (0 or pi for real inputs)."""
    from torchlower.rules.math import atan2

    if not is_complex(z):
        zero = constant(torch.zeros((1,) * z.rank, dtype=z.dtype))
        return atan2(b, b.call("mul", [z, zero], dtype=z.dtype, shape=z.shape), z)
    p = physical(z)
    return atan2(b, part(b, p, 1), part(b, p, 0))


@rule("aten::resolve_conj", "aten::resolve_neg")
@complex_aware
def resolve_conj(b: Builder, z: Value) -> Value:
    """resolve_conj(Tensor(a) self) -> Tensor(a): materializes a lazy conjugate; the values (what
    the lowering carries) are already conjugated by ``conj``, so nothing changes."""
    return z


@rule("aten::conj_physical", "aten::conj", "aten::_conj")
@complex_aware
def conj(b: Builder, z: Value) -> Value:
    """conj_physical(Tensor self) -> Tensor (also conj, _conj; real tensors unchanged)."""
    if not is_complex(z) or z.dtype is None:
        return z
    return logical(conj_physical(b, physical(z)))


def complex_abs(b: Builder, z: Value) -> Value:
    """|z| = sqrt(re² + im²)."""
    m = squared_magnitude(b, physical(z))
    return b.call("sqrt", [m], dtype=m.dtype, shape=m.shape)


def complex_mul(b: Builder, x: Operand, y: Operand) -> Value:
    """(a + bi)(c + di) with either side possibly real (then it scales both parts)."""
    if not is_complex(x):
        x, y = y, x
    if isinstance(x, complex) and isinstance(y, Value):  # a real tensor times a Python complex
        x, y = y, x
    assert isinstance(x, Value)
    p = physical(x) if is_complex(x) else to_complex(b, x)
    if isinstance(y, complex):  # a Python complex scalar: (a + bi)(c + di) on the parts
        a, bb = part(b, p, 0), part(b, p, 1)
        re = _bin(b, "sub", _bin(b, "mul", a, y.real), _bin(b, "mul", bb, y.imag))
        im = _bin(b, "add", _bin(b, "mul", a, y.imag), _bin(b, "mul", bb, y.real))
        return logical(join(b, re, im))
    if not isinstance(y, Value):
        y = float(y)  # a Python int would print as an integer literal (tract: no F32 × TDim)
    if not is_complex(y):
        other = unsqueeze_to(b, y, p.rank - 1) if isinstance(y, Value) else y
        if isinstance(other, Value):
            other = b.call("unsqueeze", [other], {"axes": [other.rank]}, dtype=other.dtype,
                           shape=(*dims_of(other), 1))  # fmt: skip
        return logical(_bin(b, "mul", p, other))
    assert isinstance(y, Value)
    q = physical(y)
    a, bb, c, d = part(b, p, 0), part(b, p, 1), part(b, q, 0), part(b, q, 1)
    re = _bin(b, "sub", _bin(b, "mul", a, c), _bin(b, "mul", bb, d))
    im = _bin(b, "add", _bin(b, "mul", a, d), _bin(b, "mul", bb, c))
    return logical(join(b, re, im))


def complex_add(b: Builder, op: str, x: Operand, y: Operand, alpha: float) -> Value:
    """x ± alpha·y on complex values (a real side adds to the real part only)."""
    xs = physical(x) if is_complex(x) else to_complex(b, x)  # type: ignore[arg-type]
    ys = physical(y) if is_complex(y) else to_complex(b, y)  # type: ignore[arg-type]
    return logical(_bin(b, op, xs, scale(b, ys, alpha)))


def _as_value(x: Operand, like: Value) -> Operand:
    if isinstance(x, Value):
        return x
    if isinstance(x, complex):
        return constant(torch.tensor(x, dtype=like.dtype))
    return constant(torch.tensor(x, dtype=REAL_OF.get(like.dtype, torch.float32)))  # type: ignore[arg-type]


def _mul(b: Builder, x: Operand, y: Operand) -> Value:
    return complex_mul(b, x, y)


def _add(b: Builder, x: Operand, y: Operand, alpha: float = 1) -> Value:
    like = x if is_complex(x) else y
    assert isinstance(like, Value)
    return complex_add(b, "add", _as_value(x, like), _as_value(y, like), float(alpha))


def _sub(b: Builder, x: Operand, y: Operand, alpha: float = 1) -> Value:
    like = x if is_complex(x) else y
    assert isinstance(like, Value)
    return complex_add(b, "sub", _as_value(x, like), _as_value(y, like), float(alpha))


def _abs(b: Builder, z: Value) -> Value:
    return complex_abs(b, z)


# ATen ops whose real-valued rule stays as it is; with a complex operand the session calls these
# (by op name without overload; ``complex_views.py`` adds the views, shapes and the rest)
COMPLEX_OVERRIDES: dict[str, Callable[..., Any]] = {
    "mul": _mul, "add": _add, "sub": _sub, "abs": _abs,
    "mul_": _mul, "add_": _add, "sub_": _sub,  # in place (jit): the front end rebinds the target
}  # fmt: skip


def complex_override(*names: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register ``fn`` as what the session calls for ATen ops ``names`` (no overload) when an
    operand is complex; its arguments are the real rule's, in schema order."""

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        for name in names:
            if name in COMPLEX_OVERRIDES:
                raise ValueError(f"complex override for {name!r} registered twice")
            COMPLEX_OVERRIDES[name] = fn
        return fn

    return register
