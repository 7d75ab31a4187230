"""What every lattice rule module shares: the registry (``LATTICE_RULES``), argument checks and
the emitters several rule families call (convolution, geometry attributes, activations).

``rules``, ``rules_functional`` and ``rules_ops`` import this module, never each other's
helpers, so the three register into one registry without an import circle.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from torchlower.core.values import Value
from torchlower.errors import LoweringError
from torchlower.lattice import modules as LM
from torchlower.lattice.builder import LatticeBuilder, SparseValue, enum, f32, i64s
from torchlower.rules.registry import Registry

LATTICE_RULES = Registry("lattice")
rule = LATTICE_RULES.function
module_rule = LATTICE_RULES.module
ACCUMULATION = ("accumulation", '"canonical_f32"')


def sparse_arg(x: object, what: str) -> SparseValue:
    if not isinstance(x, SparseValue):
        raise LoweringError(f"{what} must be a symbolic sparse tensor, got {type(x).__name__}")
    return x


def symbolic(x: object, what: str) -> Value:
    if not isinstance(x, Value) or x.is_const:
        raise LoweringError(f"{what} must be a symbolic graph input or result, got {type(x).__name__}")
    return x


def constant(x: object, what: str) -> object:
    if isinstance(x, (Value, torch.Tensor)):
        raise LoweringError(f"{what} must be a Python constant known at export time, got a tensor")
    return x


# ---- convolutions ---------------------------------------------------------------------------
def emit_conv(
    b: LatticeBuilder,
    m: LM.ConvBase,
    x: object,
    op: str,
    attrs: list,
    stride: tuple[int, int, int] | None = None,
    target: object = None,
    packable: bool = True,
    after: Sequence[tuple[str, str]] = (),
) -> SparseValue:
    """``op`` with operands ``x, [target], weight, [bias]``; a target gives the output support.
    ``packable=False`` keeps the weight dense under quantization (normalized convs need W²);
    ``after`` are attributes the schema puts after ``accumulation``."""
    x = sparse_arg(x, f"input of {op}")
    if x.channels != m.in_channels:
        raise LoweringError(f"{op}: input has {x.channels} channels, the module expects {m.in_channels}")
    operands: list[Value] = [x]
    if target is not None:
        target = sparse_arg(target, f"target of {op}")
        if stride is not None and target.stride != stride:
            raise LoweringError(f"{op}: the target has stride {target.stride}, the output needs {stride}")
        operands.append(target)
    operands.append(b.param(m, "weight", "conv3d", "conv3d_o_xyz_i", packable=packable))
    if m.bias is not None:
        operands.append(b.param(m, "bias", "bias", "bias_c"))
    out = b.sparse(b.result_name(m), x, m.out_channels, stride)
    return b.op(out.name, op, operands, [*attrs, ACCUMULATION, *after], out)  # type: ignore[return-value]


def geometry(m: LM.Conv3d | LM.PoolBase) -> list[tuple[str, str]]:
    return [
        ("kernel_size", i64s(m.kernel_size)),
        ("stride", i64s(m.stride)),
        ("padding", i64s(m.padding)),
        ("dilation", i64s(m.dilation)),
    ]


def scaled(x: object, s: Sequence[int], up: bool) -> tuple[int, int, int]:
    stride = sparse_arg(x, "sparse input").stride
    if not up and any(a % b for a, b in zip(stride, s, strict=True)):
        raise LoweringError(f"transposed conv stride {tuple(s)} does not divide the input stride {stride}")
    return tuple(a * b if up else a // b for a, b in zip(stride, s, strict=True))  # type: ignore[return-value]


def target_transposed_geometry(m: LM.GenerativeConvTranspose3d) -> list[tuple[str, str]]:
    """A generative conv called with a target is a target transposed conv (padding 0, dilation 1)."""
    return [
        ("kernel_size", i64s(m.kernel_size)),
        ("stride", i64s(m.stride)),
        ("padding", i64s((0, 0, 0))),
        ("dilation", i64s((1, 1, 1))),
    ]


def activation_attrs(
    kind: str, approximate: str = "none", alpha: float = 0.01, beta: float = 1.0, threshold: float = 20.0
) -> list[tuple[str, str]]:
    """The five attributes of ``lattice.activation`` (unused ones keep the reference defaults)."""
    return [
        ("kind", enum("activation", kind)),
        ("approximate", enum("gelu_approx", approximate)),
        ("alpha", f32(alpha)),
        ("beta", f32(beta)),
        ("threshold", f32(threshold)),
    ]


def feature_op(b: LatticeBuilder, x: object, op: str, attrs: list[tuple[str, str]], name: str) -> Value:
    """``op`` on the features of ``x``, channel count unchanged (``decompose → op → with_features``
    on a sparse value)."""

    def emit(feats: Value, result: str) -> Value:
        out = b.dense(result, feats, int(feats.shape[-1]))  # type: ignore[index]
        return b.op(out.name, op, [feats], attrs, out)

    return b.on_features(symbolic(x, f"{op} input"), name, emit)
