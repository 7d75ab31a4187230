"""A catalogue of PyTorch ops and hypothesis strategies that build random small models from it.

Independent of torchlower: it only knows PyTorch. Each ``Op`` says which inputs it takes, how to
draw its arguments given the input's shape and dtype (``Args``: keyword parameters, extra tensor
operands to take from the graph or create as inputs, constant weights) and the torch callable.
Adding an op is one line in ``OPS``. ``cases()`` draws a ``Case``: a DAG of ops on fresh inputs,
evaluated eagerly while drawing so only calls PyTorch accepts are kept.

Values carry an ``exact`` flag: true when computed from inputs by IEEE-exact ops only.
Discontinuous ops (rounding, comparisons, casts to int) take only exact values, so a 1-ulp
difference in ``exp`` cannot flip a ``floor`` and pass for an exporter bug.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from hypothesis import strategies as st

from tests.fuzz_nn_ops import (
    _adaptive_args,
    _adaptive_avg,
    _adaptive_max,
    _avg_pool,
    _avg_pool_args,
    _batch_norm,
    _batch_norm_args,
    _conv,
    _conv_args,
    _conv_t,
    _conv_t_args,
    _group_norm,
    _group_norm_args,
    _layer_norm,
    _layer_norm_args,
    _linear,
    _linear_args,
    _matmul_args,
    _max_pool,
    _pool_args,
)
from tests.fuzz_spec import (  # noqa: F401 (re-exported for fuzz_models)
    KINDS,
    MAX_NUMEL,
    SCALARS,
    Args,
    Draw,
    Op,
    Spec,
    broadcast_shape,
    dim,
    dims,
    int_weight,
    weight,
)


# ---- op families -----------------------------------------------------------------------------
def unary(name: str, fn: Callable[..., torch.Tensor], kinds: str = "f", **kw: Any) -> Op:
    return Op(name, fn, kinds=kinds, **kw)


def _binary_args(tensor_dtypes: tuple[torch.dtype, ...]) -> Callable[[Draw, Spec], Args]:
    def args(d: Draw, x: Spec) -> Args:
        mode = d(st.sampled_from(["tt", "ts", "st"]))
        if mode == "tt":
            dtype = d(st.sampled_from((x.dtype, *tensor_dtypes)))
            other = broadcast_shape(d, x.shape)
            if d(st.integers(0, 5)) == 0:  # the other operand has more dims
                other = (d(st.integers(1, 3)), *x.shape)
            return Args({"mode": mode}, ((other, dtype),))
        return Args({"mode": mode, "s": d(SCALARS)})

    return args


def _binary_call(f: Callable[[Any, Any], torch.Tensor]) -> Callable[..., torch.Tensor]:
    def call(x: torch.Tensor, *o: torch.Tensor, mode: str, s: float = 0) -> torch.Tensor:
        return f(x, o[0]) if mode == "tt" else f(x, s) if mode == "ts" else f(s, x)

    return call


def binary(name: str, f: Callable[[Any, Any], Any], kinds: str = "fi", **kw: Any) -> Op:
    others = (torch.float32, torch.int64) if "i" in kinds else (torch.float32,)
    return Op(name, _binary_call(f), _binary_args(others), kinds, **kw)


def _clamp_args(d: Draw, x: Spec) -> Args:
    lo, hi = d(st.one_of(st.none(), SCALARS)), d(st.one_of(st.none(), SCALARS))
    if lo is None and hi is None:
        lo = 0
    if x.kind == "i":
        lo, hi = (None if v is None else int(v) for v in (lo, hi))
    return Args({"min": lo, "max": hi})


def _reduce(fn: Callable[..., torch.Tensor], kinds: str = "f", **kw: Any) -> Callable[..., Op]:
    def args(d: Draw, x: Spec) -> Args | None:
        if x.rank == 0:
            return None
        return Args({"dim": dims(d, x), "keepdim": d(st.booleans())})

    return lambda name: Op(name, fn, args, kinds, min_rank=1, **kw)


def _dim_args(d: Draw, x: Spec) -> Args:
    return Args({"dim": dim(d, x)})


def _dim_keep(d: Draw, x: Spec) -> Args:
    return Args({"dim": dim(d, x), "keepdim": d(st.booleans())})


def _var_args(d: Draw, x: Spec) -> Args:
    return Args({"dim": dims(d, x), "correction": d(st.sampled_from([0, 1])), "keepdim": d(st.booleans())})


def _reshape_args(d: Draw, x: Spec) -> Args:
    n, shape = math.prod(x.shape), []
    while n > 1 and len(shape) < 4:
        f = d(st.sampled_from([k for k in range(1, n + 1) if n % k == 0]))
        shape.append(f)
        n //= f
    shape.append(n)
    if d(st.booleans()):
        shape[d(st.integers(0, len(shape) - 1))] = -1
    return Args({"shape": shape})


def _permute_args(d: Draw, x: Spec) -> Args:
    perm = d(st.permutations(range(x.rank)))
    return Args({"dims": [p - x.rank if d(st.booleans()) else p for p in perm]})


def _two_dims(d: Draw, x: Spec) -> Args:
    return Args({"dim0": dim(d, x), "dim1": dim(d, x)})


def _cat_args(d: Draw, x: Spec) -> Args:
    k = dim(d, x)
    shape = list(x.shape)
    shape[k] = d(st.integers(1, 3))
    return Args({"dim": k}, ((tuple(shape), x.dtype),))


def _stack_args(d: Draw, x: Spec) -> Args:
    return Args({"dim": d(st.integers(-x.rank - 1, x.rank))}, ((x.shape, x.dtype),))


def _roll_args(d: Draw, x: Spec) -> Args:
    if x.rank == 0 or d(st.integers(0, 3)) == 0:
        return Args({"shifts": d(st.integers(-7, 7)), "dims": None})
    ds = dims(d, x)
    return Args({"shifts": [d(st.integers(-7, 7)) for _ in ds], "dims": ds})


def _slice(x: torch.Tensor, dim: int, start: int | None, stop: int | None, step: int) -> torch.Tensor:
    index = [slice(None)] * (dim % x.dim()) + [slice(start, stop, step)]
    return x[tuple(index)]


def _slice_args(d: Draw, x: Spec) -> Args:
    k = dim(d, x)
    n = x.shape[k]
    bound = st.one_of(st.none(), st.integers(-n - 2, n + 2))
    return Args({"dim": k, "start": d(bound), "stop": d(bound), "step": d(st.integers(1, 3))})


def _select_args(d: Draw, x: Spec) -> Args:
    k = dim(d, x)
    return Args({"dim": k, "index": d(st.integers(-x.shape[k], x.shape[k] - 1))})


def _narrow_args(d: Draw, x: Spec) -> Args:
    k = dim(d, x)
    start = d(st.integers(0, x.shape[k] - 1))
    return Args({"dim": k, "start": start, "length": d(st.integers(1, x.shape[k] - start))})


def _expand_args(d: Draw, x: Spec) -> Args:
    lead = [d(st.integers(1, 3)) for _ in range(d(st.integers(0, 1)))]
    body = [d(st.sampled_from([-1, 2, 3])) if n == 1 else d(st.sampled_from([-1, n])) for n in x.shape]
    return Args({"size": lead + body})


def _repeat_args(d: Draw, x: Spec) -> Args:
    return Args({"repeats": [d(st.integers(1, 3)) for _ in range(x.rank + d(st.integers(0, 1)))]})


def _pick_split(d: Draw, x: Spec) -> Args:
    k = dim(d, x)
    return Args({"size": d(st.integers(1, max(1, x.shape[k]))), "dim": k, "pick": d(st.integers(0, 10))})


def _split(x: torch.Tensor, size: int, dim: int, pick: int) -> torch.Tensor:
    parts = torch.split(x, size, dim)
    return parts[pick % len(parts)]


def _chunk(x: torch.Tensor, size: int, dim: int, pick: int) -> torch.Tensor:
    parts = torch.chunk(x, size, dim)
    return parts[pick % len(parts)]


def _index_select_args(d: Draw, x: Spec) -> Args:
    k = dim(d, x)
    n = x.shape[k]
    index = torch.tensor(d(st.lists(st.integers(0, n - 1), min_size=1, max_size=5)))
    return Args({"dim": k}, weights=(index,))


def _gather_args(d: Draw, x: Spec) -> Args:
    k = dim(d, x)
    shape = tuple(d(st.integers(1, n)) for n in x.shape)
    index = int_weight(d, shape, x.shape[k]).abs() % x.shape[k]
    return Args({"dim": k}, weights=(index,))


def _tri_args(d: Draw, x: Spec) -> Args:
    return Args({"diagonal": d(st.integers(-3, 3))})


def _movedim_args(d: Draw, x: Spec) -> Args:
    return Args({"source": dim(d, x), "destination": dim(d, x)})


def _flatten_args(d: Draw, x: Spec) -> Args:
    a, b = sorted((d(st.integers(0, x.rank - 1)), d(st.integers(0, x.rank - 1))))
    return Args(
        {"start_dim": a - x.rank if d(st.booleans()) else a, "end_dim": b - x.rank * d(st.booleans())}
    )


def _squeeze_args(d: Draw, x: Spec) -> Args:
    ones = [i for i, n in enumerate(x.shape) if n == 1]
    return Args({"dim": d(st.sampled_from(ones)) if ones and d(st.booleans()) else dim(d, x)})


def _pad_args(d: Draw, x: Spec) -> Args | None:
    if x.rank < 2:
        return None
    mode = d(st.sampled_from(["constant", "reflect", "replicate", "circular"]))
    n = d(st.integers(1, min(3, x.rank - 1) if mode != "constant" else min(3, x.rank)))
    sizes = x.shape[::-1][:n]
    hi = {
        "constant": lambda s: 2,
        "reflect": lambda s: s - 1,
        "replicate": lambda s: 2,
        "circular": lambda s: s,
    }
    pads = [p for s in sizes for p in (d(st.integers(0, hi[mode](s))), d(st.integers(0, hi[mode](s))))]
    if mode == "constant" and d(st.booleans()):
        pads = [p - d(st.integers(0, 1)) for p in pads]  # negative pads crop
    value = d(SCALARS) if mode == "constant" else None
    return Args({"pad": pads, "mode": mode, "value": value})


def _where_args(d: Draw, x: Spec) -> Args:
    other = broadcast_shape(d, x.shape)
    return Args({"threshold": d(SCALARS), "scalar": d(st.one_of(st.none(), SCALARS))}, ((other, x.dtype),))


def _where(x: torch.Tensor, o: torch.Tensor, threshold: float, scalar: float | None) -> torch.Tensor:
    return torch.where(x > threshold, x, o if scalar is None else scalar)


def _interp_args(d: Draw, x: Spec) -> Args | None:
    if x.rank not in (3, 4):
        return None
    mode = d(st.sampled_from(["nearest", "linear" if x.rank == 3 else "bilinear"]))
    align = d(st.booleans()) if mode != "nearest" else None
    scale = d(st.sampled_from([2.0, 3.0, 0.5]))
    return Args({"scale_factor": scale, "mode": mode, "align_corners": align})


def _cast_args(d: Draw, x: Spec) -> Args:
    return Args({"dtype": d(st.sampled_from([t for t in KINDS if t != x.dtype]))})


def _norm_args(d: Draw, x: Spec) -> Args:
    return Args(
        {"p": d(st.sampled_from([1, 2, 3, math.inf])), "dim": dims(d, x), "keepdim": d(st.booleans())}
    )


def _cum_args(d: Draw, x: Spec) -> Args:
    return Args({"dim": dim(d, x)})


def _softplus_args(d: Draw, x: Spec) -> Args:
    return Args({"beta": d(st.sampled_from([1.0, 0.5, 2.0])), "threshold": d(st.sampled_from([20.0, 1.0]))})


def _pow_args(d: Draw, x: Spec) -> Args:
    return Args({"e": d(st.sampled_from([2, 3, 0.5, -1, -2, 0, 1, 1.5, -0.5]))})


A = Args  # keeps the table lines short
# fmt: off
OPS: list[Op] = [
    # unary math and activations
    *(unary(n, getattr(torch, n)) for n in (
        "exp", "log", "sqrt", "rsqrt", "sin", "cos", "tan", "atan", "tanh", "sigmoid", "erf", "log1p",
        "expm1", "reciprocal", "asin", "acos", "asinh", "sinh", "cosh", "log2", "log10", "atanh", "acosh")),
    unary("abs", torch.abs, "fi", exact=True), unary("neg", torch.neg, "fi", exact=True),
    unary("square", torch.square, "fi", exact=True),
    unary("sign", torch.sign, "fi", exact=True, discontinuous=True),
    *(unary(n, getattr(torch, n),
    exact=True, discontinuous=True) for n in ("floor", "ceil", "round", "trunc")),
    Op("round_decimals", torch.round, lambda d, x: A({"decimals": d(st.integers(-1, 2))}),
    discontinuous=True),
    unary("relu", torch.relu, "fi", exact=True), unary("relu6", F.relu6, exact=True),
    Op("leaky_relu", F.leaky_relu, lambda d, x: A({"negative_slope": d(SCALARS)})),
    Op("elu", F.elu, lambda d, x: A({"alpha": d(st.sampled_from([1.0, 0.5, 2.0]))})),
    Op("gelu", F.gelu, lambda d, x: A({"approximate": d(st.sampled_from(["none", "tanh"]))})),
    unary("silu", F.silu), unary("hardswish", F.hardswish), unary("hardsigmoid", F.hardsigmoid),
    unary("mish", F.mish), unary("selu", F.selu), unary("logsigmoid", F.logsigmoid),
    Op("softplus", F.softplus, _softplus_args),
    Op("hardtanh", F.hardtanh, lambda d, x: A({"min_val": d(st.sampled_from([-1.0, 0.0, -2.5])),
                                                "max_val": d(st.sampled_from([1.0, 0.5, 3.0]))}), exact=True),
    Op("pow_scalar", lambda x, e: x**e, _pow_args), Op("rpow", lambda x, e: 2.0**x, _pow_args),
    # binary arithmetic with broadcasting and scalars
    binary("add", operator.add, exact=True), binary("sub", operator.sub, exact=True),
    binary("mul", operator.mul, exact=True), binary("div", operator.truediv, exact=True),
    binary("floordiv", operator.floordiv, discontinuous=True),
    binary("mod", operator.mod, discontinuous=True),
    binary("pow", operator.pow, "f"),
    Op("maximum", lambda x, o: torch.maximum(x, o), lambda d, x: A(others=((broadcast_shape(d, x.shape),
                                                                             x.dtype),)), "fi", exact=True),
    Op("minimum", lambda x, o: torch.minimum(x, o), lambda d, x: A(others=((broadcast_shape(d, x.shape),
                                                                             x.dtype),)), "fi", exact=True),
    Op("atan2", torch.atan2, lambda d, x: A(others=((broadcast_shape(d, x.shape), torch.float32),))),
    Op("fmod", torch.fmod, lambda d, x: A({"other": d(SCALARS)}), "fi", discontinuous=True),
    Op("remainder", torch.remainder, lambda d, x: A({"other": d(SCALARS)}), "fi", discontinuous=True),
    Op("div_mode", lambda x, o, rounding_mode: torch.div(x, o, rounding_mode=rounding_mode),
       lambda d, x: A({"rounding_mode": d(st.sampled_from(["trunc", "floor"]))},
                      ((broadcast_shape(d, x.shape), x.dtype),)), "fi", discontinuous=True),
    Op("add_alpha", lambda x, o, alpha: torch.add(x, o, alpha=alpha),
       lambda d, x: A({"alpha": d(st.sampled_from([2, -1, 0.5]))}, ((broadcast_shape(d, x.shape),
    x.dtype),))),
    Op("clamp", torch.clamp, _clamp_args, "fi", exact=True),
    Op("clamp_min", torch.clamp_min, lambda d, x: A({"min": d(SCALARS)}), exact=True),
    Op("clamp_max", torch.clamp_max, lambda d, x: A({"max": d(SCALARS)}), exact=True),
    Op("clamp_tensor", lambda x, lo: torch.clamp(x, min=lo),
       lambda d, x: A(others=((broadcast_shape(d, x.shape), x.dtype),)), exact=True),
    # comparisons, logic, where, casts
    *(binary(n, getattr(operator, n),
    "fi", exact=True, discontinuous=True) for n in ("eq", "ne", "lt", "le", "gt", "ge")),
    Op("where", _where, _where_args, "fi", exact=True, discontinuous=True),
    Op("where_bool", lambda c, a: torch.where(c, a, -a),
    lambda d, x: A(others=((x.shape, torch.float32),)), "b",
       exact=True),
    *(Op(n, getattr(torch, n), lambda d, x: A(others=((broadcast_shape(d, x.shape), torch.bool),)),
    "b", exact=True)
      for n in ("logical_and", "logical_or", "logical_xor")),
    unary("logical_not", torch.logical_not, "bfi", exact=True, discontinuous=True),
    unary("bitwise_not", torch.bitwise_not, "bi", exact=True),
    Op("to", lambda x, dtype: x.to(dtype), _cast_args, "fib", exact=True, discontinuous=True),
    unary("isnan", torch.isnan, exact=True), unary("isinf", torch.isinf, exact=True),
    # reductions and normalisations over dims
    _reduce(torch.sum, "fib")("sum"), _reduce(torch.mean)("mean"),
    _reduce(torch.amax, "fi", exact=True)("amax"),
    _reduce(torch.amin, "fi", exact=True)("amin"), _reduce(torch.any, "fib", exact=True)("any"),
    _reduce(torch.all, "fib", exact=True)("all"), _reduce(torch.logsumexp)("logsumexp"),
    unary("sum_all", torch.sum, "fib"), unary("mean_all", torch.mean),
    unary("max_all", torch.max, "fi", exact=True),
    Op("prod", lambda x, dim, keepdim: torch.prod(x, dim, keepdim), _dim_keep, "fi", min_rank=1),
    Op("max_dim", lambda x, dim, keepdim, pick: torch.max(x, dim, keepdim)[pick],
       lambda d, x: A({**_dim_keep(d, x).params, "pick": d(st.integers(0, 1))}), "fi", exact=True,
       discontinuous=True, min_rank=1),
    Op("min_dim", lambda x, dim, keepdim: torch.min(x, dim, keepdim).values, _dim_keep, "fi", exact=True,
       min_rank=1),
    Op("argmax", torch.argmax, _dim_keep, "fi", exact=True, discontinuous=True, min_rank=1),
    Op("argmin", torch.argmin, _dim_keep, "fi", exact=True, discontinuous=True, min_rank=1),
    Op("var", torch.var, _var_args, min_rank=1), Op("std", torch.std, _var_args, min_rank=1),
    Op("norm", lambda x, p, dim, keepdim: torch.linalg.vector_norm(x, p, dim, keepdim),
    _norm_args, min_rank=1),
    Op("cumsum", torch.cumsum, _cum_args, "fi", min_rank=1),
    Op("cumprod", torch.cumprod, _cum_args, min_rank=1),
    Op("softmax", torch.softmax, _dim_args, min_rank=1),
    Op("log_softmax", torch.log_softmax, _dim_args, min_rank=1),
    Op("batch_norm", _batch_norm, _batch_norm_args, min_rank=2),
    Op("layer_norm", _layer_norm, _layer_norm_args, min_rank=1),
    Op("group_norm", _group_norm, _group_norm_args, min_rank=2),
    Op("normalize", lambda x, dim: F.normalize(x, dim=dim), _dim_args, min_rank=1),
    # layout
    Op("reshape", torch.reshape, _reshape_args, "fib", exact=True),
    Op("flatten", torch.flatten, _flatten_args, "fib", exact=True, min_rank=1),
    Op("permute", torch.permute, _permute_args, "fib", exact=True),
    Op("transpose", torch.transpose, _two_dims, "fib", exact=True, min_rank=1),
    Op("squeeze", torch.squeeze, _squeeze_args, "fib", exact=True, min_rank=1),
    unary("squeeze_all", torch.squeeze, "fib", exact=True),
    Op("unsqueeze", torch.unsqueeze, lambda d, x: A({"dim": d(st.integers(-x.rank - 1, x.rank))}),
    "fib", exact=True),
    Op("cat", lambda x, o, dim: torch.cat([x, o], dim), _cat_args, "fib", exact=True, min_rank=1),
    Op("stack", lambda x, o, dim: torch.stack([x, o], dim), _stack_args, "fib", exact=True),
    Op("flip", torch.flip, lambda d, x: A({"dims": dims(d, x)}), "fib", exact=True, min_rank=1),
    Op("roll", torch.roll, _roll_args, "fib", exact=True),
    Op("slice", _slice, _slice_args, "fib", exact=True, min_rank=1),
    Op("select", torch.select, _select_args, "fib", exact=True, min_rank=1),
    Op("narrow", torch.narrow, _narrow_args, "fib", exact=True, min_rank=1),
    Op("expand", lambda x, size: x.expand(*size), _expand_args, "fib", exact=True),
    Op("repeat", lambda x, repeats: x.repeat(*repeats), _repeat_args, "fib", exact=True),
    Op("split", _split, _pick_split, "fib", exact=True, min_rank=1),
    Op("chunk", _chunk, _pick_split, "fib", exact=True, min_rank=1),
    Op("movedim", torch.movedim, _movedim_args, "fib", exact=True, min_rank=1),
    Op("index_select", torch.index_select, _index_select_args, "fib", exact=True, min_rank=1),
    Op("gather", torch.gather, _gather_args, "fib", exact=True, min_rank=1),
    Op("tril", torch.tril, _tri_args, "fib", exact=True, min_rank=2),
    Op("triu", torch.triu, _tri_args, "fib", exact=True, min_rank=2),
    Op("pad", F.pad, _pad_args, "f", exact=True, min_rank=2),
    # linear algebra, conv, pool, resampling
    Op("linear", _linear, _linear_args, min_rank=1),
    Op("matmul", torch.matmul, _matmul_args, min_rank=2),
    Op("conv", _conv, _conv_args, min_rank=3), Op("conv_transpose", _conv_t, _conv_t_args, min_rank=3),
    Op("max_pool", _max_pool, _pool_args, exact=True, min_rank=3),
    Op("avg_pool", _avg_pool, _avg_pool_args, min_rank=3),
    Op("adaptive_avg_pool", _adaptive_avg, _adaptive_args, min_rank=3),
    Op("adaptive_max_pool", _adaptive_max, _adaptive_args, exact=True, min_rank=3),
    Op("interpolate", F.interpolate, _interp_args, min_rank=3),
]
# fmt: on
BY_NAME = {op.name: op for op in OPS}
assert len(BY_NAME) == len(OPS), "duplicate op names in the catalogue"
