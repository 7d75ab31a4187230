"""The NNEF builder: owns names, weights, extensions and the graph text.

Rules call ``b.call(op, args, attrs)`` and never print text or branch on the target:
target knowledge (tract vs Khronos-only, which extensions exist) lives here.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from torchlower.core.values import Shape, SymDim, Value
from torchlower.errors import InvalidArgumentError, LoweringError
from torchlower.nnef import text

TRACT_DTYPES = {
    torch.float16: "f16",
    torch.float32: "f32",
    torch.float64: "f64",
    torch.int8: "i8",
    torch.int16: "i16",
    torch.int32: "i32",
    torch.int64: "i64",
    torch.uint8: "u8",
    torch.uint16: "u16",
    torch.uint32: "u32",
    torch.uint64: "u64",
    torch.bool: "bool",
}

PRECISIONS = ("f32", "f16")
# torch quantized dtype -> (bits, signed) of its storage
_QUANT_STORAGE = {torch.quint8: (8, False), torch.qint8: (8, True), torch.qint32: (32, True)}


# ops whose output tract gives the quantized type of their first input (layout, max, relu)
_QUANT_PRESERVING = {
    "reshape", "squeeze", "unsqueeze", "transpose", "slice", "copy", "relu", "max_pool", "tile", "pad",
    "tract_core_broadcast",
}  # fmt: skip


@dataclass(frozen=True)
class QParams:
    """Affine quantization of one tensor: real = (code − zero_point) × scale."""

    scale: float
    zero_point: int
    bits: int
    signed: bool

    def text(self) -> str:
        return (
            f"zero_point_linear_quantize(zero_point = {self.zero_point}, scale = {self.scale!r}, "
            f"bits = {self.bits}, signed = {str(self.signed).lower()}, "
            f"symmetric = {str(self.zero_point == 0).lower()});"
        )


_VARIABLE_KIND = {"f": "scalar", "c": "scalar", "i": "integer", "u": "integer", "b": "logical"}

Operand = Any  # Value | bool | int | float | str | list | tuple of those


class NNEFBuilder:
    """Collects assignments into an NNEF graph for tract (``tract=True``) or plain Khronos."""

    def __init__(self, *, tract: bool = True, precision: str = "f32", rules: Any = None) -> None:
        if precision not in PRECISIONS:
            raise InvalidArgumentError(f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
        # the registry front ends look ops up in; None until a front end's entry point sets
        # torchlower.rules.NNEF_RULES (the builder does not import the rules that call it)
        self.rules = rules
        self.tract = tract
        self.precision = precision  # "f16": float weights and compute in f16, I/O stay f32
        self.inputs: list[Value] = []
        self.outputs: list[tuple[str, Value]] = []
        self.assignments: list[text.Assignment] = []
        self.weights: dict[str, torch.Tensor] = {}
        self.extensions: set[str] = {"tract_registry tract_core"} if tract else set()
        self.symbols: list[str] = []
        self.rules_used: list[str] = []  # set by the front end once lowering is done
        self.notes: list[str] = []  # what a front end wants the export report to say
        self.assertions: list[str] = []  # tract_assert extensions: bounds of dynamic symbols
        # upper bounds a rule's lowering assumes of a symbol (a table of n rows sliced to T: T <= n),
        # with why; the pipeline adopts them into the dynamic axes (``capture.lower``)
        self.implied_bounds: dict[str, tuple[int, str]] = {}
        self.hint = "v"  # set by front ends per node, gives readable names
        self.scope = ""  # module path of the node being lowered (a comment in graph.nnef)
        self.example_sizes: dict[str, int] = {}  # symbol sizes of the example inputs (a comment)
        self.stream_note = ""  # the verified pulse and delay of a streaming export (a comment)
        self._taken: set[str] = set()
        self._reserved: set[str] = set()
        self._materialized: dict[object, Value] = {}
        self._keep_alive: list[torch.Tensor] = []
        self.quantization: dict[str, QParams] = {}  # graph.quant entries by identifier
        self._qvalues: dict[str, QParams] = {}  # those plus values that inherit their type
        self.dequantized_steps: list[float] = []  # scales of quantized tensors turned back into floats
        self.fragments: dict[str, str] = {}  # fragment text by name (bodies of tract_core_scan)
        # NaN-keeping clamps (rules/nan.py) by result name: (input, lo, hi); where tract would fuse
        # a plain max / min into the producing conv, nnef/guards_values.py gives that back
        self.clamps: dict[str, tuple[Value, float | None, float | None, Value]] = {}  # + the lo step
        # called with a weight (or a slice of one) a pass has read: a memory-mapped checkpoint drops
        # those pages (llm/stream.py), so scanning every weight does not make the model resident
        self.release: Callable[[torch.Tensor], None] | None = None

    # ---- names --------------------------------------------------------------------------
    def fresh(self, hint: str | None = None) -> str:
        base = text.identifier(hint or self.hint)
        name, n = base, 1
        while name in self._taken or name in self._reserved:
            n += 1
            name = f"{base}_{n}"
        self._taken.add(name)
        return name

    def assume_at_most(self, symbol: str, bound: int, why: str) -> None:
        """Record that the graph is only valid for ``symbol <= bound`` (the tightest one wins)."""
        if symbol not in self.implied_bounds or bound < self.implied_bounds[symbol][0]:
            self.implied_bounds[symbol] = (bound, why)

    def reserve(self, names: Sequence[str]) -> None:
        """Keep user-facing input/output names free for the inputs and outputs themselves."""
        self._reserved = set(names)

    # ---- graph interface ----------------------------------------------------------------
    def add_input(self, name: str, dtype: torch.dtype, shape: Shape) -> Value:
        self._reserved.discard(name)
        ident = self.fresh(name)
        if ident != name:
            raise InvalidArgumentError(
                f"input name {name!r} is not a valid, unique NNEF identifier (try {ident!r})"
            )
        for dim in shape:
            for symbol in dim.symbols if isinstance(dim, SymDim) else ():
                if symbol not in self.symbols:
                    self.symbols.append(symbol)
        value = Value(ident, dtype, tuple(shape))
        dims = [d for d in shape]
        if self.tract:
            op, attrs = "tract_core_external", {"shape": dims, "datum_type": TRACT_DTYPES.get(dtype, "")}
            self.dtype_name(dtype)  # refuses dtypes tract lacks
        else:
            op, attrs = "external<scalar>", {"shape": dims}
        self.assignments.append(text.Assignment([value], op, [], attrs))
        self.inputs.append(value)
        if self._narrows(dtype):  # the caller keeps feeding f32; compute starts in f16
            return self.call(
                "tract_core_cast", [value], {"to": "f16"}, dtype=dtype, shape=value.shape, hint=name
            )
        return value

    def set_outputs(self, names: Sequence[str], values: Sequence[Value]) -> None:
        if len(names) != len(values):
            raise InvalidArgumentError(f"{len(names)} output names for {len(values)} outputs")
        self.outputs = []
        for name, value in zip(names, values, strict=True):
            dotted = self.tract and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)+", name)
            if text.identifier(name) != name and not dotted:  # tract reads dotted ones as i"a.b"
                raise InvalidArgumentError(f"output name {name!r} is not a valid NNEF identifier")
            if value.dtype is not None and value.dtype.is_complex:
                raise LoweringError(
                    f"output {name!r} is a complex tensor, which tract has no type for; return "
                    "torch.view_as_real(...) (a trailing [re, im] axis) or its .abs() / .real / .imag"
                )
            value = self.tensor(value)
            if self._narrows(value.dtype):  # the caller gets f32 back
                value = self.call(
                    "tract_core_cast", [value], {"to": "f32"}, dtype=value.dtype, shape=value.shape
                )
            self.outputs.append((name, value))

    def call(
        self,
        op: str,
        args: Sequence[Operand] = (),
        attrs: dict[str, Operand] | None = None,
        *,
        dtype: torch.dtype | None = None,
        shape: Shape | None = None,
        hint: str | None = None,
    ) -> Value:
        """Emit ``y = op(args..., attrs...)`` and return ``y``."""
        out = Value(self.fresh(hint), dtype, shape)
        args = [self._operand(a) for a in args]
        self.assignments.append(text.Assignment([out], op, args, dict(attrs or {}), self.scope))
        if op in _QUANT_PRESERVING and args and isinstance(args[0], Value) and args[0].name in self._qvalues:
            self._qvalues[out.name] = self._qvalues[args[0].name]  # tract keeps the type through it
        return out

    def call_multi(
        self, op: str, args: Sequence[Operand], attrs: dict[str, Operand] | None, count: int
    ) -> tuple[Value, ...]:
        """Emit an op with several results, e.g. ``(a, b) = split(...)``."""
        outs = [Value(self.fresh(f"{self.hint}_{i}")) for i in range(count)]
        args = [self._operand(a) for a in args]
        self.assignments.append(text.Assignment(outs, op, args, dict(attrs or {}), self.scope))
        return tuple(outs)

    def accurate(self, x: Value) -> Value:
        """``x`` in the precision reductions should accumulate in (f32 when computing in f16).

        Rules wrap numerically touchy ops (softmax, norms, attention) in ``accurate`` /
        ``compute`` instead of asking which precision the export uses.
        """
        if not self._narrows(x.dtype) or x.is_const:
            return x
        return self.call("tract_core_cast", [x], {"to": "f32"}, dtype=x.dtype, shape=x.shape)

    def compute(self, x: Value) -> Value:
        """``x`` back in the working precision after an ``accurate`` section."""
        if not self._narrows(x.dtype) or x.is_const:
            return x
        return self.call("tract_core_cast", [x], {"to": "f16"}, dtype=x.dtype, shape=x.shape)

    def quantize(self, value: Value, scale: float, zero_point: int, dtype: torch.dtype) -> Value:
        """Declare ``value`` a linearly quantized tensor (a ``graph.quant`` entry); returns it."""
        if not self.tract:
            raise LoweringError("quantized tensors need tract (graph.quant); Khronos-only mode has none")
        bits, signed = _QUANT_STORAGE[dtype]
        self.quantization[value.name] = QParams(float(scale), int(zero_point), bits, signed)
        self._qvalues[value.name] = self.quantization[value.name]
        return value

    def quant_params(self, value: Value) -> QParams | None:
        """How ``value`` is quantized, or None for a plain tensor (rules ask, never guess)."""
        return self._qvalues.get(value.name)

    def quant_text(self) -> str | None:
        """The ``graph.quant`` document for live quantized tensors, or None when there are none."""
        live = self.live_assignments()
        names = self._output_renames(list(live))
        lines = [
            f'"{names.get(v.name, v.name)}": {q.text()}'
            for a in live
            for v in a.outputs
            if (q := self.quantization.get(v.name)) is not None
        ]
        return "\n".join(lines) + "\n" if lines else None

    def _narrows(self, dtype: torch.dtype | None) -> bool:
        return self.precision == "f16" and dtype == torch.float32

    def use_extension(self, extension: str) -> None:
        """Declare an extension (e.g. ``tract_registry tract_transformers``) used by an op."""
        if not self.tract and extension.startswith("tract_"):
            raise LoweringError(f"extension {extension!r} is not available in Khronos-only mode")
        self.extensions.add(extension)

    # ---- constants ----------------------------------------------------------------------
    def tensor(self, value: Value | float | int | bool) -> Value:
        """A graph value for ``value``: constants become variables (once per weight)."""
        if not isinstance(value, Value):
            value = Value("const", *_scalar_meta(value), const=torch.tensor(value))
        if value.const is None:
            return value
        tensor = value.const.detach()
        # one variable per distinct data and layout; stored tensors keep their memory alive,
        # so a data pointer cannot be reused by another constant while it is a key here
        key = (value.label, tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype, tensor.data_ptr())
        if key in self._materialized:
            return self._materialized[key]
        label = value.label or f"constants/{self.fresh('c')}"
        if label in self.weights:
            label = self.fresh(f"{label}_v")
        self.weights[label] = tensor.half() if self._narrows(tensor.dtype) else tensor
        self._keep_alive.append(tensor)  # its data pointer is part of a key above
        out = Value(self.fresh(label), tensor.dtype, tuple(tensor.shape), label=label)
        kind = _VARIABLE_KIND[_dtype_kind(tensor.dtype)]
        attrs = {"label": label, "shape": list(tensor.shape)}
        self.assignments.append(text.Assignment([out], f"variable<{kind}>", [], attrs, self.scope))
        self._materialized[key] = out
        return out

    def _operand(self, arg: Operand) -> Operand:
        """Constants in operand position: float scalars print as literals, tensors become variables.

        Integer rank-0 constants become typed variables: tract reads an integer literal as a
        symbolic size (TDim), which then leaks into the result type.
        """
        if isinstance(arg, Value):
            if arg.const is not None and arg.const.dim() == 0 and arg.const.is_floating_point():
                return self._operand(arg.const.item())
            return self.tensor(arg)
        if isinstance(arg, (list, tuple)):
            return type(arg)(self._operand(a) for a in arg)
        if isinstance(arg, torch.Tensor):
            raise LoweringError("rules pass tensors as constant Values, not raw torch.Tensor")
        if isinstance(arg, float) and not _literal_exact(arg):
            return self.tensor(Value("const", torch.float32, (), const=torch.tensor(arg)))
        return arg

    def dtype_name(self, dtype: torch.dtype) -> str:
        """tract's name for ``dtype`` in the working precision (f32 is f16 in an f16 export)."""
        if self._narrows(dtype):
            return "f16"
        try:
            return TRACT_DTYPES[dtype]
        except KeyError:
            raise LoweringError(f"dtype {dtype} has no NNEF/tract equivalent") from None

    # ---- fragments ----------------------------------------------------------------------
    def fragment(
        self,
        hint: str,
        params: Sequence[tuple[str, torch.dtype, Shape]],
        body: Callable[[NNEFBuilder, list[Value]], Sequence[Value]],
    ) -> Fragment:
        """Define ``fragment name(params) -> (results)`` whose body ``body(sub, params)`` emits.

        ``sub`` is a builder writing into the fragment; constants it uses become parameters too,
        bound to the outer variables in ``Fragment.captures`` (tract's scan passes them as
        ``full`` inputs), so the weights stay in the archive once.
        """
        sub = _FragmentBuilder(self)
        values = [sub.param(n, dt, shape) for n, dt, shape in params]
        results = [sub.result(r, values) for r in body(sub, values)]
        sub.outputs = [(r.name, r) for r in results]
        sub.inputs = values + [v for v, _ in sub.captures.values()]
        decl = [
            f"    {v.name}: tensor<{_TYPE_NAME[_dtype_kind(v.dtype or torch.float32)]}>" for v in sub.inputs
        ]
        outs = ", ".join(
            f"{r.name}: tensor<{_TYPE_NAME[_dtype_kind(r.dtype or torch.float32)]}>" for r in results
        )
        name = self.fresh(hint)
        lines = [f"fragment {name}(", ",\n".join(decl), f") -> ({outs})", "{"]
        lines += [a.render({}) for a in sub.live_assignments()] + ["}"]
        self.fragments[name] = "\n".join(lines)
        captures = [(v.name, outer) for v, outer in sub.captures.values()]
        return Fragment(name, [v.name for v in values], [r.name for r in results], captures)

    # ---- output -------------------------------------------------------------------------
    def live_assignments(self) -> list[text.Assignment]:
        """Assignments that reach an output (rules may leave dead helpers behind)."""
        needed = {v.name for _, v in self.outputs} | {v.name for v in self.inputs}
        live: list[text.Assignment] = []
        for a in reversed(self.assignments):
            if any(o.name in needed for o in a.outputs):
                live.append(a)
                needed.update(v.name for v in _values_in(a.args) + _values_in(list(a.attrs.values())))
        live.reverse()
        return live

    def graph_text(self) -> str:
        live = self.live_assignments()
        names = self._output_renames(live)
        body = text.with_scopes(live, [a.render(names) for a in live])
        used_inputs = [v.name for v in self.inputs]
        extensions = sorted(self.extensions) + [f"tract_symbol {s}" for s in self.symbols]
        extensions += [f"tract_assert {a}" for a in self.assertions if a.split()[0] in self.symbols]
        # fragments are referenced by name from an op's ``body`` attribute (tract_core_scan)
        used = {a.attrs.get("body") for a in live}
        fragments = [t for n, t in self.fragments.items() if n in used]
        sizes = [f"{s}={n}" for s, n in self.example_sizes.items() if s in self.symbols]
        if sizes:  # read back by nnef/parse.py: `check` without sizes runs the graph at these
            fragments = [f"{text.SIZES_COMMENT}{', '.join(sizes)}", *fragments]
        if self.stream_note:  # read back by nnef/graph_check.py: `inspect`, `load(...).stream`
            fragments = [f"{text.STREAM_COMMENT}{self.stream_note}", *fragments]
        return text.document(extensions, used_inputs, [n for n, _ in self.outputs], body, fragments)

    def live_weights(self) -> dict[str, torch.Tensor]:
        labels = {a.attrs["label"] for a in self.live_assignments() if a.op.startswith("variable")}
        return {k: v for k, v in sorted(self.weights.items()) if k in labels}

    def op_histogram(self) -> Counter[str]:
        return Counter(a.op.split("<")[0] for a in self.live_assignments())

    def _output_renames(self, live: list[text.Assignment]) -> dict[str, str]:
        """Give each output its user-facing name, copying when one value is output twice."""
        names: dict[str, str] = {}
        inputs = {v.name for v in self.inputs}
        for name, value in self.outputs:
            if value.name in names or value.name in inputs:
                live.append(text.Assignment([Value(name)], "copy", [value], {}))
            else:
                names[value.name] = name
        return names


