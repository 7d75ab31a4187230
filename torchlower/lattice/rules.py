"""Lowering rules of the lattice registry: one short function per module type or function.

Importing this module registers every lattice rule (``rules_functional`` and ``rules_ops`` are
imported at the end) into ``LATTICE_RULES``: take the registry from here, not ``rule_base``.

Module rules get ``(builder, module, *inputs)``, function rules ``(builder, *args)`` with the
arguments of the Python function in signature order (its docstring line is the schema).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

import torch
from torch import nn

from torchlower.core.values import Value
from torchlower.errors import LoweringError
from torchlower.lattice import functional as LF
from torchlower.lattice import modules as LM
from torchlower.lattice.builder import LatticeBuilder, SparseValue, enum, f32, f64s, i64s
from torchlower.lattice.rule_base import (
    LATTICE_RULES,
    activation_attrs,
    constant,
    emit_conv,
    feature_op,
    geometry,
    module_rule,
    rule,
    scaled,
    sparse_arg,
    symbolic,
    target_transposed_geometry,
)


def floats3(value: object, what: str) -> list[float]:
    constant(value, what)
    return [float(v) for v in LF.three_floats(value, what)]  # type: ignore[arg-type]


@module_rule(LM.SubmConv3d)
def subm_conv3d(b: LatticeBuilder, m: LM.SubmConv3d, x: SparseValue) -> SparseValue:
    """SubmConv3d(x) -> sparse (input support)"""
    return emit_conv(
        b, m, x, "subm_conv3d", [("kernel_size", i64s(m.kernel_size)), ("dilation", i64s(m.dilation))]
    )


@module_rule(LM.ConvTranspose3d)
def conv_transpose3d(
    b: LatticeBuilder, m: LM.ConvTranspose3d, x: SparseValue, target: SparseValue | None
) -> SparseValue:
    """ConvTranspose3d(x, target=None) -> sparse (the inverted conv's support, or target's)"""
    op = "conv_transpose3d" if target is None else "target_conv_transpose3d"
    return emit_conv(b, m, x, op, geometry(m), scaled(x, m.stride, up=False), target)


@module_rule(LM.Conv3d)
def conv3d(b: LatticeBuilder, m: LM.Conv3d, x: SparseValue, target: SparseValue | None) -> SparseValue:
    """Conv3d(x, target=None) -> sparse (stride multiplied; target's support when given)"""
    op = "conv3d" if target is None else "target_conv3d"
    return emit_conv(b, m, x, op, geometry(m), scaled(x, m.stride, up=True), target)


@module_rule(LM.GenerativeConvTranspose3d)
def generative_conv_transpose3d(
    b: LatticeBuilder, m: LM.GenerativeConvTranspose3d, x: SparseValue, target: SparseValue | None
) -> SparseValue:
    """GenerativeConvTranspose3d(x, target=None) -> sparse (creates o·s + k, or onto target)"""
    stride = scaled(x, m.stride, up=False)
    if target is not None:
        return emit_conv(b, m, x, "target_conv_transpose3d", target_transposed_geometry(m), stride, target)
    attrs = [("kernel_size", i64s(m.kernel_size)), ("stride", i64s(m.stride))]
    return emit_conv(b, m, x, "generative_conv_transpose3d", attrs, stride)


# ---- pooling --------------------------------------------------------------------------------
@module_rule(LM.MaxPool3d, LM.AvgPool3d, LM.SumPool3d)
def pool3d(b: LatticeBuilder, m: LM.PoolBase, x: SparseValue) -> SparseValue:
    """MaxPool3d | AvgPool3d | SumPool3d (x) -> sparse"""
    x = sparse_arg(x, "pool input")
    out = b.sparse(b.result_name(m), x, x.channels, scaled(x, m.stride, up=True))
    return b.op(out.name, "pool3d", [x], [("mode", enum("pool_mode", m.mode)), *geometry(m)], out)  # type: ignore[return-value]


@module_rule(LM.GlobalAvgPool, LM.GlobalMaxPool)
def global_pool(b: LatticeBuilder, m: LM.GlobalPoolBase, x: SparseValue) -> Value:
    """GlobalAvgPool | GlobalMaxPool (x) -> dense [B, C]"""
    x = sparse_arg(x, "global pool input")
    batch = m.batch_size if m.batch_size is not None else b.batch_size
    if batch is None:
        raise LoweringError("global_pool needs a static batch size: pass batch_size= to save() or the module")
    out = b.dense(b.result_name(m), x, x.channels)
    return b.op(
        out.name, "global_pool", [x], [("mode", enum("pool_mode", m.mode)), ("batch_size", str(batch))], out
    )


# ---- feature ops (dense, or decompose → op → with_features on sparse) -----------------------
@module_rule(nn.BatchNorm1d)
def batch_norm(b: LatticeBuilder, m: nn.BatchNorm1d, x: Value) -> Value:
    """BatchNorm(x) -> same kind (running statistics, eval mode)"""
    if m.running_mean is None or m.running_var is None:
        raise LoweringError(f"{b.module_name(m)}: batch norm without running statistics cannot be lowered")

    def emit(feats: Value, name: str) -> Value:
        c = m.num_features
        params = [
            b.param(m, "weight", "channel", "channel_c", torch.ones(c)),
            b.param(m, "bias", "bias", "bias_c", torch.zeros(c)),
            b.param(m, "running_mean", "channel", "channel_c"),
            b.param(m, "running_var", "channel", "channel_c"),
        ]
        out = b.dense(name, feats, c)
        return b.op(out.name, "batch_norm", [feats, *params], [("eps", f32(m.eps))], out)

    return b.on_features(symbolic(x, "batch norm input"), b.result_name(m), emit)


@module_rule(nn.LayerNorm)
def layer_norm(b: LatticeBuilder, m: nn.LayerNorm, x: Value) -> Value:
    """LayerNorm(x) over the channel dim"""
    if len(m.normalized_shape) != 1:
        raise LoweringError(
            f"layer norm normalized_shape must be (channels,), got {tuple(m.normalized_shape)}"
        )
    c = m.normalized_shape[0]

    def emit(feats: Value, name: str) -> Value:
        params = [
            b.param(m, "weight", "channel", "channel_c", torch.ones(c)),
            b.param(m, "bias", "bias", "bias_c", torch.zeros(c)),
        ]
        out = b.dense(name, feats, c)
        return b.op(out.name, "layer_norm", [feats, *params], [("eps", f32(m.eps))], out)

    return b.on_features(symbolic(x, "layer norm input"), b.result_name(m), emit)


@module_rule(nn.Linear)
def linear(b: LatticeBuilder, m: nn.Linear, x: Value) -> Value:
    """Linear(x) on features"""
    x = symbolic(x, "linear input")

    def emit(feats: Value, name: str) -> Value:
        operands = [feats, b.param(m, "weight", "linear", "linear_o_i")]
        if m.bias is not None:
            operands.append(b.param(m, "bias", "bias", "bias_c"))
        out = b.dense(name, feats, m.out_features)
        return b.op(out.name, "linear", operands, [], out)

    name = b.result_name(m)
    if isinstance(x, SparseValue):
        return b.on_features(x, name, emit)
    return emit(x, name)


ACTIVATIONS: dict[type, str] = {
    nn.ReLU: "relu",
    nn.LeakyReLU: "leaky_relu",
    nn.SiLU: "silu",
    nn.GELU: "gelu",
    nn.Sigmoid: "sigmoid",
    nn.Tanh: "tanh",
    nn.Softplus: "softplus",
}


@module_rule(*ACTIVATIONS)
def activation(b: LatticeBuilder, m: nn.Module, x: Value) -> Value:
    """ReLU | LeakyReLU | SiLU | GELU | Sigmoid | Tanh | Softplus (x) on features"""
    attrs = activation_attrs(
        ACTIVATIONS[type(m)],
        getattr(m, "approximate", "none"),
        getattr(m, "negative_slope", 0.01),
        getattr(m, "beta", 1.0),
        getattr(m, "threshold", 20.0),
    )
    return feature_op(b, x, "activation", attrs, b.result_name(m))


# ---- functions ------------------------------------------------------------------------------
@rule(LF.voxelize)
def voxelize(
    b: LatticeBuilder, points: Value, feats: Value, batch_indices: Value, active_rows: Value,
    voxel_size: object, origin: object, reduction: str,
) -> SparseValue:  # fmt: skip
    """voxelize(points, feats, batch_indices, active_rows, voxel_size, origin=0.0, reduction="mean")"""
    operands = [
        symbolic(v, n)
        for v, n in (
            (points, "points"),
            (feats, "feats"),
            (batch_indices, "batch_indices"),
            (active_rows, "active_rows"),
        )
    ]
    attrs = [
        ("voxel_size", f64s(floats3(voxel_size, "voxel_size"))),
        ("origin", f64s(floats3(origin, "origin"))),
        ("reduction", enum("voxel_reduction", str(constant(reduction, "reduction")))),
        ("stride", i64s((1, 1, 1))),
    ]
    out = SparseValue(b.fresh(b.result_name()), feats.dtype, ("?", int(feats.shape[-1])))  # type: ignore[index]
    return b.op(out.name, "voxelize", operands, attrs, out)  # type: ignore[return-value]


@rule(LF.devoxelize)
def devoxelize(
    b: LatticeBuilder, points: Value, voxels: SparseValue, batch_indices: Value, point_active_rows: Value,
    voxel_size: object, origin: object, interpolation: str,
) -> Value:  # fmt: skip
    """devoxelize(points, voxels, batch_indices, point_active_rows, voxel_size, origin, interpolation)"""
    voxels = sparse_arg(voxels, "devoxelize voxels")
    operands = [
        symbolic(points, "points"),
        voxels,
        symbolic(batch_indices, "batch_indices"),
        symbolic(point_active_rows, "point_active_rows"),
    ]
    attrs = [
        ("voxel_size", f64s(floats3(voxel_size, "voxel_size"))),
        ("origin", f64s(floats3(origin, "origin"))),
        ("interpolation", enum("point_interpolation", str(constant(interpolation, "interpolation")))),
    ]
    out = b.dense(b.result_name(), voxels, voxels.channels)
    return b.op(out.name, "devoxelize", operands, attrs, out)


def _binary(
    b: LatticeBuilder, op: str, lhs: object, rhs: object, join: object, lhs_fill: object, rhs_fill: object
) -> SparseValue:
    lhs, rhs = sparse_arg(lhs, f"{op} lhs"), sparse_arg(rhs, f"{op} rhs")
    join = constant(join, "join") or LF.DEFAULT_JOIN[op]
    if join not in LF.JOINS:
        raise LoweringError(f"join must be one of {LF.JOINS}, got {join!r}")
    if lhs.channels != rhs.channels or lhs.stride != rhs.stride:
        raise LoweringError(
            f"sparse {op}: operands differ in channels or stride "
            f"({lhs.channels}/{rhs.channels}, {lhs.stride}/{rhs.stride})"
        )
    attrs = [
        ("op", enum("binary_op", op)),
        ("join", enum("join", str(join))),
        ("lhs_fill", f32(constant(lhs_fill, "lhs_fill"))),  # type: ignore[arg-type]
        ("rhs_fill", f32(constant(rhs_fill, "rhs_fill"))),  # type: ignore[arg-type]
    ]
    out = b.sparse(b.result_name(), lhs, lhs.channels)
    return b.op(out.name, "sparse.binary", [lhs, rhs], attrs, out)  # type: ignore[return-value]


def _register_binary(op: str) -> None:
    def lower(
        b: LatticeBuilder,
        lhs: SparseValue,
        rhs: SparseValue,
        join: str | None,
        lhs_fill: float,
        rhs_fill: float,
    ) -> SparseValue:
        return _binary(b, op, lhs, rhs, join, lhs_fill, rhs_fill)

    lower.__doc__ = f"{op}(lhs, rhs, join=None, lhs_fill=0.0, rhs_fill=0.0)"
    lower.__name__ = lower.__qualname__ = f"sparse_{op}"
    rule(getattr(LF, op))(lower)
    if hasattr(operator, op):

        def lower_operator(b: LatticeBuilder, lhs: object, rhs: object) -> Value:
            if isinstance(lhs, SparseValue) and isinstance(rhs, SparseValue):
                return _binary(b, op, lhs, rhs, None, 0.0, 0.0)
            from torchlower.lattice.rules_functional import scalar_operator

            return scalar_operator(b, op, lhs, rhs)

        lower_operator.__doc__ = f"operator.{op}(lhs, rhs): sparse join (default join) or with a number"
        rule(getattr(operator, op))(lower_operator)


for _op in LF.BINARY_OPS:
    _register_binary(_op)


@rule(LF.cat)
def cat(b: LatticeBuilder, tensors: Sequence[SparseValue], join: str) -> SparseValue:
    """cat(tensors, join="inner")

    The IR's ``sparse.cat`` is binary: n inputs fold left into n − 1 ops named ``<node>_1`` …
    ``<node>_<n−1>`` (the reference's naming; the last one is the node's result). Joins are
    associative, so the folded support and row order equal those of one n-way join."""
    parts = [sparse_arg(t, "cat input") for t in tensors]
    if len(parts) < 2 or len({p.stride for p in parts}) != 1:
        raise LoweringError("cat needs two or more sparse tensors with one stride")
    if constant(join, "join") not in LF.JOINS:
        raise LoweringError(f"join must be one of {LF.JOINS}, got {join!r}")
    node = b.result_name()
    out = parts[0]
    for i, part in enumerate(parts[1:], start=1):
        lhs = out
        out = b.sparse(f"{node}_{i}", lhs, lhs.channels + part.channels)
        b.op(out.name, "sparse.cat", [lhs, part], [("join", enum("join", join))], out)
    return out


@rule(LF.reindex_sparse)
def reindex_sparse(b: LatticeBuilder, source: SparseValue, target: SparseValue, fill: float) -> SparseValue:
    """reindex_sparse(source, target, fill=0.0)"""
    source, target = sparse_arg(source, "reindex source"), sparse_arg(target, "reindex target")
    if source.stride != target.stride:
        raise LoweringError(f"reindex_sparse: strides {source.stride} and {target.stride} differ")
    out = b.sparse(b.result_name(), target, source.channels)
    attrs = [("fill", f32(constant(fill, "fill")))]  # type: ignore[arg-type]
    return b.op(out.name, "sparse.reindex", [source, target], attrs, out)  # type: ignore[return-value]


from torchlower.lattice import rules_functional, rules_ops  # noqa: E402, F401  (register their rules)

__all__ = ["LATTICE_RULES"]  # the registry with every rule above registered
