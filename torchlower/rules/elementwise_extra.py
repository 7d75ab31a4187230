"""More pointwise ops: parametric activations, shrinkage, interpolation, log-space and IEEE helpers.

Each rule mirrors the branch structure of PyTorch's CPU kernel (``x <= t ? v : x`` and the
like), so NaN inputs take the same branch as in torch; composites are built from NNEF
primitives plus ``select``. Integer inputs of float-only ops compute in the default float dtype.
"""

from __future__ import annotations

import math

import torch

from torchlower.core.values import Value, constant, normalize_dim
from torchlower.errors import LoweringError
from torchlower.rules import rule
from torchlower.rules.activations import elu, leaky_relu
from torchlower.rules.arithmetic import div, mul, sub
from torchlower.rules.common import Builder, Operand, Scalar, reshape
from torchlower.rules.compare import isnan
from torchlower.rules.math import (
    binary,
    cast,
    floating,
    log1p,
    log2,
    log10,
    promote,
    result_type,
    select,
    square,
    trunc,
    unary,
)

_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def _float_dtype(*xs: Operand) -> torch.dtype:
    dtype = result_type(*xs)
    return dtype if dtype.is_floating_point else torch.get_default_dtype()


def _and(b: Builder, x: Value, y: Value) -> Value:
    return binary(b, "and", x, y, dtype=torch.bool)


# ---- parametric activations -----------------------------------------------------------------


@rule("aten::prelu", "aten::_prelu_kernel")
def prelu(b: Builder, x: Value, weight: Value) -> Value:
    """prelu(Tensor self, Tensor weight) -> Tensor: x > 0 ? x : w * x, w per channel (dim 1)

    A one-element weight is shared by every element; otherwise it has one slope per channel of
    dim 1 and is broadcast along that axis only (not along the last axis, as NumPy would)."""
    numel = math.prod(int(d) for d in weight.shape or ())
    if numel != 1:
        channels = x.shape[1] if x.rank >= 2 else 1
        if numel != channels:
            raise LoweringError(f"prelu: weight must have 1 or {channels} (dim 1) elements, got {numel}")
        weight = reshape(b, weight, [1, numel] + [1] * (x.rank - 2))
    elif weight.rank > x.rank:
        weight = reshape(b, weight, [1] * max(x.rank, 1))
    scaled = binary(b, "mul", weight, x)
    pick = _extremum_form(weight)
    if pick is not None:  # tract's comparison is ~6x slower than its max (pixel_shuffle zoo model)
        return binary(b, pick, x, scaled)
    return select(b, binary(b, "gt", x, 0.0), x, scaled)


def _extremum_form(weight: Value) -> str | None:
    """``max`` when every slope is in (0, 1], ``min`` when every one is finite and ≥ 1, else None.

    Then ``x > 0 ? x : w·x`` equals ``max(x, w·x)`` (resp. ``min``) for every input: the
    product keeps x's sign, ±0 and ±inf; a NaN x makes both operands NaN, so tract's max, which
    returns the other operand for one NaN, still gives NaN. A zero slope is excluded (0·inf is NaN).
    """
    if not weight.is_const or not weight.const.is_floating_point():
        return None
    w = weight.const
    if bool(((w > 0) & (w <= 1)).all()):
        return "max"
    if bool(((w >= 1) & torch.isfinite(w)).all()):
        return "min"
    return None


@rule("aten::celu", "aten::celu_")
def celu(b: Builder, x: Value, alpha: Scalar = 1.0) -> Value:
    """celu(Tensor self, Scalar alpha=1.) -> Tensor: elu(x, alpha, input_scale=1/alpha)"""
    if alpha == 0:
        raise LoweringError("celu: alpha must be non-zero (torch divides by it)")
    return elu(b, x, alpha, 1.0, 1.0 / float(alpha))


@rule("aten::selu", "aten::selu_")
def selu(b: Builder, x: Value) -> Value:
    """selu(Tensor self) -> Tensor"""
    return elu(b, x, _SELU_ALPHA, _SELU_SCALE, 1.0)