@dataclass(frozen=True)
class Fragment:
    """A defined fragment: its name, parameter and result names, and captured outer values."""

    name: str
    params: list[str]
    results: list[str]
    captures: list[tuple[str, Value]]  # (parameter name, outer value) for constants of the body


class _FragmentBuilder(NNEFBuilder):
    """Writes a fragment body: names come from the parent (no clashes), constants are captured."""

    def __init__(self, parent: NNEFBuilder) -> None:
        super().__init__(tract=parent.tract, precision=parent.precision)
        self.parent = parent
        self.hint = parent.hint
        self.captures: dict[str, tuple[Value, Value]] = {}  # outer name -> (param, outer value)

    def fresh(self, hint: str | None = None) -> str:
        return self.parent.fresh(hint or self.hint)

    def use_extension(self, extension: str) -> None:
        self.parent.use_extension(extension)

    def param(self, hint: str, dtype: torch.dtype, shape: Shape) -> Value:
        return Value(self.fresh(hint), dtype, tuple(shape))

    def result(self, value: Value, params: list[Value]) -> Value:
        """A result name of its own: parameters and repeated results are copied."""
        value = self.tensor(value)
        taken = {n for n, _ in self.outputs}
        if value in params or value.name in taken or any(value is v for v, _ in self.captures.values()):
            return self.call("copy", [value], dtype=value.dtype, shape=value.shape)
        self.outputs.append((value.name, value))
        return value

    def tensor(self, value: Value | float | int | bool) -> Value:
        if isinstance(value, Value) and value.const is None:
            return value
        outer = self.parent.tensor(value)
        if outer.name not in self.captures:
            inner = Value(self.fresh(f"{outer.name}_in"), outer.dtype, outer.shape)
            self.captures[outer.name] = (inner, outer)
        return self.captures[outer.name][0]


_TYPE_NAME = {"f": "scalar", "c": "scalar", "i": "integer", "u": "integer", "b": "logical"}


def _literal_exact(value: float) -> bool:
    """NNEF text cannot carry inf or NaN, and tract reads ``-0.0`` as +0: those need a tensor."""
    return math.isfinite(value) and not (value == 0.0 and math.copysign(1.0, value) < 0)


def _values_in(items: list[Any]) -> list[Value]:
    found: list[Value] = []
    for item in items:
        if isinstance(item, Value):
            found.append(item)
        elif isinstance(item, (list, tuple)):
            found += _values_in(list(item))
    return found


def _dtype_kind(dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return "b"
    if dtype.is_floating_point or dtype.is_complex:
        return "f"
    return "u" if dtype in (torch.uint8, torch.uint16, torch.uint32, torch.uint64) else "i"


def _scalar_meta(value: float | int | bool) -> tuple[torch.dtype, Shape]:
    if isinstance(value, bool):
        return torch.bool, ()
    return (torch.int64 if isinstance(value, int) else torch.float32), ()
