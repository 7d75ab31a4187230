"""Lattice rules of the normalized convs, pool transpose, trilinear upsampling, embedding lookup,
RMS norm, softmax and elementwise modules (attribute order as the dialect schema fixes it)."""

from __future__ import annotations

import torch
from torch import nn

from torchlower.core.values import Value
from torchlower.errors import LoweringError
from torchlower.lattice import modules_ops as LO
from torchlower.lattice.builder import LatticeBuilder, SparseValue, f32, i64s
from torchlower.lattice.rule_base import (
    emit_conv,
    feature_op,
    geometry,
    module_rule,
    scaled,
    sparse_arg,
    symbolic,
    target_transposed_geometry,
)
from torchlower.lattice.rules_functional import emit_rms_norm


# ---- normalized convs: weights stay dense under quantization (the op squares them) ------------
@module_rule(LO.NormalizedSubmConv3d)
def normalized_subm_conv3d(b: LatticeBuilder, m: LO.NormalizedSubmConv3d, x: SparseValue) -> SparseValue:
    """NormalizedSubmConv3d(x) -> sparse (input support)"""
    attrs = [("kernel_size", i64s(m.kernel_size)), ("dilation", i64s(m.dilation)), ("eps", f32(m.eps))]
    return emit_conv(b, m, x, "normalized_subm_conv3d", attrs, packable=False)


def _with_eps(
    b: LatticeBuilder, m: LO.NormalizedBase, x: object, op: str, attrs: list, stride, target
) -> SparseValue:
    """The schema puts ``eps`` after ``accumulation`` for the (target) normalized transposed conv."""
    return emit_conv(b, m, x, op, attrs, stride, target, packable=False, after=[("eps", f32(m.eps))])  # type: ignore[arg-type]


@module_rule(LO.NormalizedConvTranspose3d)
def normalized_conv_transpose3d(
    b: LatticeBuilder, m: LO.NormalizedConvTranspose3d, x: SparseValue, target: SparseValue | None
) -> SparseValue:
    """NormalizedConvTranspose3d(x, target=None) -> sparse"""
    op = "normalized_conv_transpose3d" if target is None else "target_normalized_conv_transpose3d"
    return _with_eps(b, m, x, op, geometry(m), scaled(x, m.stride, up=False), target)


@module_rule(LO.NormalizedGenerativeConvTranspose3d)
def normalized_generative_conv_transpose3d(
    b: LatticeBuilder, m: LO.NormalizedGenerativeConvTranspose3d, x: SparseValue, target: SparseValue | None
) -> SparseValue:
    """NormalizedGenerativeConvTranspose3d(x, target=None) -> sparse (creates o·s + k, or onto target)"""
    stride = scaled(x, m.stride, up=False)
    if target is not None:
        geometry = target_transposed_geometry(m)
        return _with_eps(b, m, x, "target_normalized_conv_transpose3d", geometry, stride, target)
    attrs = [("kernel_size", i64s(m.kernel_size)), ("stride", i64s(m.stride)), ("eps", f32(m.eps))]
    return emit_conv(b, m, x, "normalized_generative_conv_transpose3d", attrs, stride, packable=False)


# ---- upsampling onto a target or a generated support -----------------------------------------
def _onto(
    b: LatticeBuilder, m: nn.Module, x: object, target: object, op: str, attrs: list, s: tuple
) -> SparseValue:
    x = sparse_arg(x, f"input of {op}")
    stride = scaled(x, s, up=False)
    operands: list[Value] = [x]
    if target is not None:
        target = sparse_arg(target, f"target of {op}")
        if target.stride != stride:
            raise LoweringError(f"{op}: the target has stride {target.stride}, the output needs {stride}")
        operands.append(target)
    out = b.sparse(b.result_name(m), x, x.channels, stride)
    return b.op(out.name, op, operands, attrs, out)  # type: ignore[return-value]


@module_rule(LO.PoolTranspose3d)
def pool_transpose3d(
    b: LatticeBuilder, m: LO.PoolTranspose3d, x: SparseValue, target: SparseValue | None
) -> SparseValue:
    """PoolTranspose3d(x, target=None) -> sparse (average of the coarse voxels pooled from)"""
    return _onto(b, m, x, target, "pool_transpose3d", geometry(m), m.stride)  # type: ignore[arg-type]