@rule("aten::rrelu", "aten::rrelu_")
def rrelu(
    b: Builder,
    x: Value,
    lower: Scalar = 0.125,
    upper: Scalar = 1.0 / 3.0,
    training: bool = False,
    generator: object = None,
) -> Value:
    """rrelu(Tensor self, Scalar lower=0.125, Scalar upper=1/3, bool training=False, Generator? generator)

    In eval the random slope is its mean (lower + upper) / 2: a leaky ReLU."""
    if training:
        raise LoweringError("rrelu: training must be False (random slopes cannot be exported)")
    return leaky_relu(b, x, (float(lower) + float(upper)) / 2.0)


@rule("aten::mish", "aten::mish_")
def mish(b: Builder, x: Value) -> Value:
    """mish(Tensor self) -> Tensor: x * tanh(softplus(x))"""
    return binary(b, "mul", x, unary(b, "tanh", unary(b, "softplus", x)))


@rule("aten::log_sigmoid")
def log_sigmoid(b: Builder, x: Value) -> Value:
    """log_sigmoid(Tensor self) -> Tensor: min(x, 0) - log1p(exp(-|x|)) (no overflow either side)"""
    x = floating(b, x)
    tail = log1p(b, unary(b, "exp", unary(b, "neg", unary(b, "abs", x))))
    return binary(b, "sub", binary(b, "min", x, 0.0), tail)


