"""The lattice builder: symbolic sparse/dense values, names, weights and the IR v2 text.

Rules call ``b.op(...)`` / ``b.weight(...)`` / ``b.on_features(...)``; only this module knows how
the text is spelled (the fixtures in ``shared/fixtures/lattice`` fix it byte for byte).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from torchlower.core.values import Value
from torchlower.errors import InvalidArgumentError, LoweringError
from torchlower.lattice import quantize

IR_VERSION = 2
SCHEMA_DIGEST = "1380f1e819fc0eb1af587202ecec3c14ec2c981d249333c5061f0263f82072ad"
WEIGHT_FILE = "weights.safetensors"
DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.int32: "i32", torch.int64: "i64"}
FEATURE_DTYPES = {"f32": torch.float32, "f16": torch.float16}


@dataclass(frozen=True, eq=False)
class SparseValue(Value):
    """A sparse tensor in the graph: rows are dynamic, ``shape = ("?", channels)``."""

    stride: tuple[int, int, int] = (1, 1, 1)

    @property
    def channels(self) -> int:
        return int(self.shape[-1])  # type: ignore[index]


def sparse_type(dtype: str) -> str:
    return f"!lattice.sparse_tensor<rank = 3, coord = batch_x_y_z, feature = row_channel, dtype = {dtype}>"


def tensor_type(value: Value) -> str:
    """``tensor<?x16xf32>``: every ``str`` dim is dynamic."""
    if isinstance(value, SparseValue):
        return sparse_type(DTYPES[value.dtype])  # type: ignore[index]
    dims = "".join(f"{d}x" if isinstance(d, int) else "?x" for d in value.shape or ())
    return f"tensor<{dims}{DTYPES[value.dtype]}>"  # type: ignore[index]


def value_name(text: str) -> str:
    """What the reference builder does to a module path or key: runs of other characters become
    ``_``, outer ``_`` are dropped, a leading digit gets ``v_`` (``0.weight`` → ``v_0_weight``)."""
    out = re.sub(r"[^0-9A-Za-z_]+", "_", text).strip("_")
    if not out:
        return "value"
    return f"v_{out}" if out[0].isdigit() else out


# ---- attribute spelling -------------------------------------------------------------------------
def f32(value: float) -> str:
    """12 fixed decimals, trailing zeros trimmed (the reference spelling) when that is exact at
    f32 precision; otherwise an exact exponent form (the reference would print 1e-13 as 0.0)."""
    value = float(value)
    if not math.isfinite(value):
        raise LoweringError(f"attribute value {value} is not finite")
    text = f"{value:.12f}".rstrip("0")
    text = text + "0" if text.endswith(".") else text
    if np.float32(float(text)) != np.float32(value):
        mantissa, _, exponent = repr(value).partition("e")
        mantissa = mantissa if "." in mantissa else mantissa + ".0"
        text = f"{mantissa}e{exponent}" if exponent else mantissa
    return f"{text} : f32"


def f64s(values: Sequence[float]) -> str:
    return "array<f64: " + ", ".join(repr(float(v)) for v in values) + ">"


def i64s(values: Sequence[int]) -> str:
    return "array<i64: " + ", ".join(str(int(v)) for v in values) + ">"


def enum(kind: str, value: str) -> str:
    return f"#lattice.{kind}<{value}>"


def attr_dict(attrs: Sequence[tuple[str, str]]) -> str:
    return "{" + ", ".join(f"{k} = {v}" for k, v in attrs) + "}" if attrs else ""


class LatticeBuilder:
    """Collects the body of ``func.func @forward`` plus the weights it references."""

    def __init__(
        self,
        *,
        input_dtype: str = "f32",
        quantize_bits: int | None = None,
        group_size: int = 32,
        scale_dtype: str = "f16",
        batch_size: int | None = None,
        module_names: dict[int, str] | None = None,
        rules: Any = None,
    ) -> None:
        if input_dtype not in FEATURE_DTYPES:
            raise InvalidArgumentError(
                f"input_dtype must be one of {tuple(FEATURE_DTYPES)}, got {input_dtype!r}"
            )
        quantize.check_options(quantize_bits, group_size, scale_dtype)
        self.rules = rules  # the registry front ends look calls up in (lattice.rules.LATTICE_RULES)
        self.feature_dtype = FEATURE_DTYPES[input_dtype]
        self.quantize_bits, self.group_size, self.scale_dtype = quantize_bits, group_size, scale_dtype
        self.batch_size = batch_size
        self.module_names = module_names or {}
        self.hint = "v"
        self.inputs: list[tuple[str, str, str]] = []  # (name, type, role)
        self.outputs: list[tuple[str, Value]] = []
        self.prologue: list[str] = []  # sparse.make lines of sparse inputs
        self.lines: list[tuple[list[str], list[str], str]] = []  # (results, operands, text)
        self.weights: dict[str, torch.Tensor] = {}
        self._weight_values: dict[str, Value] = {}
        self._taken: set[str] = set()
        self._storage: dict[str, list[str]] = {}  # weight value → stored tensor keys
        self.packed: dict[str, tuple[str, int, int, str]] = {}  # key → (kind, bits, group, scales)

    # ---- names ----------------------------------------------------------------------------
    def fresh(self, base: str) -> str:
        """``base`` made a value name (the reference's rule), then ``base1``, ``base2``… if taken."""
        base = value_name(base)
        name, n = base, 0
        while name in self._taken:
            n += 1
            name = f"{base}{n}"
        self._taken.add(name)
        return name

    def module_name(self, module: nn.Module) -> str:
        """The module's dotted path in the model being lowered (weights are stored under it)."""
        path = self.module_names.get(id(module))
        if path is None:
            raise LoweringError(f"{type(module).__name__} is not a submodule of the model being lowered")
        return path

    def result_name(self, module: nn.Module | None = None) -> str:
        """The front end's name for the node being lowered, else the module path."""
        hint = self.hint if self.hint not in ("", "v") else None
        if hint is None and module is not None:
            hint = self.module_name(module).replace(".", "_")
        return hint or "v"

    # ---- inputs / outputs -----------------------------------------------------------------
    def dense_input(self, name: str, tensor: torch.Tensor) -> Value:
        dtype = self.feature_dtype if tensor.is_floating_point() else tensor.dtype
        if dtype not in DTYPES:
            raise InvalidArgumentError(
                f"input {name}: dtype {tensor.dtype} is not supported by the lattice IR"
            )
        value = Value(self.fresh(name), dtype, ("?", *tensor.shape[1:]))
        self.inputs.append((value.name, tensor_type(value), "tensor"))
        return value

    def sparse_input(self, name: str, channels: int, stride: tuple[int, int, int]) -> SparseValue:
        coords = Value(self.fresh(f"{name}_coords"), torch.int32, ("?", 4))
        feats = Value(self.fresh(f"{name}_features"), self.feature_dtype, ("?", channels))
        active = Value(self.fresh(f"{name}_active"), torch.int32, (1,))
        for v, role in ((coords, "sparse_coords"), (feats, "sparse_features"), (active, "sparse_active")):
            self.inputs.append((v.name, tensor_type(v), role))
        out = SparseValue(self.fresh(name), self.feature_dtype, ("?", channels), stride=stride)
        attrs = [("stride", i64s(stride)), ("coord_order", enum("coord", "batch_x_y_z"))]
        self.prologue.append(self._line([out], "sparse.make", [coords, feats, active], attrs))
        return out

    def set_outputs(self, names: Sequence[str], values: Sequence[Value]) -> None:
        self.outputs = list(zip(names, values, strict=True))

    # ---- ops ------------------------------------------------------------------------------
    def op(
        self, name: str, op: str, operands: Sequence[Value], attrs: Sequence[tuple[str, str]], result: Value
    ) -> Value:
        """Emit ``%name = lattice.op operands {attrs} : (types) -> type`` and return the result."""
        self.lines.append(
            ([result.name], [o.name for o in operands], self._line([result], op, operands, attrs))
        )
        return result

    def _line(
        self, results: Sequence[Value], op: str, operands: Sequence[Value], attrs: Sequence[tuple[str, str]]
    ) -> str:
        lhs = ", ".join(f"%{r.name}" for r in results)
        args = ", ".join(f"%{o.name}" for o in operands)
        types = ", ".join(value_type(o) for o in operands)
        return f"    {lhs} = lattice.{op} {args} {attr_dict(attrs)} : ({types}) -> {value_type(results[0])}"

    def dense(self, name: str, like: Value, channels: int) -> Value:
        return Value(self.fresh(name), like.dtype, ("?", channels))

    def sparse(
        self, name: str, like: SparseValue, channels: int, stride: tuple[int, int, int] | None = None
    ) -> SparseValue:
        return SparseValue(self.fresh(name), like.dtype, ("?", channels), stride=stride or like.stride)

    def on_features(self, x: Value, name: str, emit: Callable[[Value, str], Value]) -> Value:
        """Apply a dense feature op to ``x``: directly on a dense value, or as
        ``sparse.decompose → op → sparse.with_features`` on a sparse one."""
        if not isinstance(x, SparseValue):
            return emit(x, f"{name}_features")
        coords = Value(self.fresh("sparse_decompose"), torch.int32, ("?", 4))
        feats_in = Value(self.fresh(f"{name}_features_in"), x.dtype, ("?", x.channels))
        active = Value(self.fresh(f"{name}_active"), torch.int32, (1,))
        types = ", ".join(tensor_type(v) for v in (coords, feats_in, active))
        text = (
            f"    %{coords.name}, %{feats_in.name}, %{active.name} = lattice.sparse.decompose %{x.name} : "
            f"{tensor_type(x)} -> ({types})"
        )
        self.lines.append(([coords.name, feats_in.name, active.name], [x.name], text))
        feats = emit(feats_in, f"{name}_features")
        out = self.sparse(name, x, int(feats.shape[-1]))  # type: ignore[index]
        return self.op(out.name, "sparse.with_features", [x, feats], [], out)

    # ---- weights --------------------------------------------------------------------------
    def weight(self, key: str, tensor: torch.Tensor, kind: str, layout: str, packable: bool = True) -> Value:
        """Reference ``tensor`` stored under ``key``; conv / linear weights are quantized when asked
        (unless ``packable`` is False: the op needs the exact weights)."""
        if key in self._weight_values:
            return self._weight_values[key]
        data = tensor.detach().to(torch.float32).contiguous()
        packing = "#lattice.packing<dense>"
        if self.quantize_bits is not None and kind in ("conv3d", "linear") and packable:
            for suffix, part in quantize.pack(
                data, kind, self.quantize_bits, self.group_size, self.scale_dtype
            ).items():
                self.weights[f"{key}.{suffix}"] = part
            self.packed[key] = (kind, self.quantize_bits, self.group_size, self.scale_dtype)
            packing = (
                f"#lattice.packing<int{self.quantize_bits}, group_size = {self.group_size}, "
                f"scale_dtype = {self.scale_dtype}, mode = affine>"
            )
        else:
            self.weights[key] = data
        name = self.fresh(key.replace(".", "_"))
        value = WeightValue(name, torch.float32, tuple(data.shape), label=key, kind=kind)
        attrs = attr_dict(
            [("storage_key", f'"{key}"'), ("layout", enum("weight_layout", layout)), ("packing", packing)]
        )
        self.lines.append(
            ([name], [], f"    %{name} = lattice.weight @{name} {attrs} : !lattice.weight<{kind}, f32>")
        )
        self._storage[name] = [k for k in self.weights if k == key or k.rsplit(".", 1)[0] == key]
        self._weight_values[key] = value
        return value

    def param(
        self,
        module: nn.Module,
        attr: str,
        kind: str,
        layout: str,
        default: torch.Tensor | None = None,
        packable: bool = True,
    ) -> Value:
        tensor = getattr(module, attr, None)
        if tensor is None:
            if default is None:
                raise LoweringError(f"{self.module_name(module)}.{attr} is missing and has no default")
            tensor = default
        return self.weight(f"{self.module_name(module)}.{attr}", tensor, kind, layout, packable)

    # ---- text -----------------------------------------------------------------------------
    def graph_text(self) -> str:
        if not self.outputs:
            raise LoweringError("the graph has no outputs")
        names = [n for n, _, _ in self.inputs]
        roles = [r for _, _, r in self.inputs]
        out_names = [n for n, _ in self.outputs]
        out_roles = ["sparse_tensor" if isinstance(v, SparseValue) else "tensor" for _, v in self.outputs]
        out_types = [value_type(v) for _, v in self.outputs]
        result = out_types[0] if len(out_types) == 1 else "(" + ", ".join(out_types) + ")"
        head = [
            "module attributes {",
            f"  lattice.ir_version = {IR_VERSION},",
            f'  lattice.schema_digest = "{SCHEMA_DIGEST}",',
            f"  lattice.input_names = {_strings(names)},",
            f"  lattice.input_roles = {_strings(roles)},",
            f"  lattice.output_names = {_strings(out_names)},",
            f"  lattice.output_roles = {_strings(out_roles)},",
            f'  lattice.weight_file = "{WEIGHT_FILE}"',
            "} {",
            "  func.func @forward(",
            ",\n".join(f"    %{n}: {t}" for n, t, _ in self.inputs),
            f"  ) -> {result} {{",
        ]
        ret = ", ".join(f"%{v.name}" for _, v in self.outputs)
        tail = [f"    return {ret} : {', '.join(out_types)}", "  }", "}"]
        return "\n".join(head + self.prologue + [text for _, _, text in self.live_lines()] + tail) + "\n"

    def live_lines(self) -> list[tuple[list[str], list[str], str]]:
        """Ops that feed an output (results of calls the model discards are dropped)."""
        live = {v.name for _, v in self.outputs}
        kept = []
        for results, operands, text in reversed(self.lines):
            if live.intersection(results):
                live.update(operands)
                kept.append((results, operands, text))
        return kept[::-1]

    def live_weights(self) -> dict[str, torch.Tensor]:
        names = [r for results, _, _ in self.live_lines() for r in results if r in self._storage]
        keys = {k for n in names for k in self._storage[n]}
        return {k: v for k, v in self.weights.items() if k in keys}


@dataclass(frozen=True, eq=False)
class WeightValue(Value):
    kind: str = "conv3d"


def value_type(value: Value) -> str:
    if isinstance(value, WeightValue):
        return f"!lattice.weight<{value.kind}, f32>"
    return tensor_type(value)


def _strings(items: Sequence[str]) -> str:
    return "[" + ", ".join(f'"{s}"' for s in items) + "]"
