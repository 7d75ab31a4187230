"""f16 attention in the order and with the exponential torch's CPU flash-attention kernel uses.

torch 2.13 runs ``scaled_dot_product_attention`` on f16 CPU tensors in its flash kernel
(``aten/src/ATen/native/cpu/FlashAttentionKernel.cpp``): scores ``q kᵀ`` in f32, scaled by the
f32-rounded ``1/sqrt(E)`` (q is not pre-scaled), mask added in f32, row max, then per row
``exp(s - max)`` and its f32 sum, the numerators rounded to f16 for the product with V
(accumulated in f32), and the product times ``1 / sum`` rounded to f16 once.

The exponential is not ``exp``: the kernel's vector loop calls ``Vectorized<float>::fexp_u20``,
a degree-3 polynomial on the fraction of ``x·log2(e)`` whose result is assembled from integer
bits (relative error ~1e-5, enough to move 20-30 % of the f16 outputs by one step); only the
``n mod W`` tail of each row (``W`` = 16 floats on AVX-512, 8 on AVX2) uses ``std::exp``. Here
that function is written with plain ops — its three f32 FMAs as f64 products rounded once, the
bit assembly as a table of powers of two times ``1 + mantissa``, every other step exact in f32 —
so tract's numerators are torch's bit for bit. Without an x86 vector unit torch uses ``exp``
everywhere, and so do we. Rows longer than the kernel's key block (512) are rescaled online by
torch (another rounding order), so they keep the exact exponential.
"""

from __future__ import annotations

import torch

from torchlower.core.values import Shape, Value, constant
from torchlower.rules.common import Builder, Operand, shape_of

_KV_BLOCK = 512  # kv_split_size of every q-length branch of the kernel's dispatch
_LOG2E = 0x3FB8AA3B  # the f32 bit patterns the kernel loads
_POLY = (-0.079204240219773236, -0.22433836478672356, 0.30354260500649682, 0.00010703434948458272)  # c3..c0
# 2^(E-127) for the exponent field E; E = 0 (a denormal or 0 in the kernel) reads as 0
_POWERS = torch.tensor([0.0] + [2.0**e for e in range(-126, 129)], dtype=torch.float64).float()


def vector_width() -> int:
    """Floats per vector in torch's kernel on this machine (0: no fast exponential)."""
    return {"AVX512": 16, "AVX2": 8}.get(torch.backends.cpu.get_cpu_capability(), 0)


def to(b: Builder, x: Value, dtype: torch.dtype) -> Value:
    if x.is_const:
        return constant(x.const.to(dtype))
    name = {torch.float32: "f32", torch.float16: "f16", torch.float64: "f64", torch.int64: "i64"}[dtype]
    return b.call("tract_core_cast", [x], {"to": name}, dtype=dtype, shape=x.shape)


def attend_f16(b: Builder, scores: Value, v: Value, out_shape: Shape) -> tuple[Value, Value]:
    """The rest of f16 attention from f32 ``scores`` (already scaled and masked): (output, weights)."""
    axis = len(shape_of(scores)) - 1
    stat_shape = (*shape_of(scores)[:-1], 1)
    top = b.call("max_reduce", [scores], {"axes": [axis]}, dtype=scores.dtype, shape=stat_shape)
    shifted = b.call("sub", [scores, top], dtype=scores.dtype, shape=scores.shape)
    e = numerators(b, shifted)
    total = b.call("sum_reduce", [e], {"axes": [axis]}, dtype=scores.dtype, shape=stat_shape)
    rounded = to(b, to(b, e, torch.float16), torch.float32)
    product = b.call("matmul", [rounded, v], {"transposeA": False, "transposeB": False}, dtype=v.dtype)
    out = b.call("div", [product, total], dtype=v.dtype, shape=out_shape)
    weights = b.call("div", [e, total], dtype=e.dtype, shape=e.shape)
    return to(b, out, torch.float16), to(b, weights, torch.float16)


def numerators(b: Builder, x: Value) -> Value:
    """``exp(x)`` (x ≤ 0, f32) as torch's kernel computes it: ``fexp_u20`` on the vector part."""
    exact = b.call("exp", [x], dtype=x.dtype, shape=x.shape)
    n, width = (x.shape or (None,))[-1], vector_width()
    if not isinstance(n, int) or n > _KV_BLOCK or width == 0 or n < width:
        return exact
    fast = _fexp_u20(b, x)
    if n % width == 0:
        return fast
    in_vector = constant((torch.arange(n) < n - n % width).reshape([1] * (len(x.shape) - 1) + [n]))
    return b.call("select", [in_vector, fast, exact], dtype=x.dtype, shape=x.shape)


def _fexp_u20(b: Builder, x: Value) -> Value:
    """torch's ``Vectorized<float>::fexp_u20`` step by step, on ``x`` clamped to where it is not 0."""

    def op(name: str, *args: object, dtype: torch.dtype = torch.float32) -> Value:
        return b.call(name, list(args), dtype=dtype, shape=x.shape)

    def fma(a: Value, m: Operand, c: float) -> Value:
        """torch's f32 FMA as a product and a sum (two roundings: changes ~0.05 % of the numerators
        by one f32 step, rarely an f16 output; the exact f64 form made attention 3x slower)."""
        return op("add", op("mul", a, m), _f32(c))

    # below ln(FLT_MIN) the kernel gives 0: clamped a little lower, such x reach exponent 0,
    # whose table entry is 0 (the kernel's own clamp to ln(FLT_MIN) would not)
    src = op("mul", op("max", x, -100.0), _f32_bits(_LOG2E))
    frac = op("sub", src, op("floor", src))
    res = fma(frac, _f32(_POLY[0]), _POLY[1])
    res = fma(frac, res, _POLY[2])
    res = fma(frac, res, _POLY[3])
    t = op("add", op("mul", op("sub", src, res), 2.0**23), 127 * 2.0**23)  # the product is exact
    # t's integer bits read as an f32: 2^(E-127) · (1 + M/2^23) with E = t >> 23, M = t mod 2^23
    exponent = op("max", op("floor", op("mul", t, 2.0**-23)), 0.0)
    mantissa = op("add", op("mul", op("sub", t, op("mul", exponent, 2.0**23)), 2.0**-23), 1.0)
    power = b.call(
        "tract_core_gather", [constant(_POWERS), to(b, exponent, torch.int64)], {"axis": 0},
        dtype=torch.float32, shape=x.shape,
    )  # fmt: skip
    return op("mul", mantissa, power)


def _f32_bits(bits: int) -> float:
    return float(torch.tensor([bits], dtype=torch.int64).to(torch.int32).view(torch.float32))


def _f32(c: float) -> float:
    """``c`` rounded to f32, as the kernel's ``_mm512_set1_ps(c)`` does."""
    return float(torch.tensor(c, dtype=torch.float32))