@rule("aten::glu")
def glu(b: Builder, x: Value, dim: int = -1) -> Value:
    """glu(Tensor self, int dim=-1) -> Tensor: first half * sigmoid(second half) along dim"""
    axis = normalize_dim(dim, x.rank)
    n = (x.shape or ())[axis]
    if not isinstance(n, int) or n % 2:
        raise LoweringError(f"glu: dim {dim} must have a static even size, got {n!r}")
    shape = list(x.shape or ())
    shape[axis] = n // 2
    halves = [
        b.call(
            "slice",
            [x],
            {"axes": [axis], "begin": [lo], "end": [lo + n // 2]},
            dtype=x.dtype,
            shape=tuple(shape),
        )
        for lo in (0, n // 2)
    ]
    return binary(b, "mul", halves[0], unary(b, "sigmoid", halves[1]))


# ---- shrinkage and thresholds ---------------------------------------------------------------


def _inside(b: Builder, x: Value, lambd: float) -> Value:
    return _and(b, binary(b, "ge", x, -lambd), binary(b, "le", x, lambd))


@rule("aten::softshrink")
def softshrink(b: Builder, x: Value, lambd: Scalar = 0.5) -> Value:
    """softshrink(Tensor self, Scalar lambd=0.5) -> Tensor: |x| <= l ? 0 : x - sign(x) l"""
    lam = float(lambd)
    shrunk = select(b, binary(b, "gt", x, 0.0), binary(b, "sub", x, lam), binary(b, "add", x, lam))
    return select(b, _inside(b, x, lam), 0.0, shrunk)


@rule("aten::hardshrink")
def hardshrink(b: Builder, x: Value, lambd: Scalar = 0.5) -> Value:
    """hardshrink(Tensor self, Scalar lambd=0.5) -> Tensor: |x| <= l ? 0 : x"""
    return select(b, _inside(b, x, float(lambd)), 0.0, x)


@rule("aten::threshold", "aten::threshold_")
def threshold(b: Builder, x: Value, threshold: Scalar, value: Scalar) -> Value:
    """threshold(Tensor self, Scalar threshold, Scalar value) -> Tensor: x <= t ? value : x"""
    return select(b, binary(b, "le", x, threshold), value, x)


@rule("aten::logit", "aten::logit_")
def logit(b: Builder, x: Value, eps: float | None = None) -> Value:
    """logit(Tensor self, float? eps=None) -> Tensor: log(z / (1 - z)), z = x clamped to [eps, 1 - eps]"""
    z = floating(b, x)
    if eps is not None:
        lo, hi = float(eps), 1.0 - float(eps)
        z = select(b, binary(b, "lt", z, lo), lo, select(b, binary(b, "gt", z, hi), hi, z))
    return unary(b, "log", binary(b, "div", z, binary(b, "sub", 1.0, z)))


# ---- interpolation and fused multiply-add ---------------------------------------------------


@rule("aten::lerp", "aten::lerp_")
def lerp(b: Builder, x: Value, end: Value, weight: Operand) -> Value:
    """lerp.Scalar(Tensor self, Tensor end, Scalar weight) -> Tensor (also .Tensor)

    torch's two-sided formula: x + w (end - x) for |w| < 0.5, end - (end - x)(1 - w) otherwise."""
    diff = binary(b, "sub", end, x)
    if not isinstance(weight, Value):
        if abs(weight) < 0.5:
            return binary(b, "add", x, binary(b, "mul", diff, float(weight)))
        return binary(b, "sub", end, binary(b, "mul", diff, 1.0 - float(weight)))
    near = binary(b, "lt", unary(b, "abs", weight), 0.5)
    low = binary(b, "add", x, binary(b, "mul", weight, diff))
    high = binary(b, "sub", end, binary(b, "mul", diff, binary(b, "sub", 1.0, weight)))
    return select(b, near, low, high)


@rule("aten::addcmul", "aten::addcmul_")
def addcmul(b: Builder, x: Value, t1: Value, t2: Value, value: Scalar = 1) -> Value:
    """addcmul(Tensor self, Tensor tensor1, Tensor tensor2, *, Scalar value=1) -> Tensor"""
    dtype = result_type(x, t1, t2)
    scaled = binary(b, "mul", t1, value, dtype=dtype) if value != 1 else t1
    return binary(b, "add", x, binary(b, "mul", scaled, t2, dtype=dtype), dtype=dtype)


@rule("aten::addcdiv", "aten::addcdiv_")
def addcdiv(b: Builder, x: Value, t1: Value, t2: Value, value: Scalar = 1) -> Value:
    """addcdiv(Tensor self, Tensor tensor1, Tensor tensor2, *, Scalar value=1) -> Tensor"""
    dtype = result_type(x, t1, t2)
    if not dtype.is_floating_point:
        raise LoweringError(f"addcdiv: tensor1 / tensor2 must be floating point (torch rejects {dtype})")
    scaled = binary(b, "mul", t1, value, dtype=dtype) if value != 1 else t1
    return binary(b, "add", x, binary(b, "div", scaled, t2, dtype=dtype), dtype=dtype)


# ---- log-space and two-argument float ops ---------------------------------------------------


def _logaddexp(b: Builder, x: Value, y: Value, base2: bool) -> Value:
    x, y = promote(b, x, y, dtype=_float_dtype(x, y))
    gap = unary(b, "neg", unary(b, "abs", binary(b, "sub", x, y)))
    if base2:
        tail = binary(
            b, "mul", unary(b, "log", binary(b, "add", binary(b, "pow", 2.0, gap), 1.0)), 1 / math.log(2)
        )
    else:
        tail = unary(b, "log", binary(b, "add", unary(b, "exp", gap), 1.0))
    general = binary(b, "add", binary(b, "max", x, y), tail)
    # equal inputs (also equal infinities, where x - y is NaN) give x + log(2) exactly
    return select(b, binary(b, "eq", x, y), binary(b, "add", x, 1.0 if base2 else math.log(2.0)), general)


@rule("aten::logaddexp")
def logaddexp(b: Builder, x: Value, y: Value) -> Value:
    """logaddexp(Tensor self, Tensor other) -> Tensor: log(exp(x) + exp(y))"""
    return _logaddexp(b, x, y, base2=False)


@rule("aten::logaddexp2")
def logaddexp2(b: Builder, x: Value, y: Value) -> Value:
    """logaddexp2(Tensor self, Tensor other) -> Tensor: log2(2**x + 2**y)"""
    return _logaddexp(b, x, y, base2=True)


@rule("aten::hypot", "aten::hypot_")
def hypot(b: Builder, x: Value, y: Value) -> Value:
    """hypot(Tensor self, Tensor other) -> Tensor: sqrt(x² + y²)"""
    x, y = promote(b, x, y, dtype=_float_dtype(x, y))
    return unary(b, "sqrt", binary(b, "add", binary(b, "mul", x, x), binary(b, "mul", y, y)))


@rule("aten::xlogy", "aten::xlogy_")
def xlogy(b: Builder, x: Operand, y: Operand) -> Value:
    """xlogy.Tensor(Tensor self, Tensor other) -> Tensor (also .Scalar_Self / .Scalar_Other)

    NaN where y is NaN, else 0 where x == 0, else x * log(y)."""
    px, py = promote(b, x, y, dtype=_float_dtype(x, y))
    if not isinstance(px, Value):  # .Scalar_Self: the x == 0 branch is known at export time
        if px:
            return binary(b, "mul", unary(b, "log", py), px)  # log(NaN) is NaN already
        return select(b, isnan(b, py), py, 0.0)
    product = binary(b, "mul", px, unary(b, "log", py) if isinstance(py, Value) else math.log(py))
    out = select(b, binary(b, "eq", px, 0.0), 0.0, product)
    return select(b, isnan(b, py), py, out) if isinstance(py, Value) else out  # NaN y gives NaN


@rule("aten::special_xlog1py")
def xlog1py(b: Builder, x: Operand, y: Operand) -> Value:
    """special_xlog1py(Tensor self, Tensor other) -> Tensor (also .self_scalar / .other_scalar)

    NaN where y is NaN, else 0 where x == 0, else x * log1p(y)."""
    dtype = _float_dtype(x, y)
    py = binary(b, "add", y, 1.0, dtype=dtype) if isinstance(y, Value) else float(y) + 1.0
    return xlogy(b, x, py)


@rule("aten::special_entr")
def entr(b: Builder, x: Value) -> Value:
    """special_entr(Tensor self) -> Tensor: -x log x for x > 0, 0 at 0, -inf below, NaN kept"""
    x = floating(b, x)
    minus_inf = constant(torch.full((1,) * max(x.rank, 1), -math.inf, dtype=x.dtype))  # literals clamp inf
    y = select(
        b, binary(b, "gt", x, 0.0), unary(b, "neg", binary(b, "mul", x, unary(b, "log", x))), minus_inf
    )
    y = select(b, binary(b, "eq", x, 0.0), 0.0, y)
    return select(b, isnan(b, x), x, y)


@rule("aten::special_ndtr")
def ndtr(b: Builder, x: Value) -> Value:
    """special_ndtr(Tensor self) -> Tensor: standard normal CDF, (1 + erf(x / sqrt 2)) / 2"""
    erf = unary(b, "tract_core_erf", binary(b, "mul", floating(b, x), 1.0 / math.sqrt(2.0)))
    return binary(b, "mul", binary(b, "add", erf, 1.0), 0.5)


def _signbit(b: Builder, x: Value) -> Value:
    """Sign bit of floats: negative, or a zero whose reciprocal is -inf (-0.0). NaN reads as positive."""
    negative = binary(b, "lt", x, 0.0)
    neg_zero = _and(b, binary(b, "eq", x, 0.0), binary(b, "lt", unary(b, "recip", x), 0.0))
    return binary(b, "or", negative, neg_zero, dtype=torch.bool)


@rule("aten::signbit")
def signbit(b: Builder, x: Value) -> Value:
    """signbit(Tensor self) -> Tensor"""
    if x.dtype == torch.bool:
        return binary(b, "ne", x, x)
    if x.dtype is not None and not x.dtype.is_floating_point:
        return binary(b, "lt", x, 0)
    return _signbit(b, x)


@rule("aten::copysign", "aten::copysign_")
def copysign(b: Builder, x: Value, y: Operand) -> Value:
    """copysign.Tensor(Tensor self, Tensor other) -> Tensor (also .Scalar): |x| with the sign of y"""
    dtype = _float_dtype(x, y)
    mag = unary(b, "abs", cast(b, x, dtype))
    if not isinstance(y, Value):
        return unary(b, "neg", mag) if math.copysign(1.0, y) < 0 else mag
    return select(b, _signbit(b, cast(b, y, dtype)), unary(b, "neg", mag), mag)


@rule("aten::heaviside", "aten::heaviside_")
def heaviside(b: Builder, x: Value, values: Value) -> Value:
    """heaviside(Tensor self, Tensor values) -> Tensor: x == 0 ? values : (x > 0)"""
    if x.dtype != values.dtype:
        raise LoweringError(f"heaviside: values must have the input dtype {x.dtype}, got {values.dtype}")
    step = cast(b, binary(b, "gt", x, 0), x.dtype)  # type: ignore[arg-type]
    return select(b, binary(b, "eq", x, 0), values, step)


# ---- unary float helpers --------------------------------------------------------------------


@rule("aten::frac", "aten::frac_")
def frac(b: Builder, x: Value) -> Value:
    """frac(Tensor self) -> Tensor: x - trunc(x)"""
    return binary(b, "sub", x, trunc(b, x))


@rule("aten::deg2rad", "aten::deg2rad_")
def deg2rad(b: Builder, x: Value) -> Value:
    """deg2rad(Tensor self) -> Tensor"""
    return binary(b, "mul", floating(b, x), math.pi / 180.0)


@rule("aten::rad2deg", "aten::rad2deg_")
def rad2deg(b: Builder, x: Value) -> Value:
    """rad2deg(Tensor self) -> Tensor"""
    return binary(b, "mul", floating(b, x), 180.0 / math.pi)


@rule("aten::sinc", "aten::sinc_")
def sinc(b: Builder, x: Value) -> Value:
    """sinc(Tensor self) -> Tensor: sin(pi x) / (pi x), 1 at 0"""
    px = binary(b, "mul", floating(b, x), math.pi)
    return select(b, binary(b, "eq", px, 0.0), 1.0, binary(b, "div", unary(b, "sin", px), px))


@rule("aten::exp2", "aten::exp2_")
def exp2(b: Builder, x: Value) -> Value:
    """exp2(Tensor self) -> Tensor: 2 ** x"""
    return binary(b, "pow", 2.0, floating(b, x))


@rule("aten::erfc", "aten::erfc_")
def erfc(b: Builder, x: Value) -> Value:
    """erfc(Tensor self) -> Tensor: 1 - erf(x)"""
    return binary(b, "sub", 1.0, unary(b, "tract_core_erf", floating(b, x)))


@rule("aten::special_expit")
def expit(b: Builder, x: Value) -> Value:
    """special_expit(Tensor self) -> Tensor: sigmoid"""
    return unary(b, "sigmoid", floating(b, x))


@rule("aten::nan_to_num", "aten::nan_to_num_")
def nan_to_num(
    b: Builder, x: Value, nan: float | None = None, posinf: float | None = None, neginf: float | None = None
) -> Value:
    """nan_to_num(Tensor self, float? nan=None, posinf=None, neginf=None) -> Tensor

    Infinities default to the dtype's largest finite values; integers pass through."""
    if x.dtype is None or not x.dtype.is_floating_point:
        return binary(b, "add", x, 0) if x.dtype != torch.bool else binary(b, "or", x, x, dtype=torch.bool)
    info = torch.finfo(x.dtype)
    hi = info.max if posinf is None else posinf
    lo = info.min if neginf is None else neginf
    y = select(b, isnan(b, x), 0.0 if nan is None else float(nan), x)
    flags = {"detect_positive": True, "detect_negative": False}
    y = select(b, b.call("tract_core_is_inf", [x], flags, dtype=torch.bool, shape=x.shape), float(hi), y)
    flags = {"detect_positive": False, "detect_negative": True}
    return select(b, b.call("tract_core_is_inf", [x], flags, dtype=torch.bool, shape=x.shape), float(lo), y)


# ---- aliases of arithmetic ------------------------------------------------------------------

rule("aten::multiply", "aten::multiply_")(mul)
rule("aten::subtract", "aten::subtract_")(sub)
rule("aten::divide", "aten::divide_", "aten::true_divide", "aten::true_divide_")(div)

# in-place forms of math.py rules (same computation, the front end rebinds the result)
rule("aten::square_")(square)
rule("aten::log2_")(log2)
rule("aten::log10_")(log10)