@module_rule(LO.TrilinearUpsample3d)
def trilinear_upsample3d(
    b: LatticeBuilder, m: LO.TrilinearUpsample3d, x: SparseValue, target: SparseValue | None
) -> SparseValue:
    """TrilinearUpsample3d(x, target=None) -> sparse (normalized tent weights)"""
    return _onto(b, m, x, target, "trilinear_upsample3d", [("stride", i64s(m.stride))], m.stride)


# ---- dense feature modules --------------------------------------------------------------------
@module_rule(nn.Embedding)
def embedding_lookup(b: LatticeBuilder, m: nn.Embedding, ids: Value) -> Value:
    """Embedding(ids [N] int) -> [N, C]"""
    ids = symbolic(ids, "embedding indices")
    if (
        isinstance(ids, SparseValue)
        or ids.dtype not in (torch.int32, torch.int64)
        or len(ids.shape or ()) != 1
    ):
        raise LoweringError(
            f"{b.module_name(m)}: embedding_lookup takes a dense 1-D integer tensor of ids, got "
            f"{type(ids).__name__} {ids.dtype} {ids.shape}"
        )
    if m.max_norm is not None:
        raise LoweringError(
            f"{b.module_name(m)}: Embedding(max_norm=...) rewrites its weights; not lowerable"
        )
    weight = b.param(m, "weight", "embedding", "embedding_n_c")
    out = b.dense(b.result_name(m), ids, m.embedding_dim)
    return b.op(out.name, "embedding_lookup", [ids, weight], [], out)


@module_rule(nn.RMSNorm)
def rms_norm(b: LatticeBuilder, m: nn.RMSNorm, x: Value) -> Value:
    """RMSNorm(x) over the channels; eps=None is the feature dtype's machine epsilon"""
    x = symbolic(x, "rms norm input")
    if len(m.normalized_shape) != 1 or int(m.normalized_shape[0]) != int(x.shape[-1]):  # type: ignore[index]
        raise LoweringError(f"rms norm normalized_shape must be (channels,), got {tuple(m.normalized_shape)}")
    c = int(m.normalized_shape[0])
    scale = lambda: b.param(m, "weight", "channel", "channel_c", torch.ones(c))  # noqa: E731
    return emit_rms_norm(b, x, c, m.eps, scale)


@module_rule(nn.Softmax)
def softmax(b: LatticeBuilder, m: nn.Softmax, x: Value) -> Value:
    """Softmax(dim=-1 | 1)(x) over the channels"""
    if m.dim not in (-1, 1):
        raise LoweringError(f"{b.module_name(m)}: lattice softmax runs over the channels; dim={m.dim}")
    return feature_op(b, x, "softmax", [("axis", "1")], b.result_name(m))


@module_rule(LO.Elementwise)
def elementwise(b: LatticeBuilder, m: LO.Elementwise, x: Value) -> Value:
    """Elementwise(kind)(x): exp | round"""
    return feature_op(b, x, "elementwise", [("kind", f'"{m.kind}"')], b.result_name(m))


# ---- eval-mode no-ops -------------------------------------------------------------------------
@module_rule(nn.Dropout, nn.Identity)
def passthrough(b: LatticeBuilder, m: nn.Module, x: Value) -> Value:
    """Dropout (eval) | Identity (x) -> x: no op is written"""
    return symbolic(x, f"{type(m).__name__} input")


@module_rule(nn.Flatten)
def flatten(b: LatticeBuilder, m: nn.Flatten, x: Value) -> Value:
    """Flatten(x) of a dense [B, C] head (start_dim=1, end_dim=-1) -> x"""
    x = symbolic(x, "flatten input")
    if isinstance(x, SparseValue) or len(x.shape or ()) != 2 or (m.start_dim, m.end_dim) != (1, -1):
        raise LoweringError(f"{b.module_name(m)}: only Flatten(1, -1) of a dense [B, C] tensor is lowerable")
    return x
