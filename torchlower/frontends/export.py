"""The ``torch.export`` front end: the ATen graph, interpreted by the FX ``Interpreter``.

``torch.export.export(strict=False)`` keeps high-level ops such as ``aten.linear`` or
``aten.scaled_dot_product_attention``. Only when some op has no rule is the program run
through ``run_decompositions`` — with a table from which every op that has a rule is
removed, so decomposition only ever replaces what could not be lowered anyway.
Parameters, buffers and constants become constant values labelled by their module path.
"""

from __future__ import annotations

import contextlib
import inspect
import re
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind
from torch.utils import _pytree as pytree

from torchlower.core import progress
from torchlower.core.values import Value, constant
from torchlower.errors import LoweringError, TraceError, ValueDependentTraceError
from torchlower.frontends import export_bounds
from torchlower.frontends.export_inplace import functional_in_place
from torchlower.frontends.fx import Interpreter
from torchlower.frontends.provenance import REWRITES
from torchlower.frontends.session import Session
from torchlower.frontends.torch_noise import torch_output_to_debug_log
from torchlower.rules.recurrent_modules import recurrent_as_one_op
from torchlower.rules.registry import Registry, describe

_PROGRAMS: dict[Any, ExportedProgram] = {}  # torch.nn modules by structure: see ``_program_key``
_MAX_PROGRAMS = 256


def export_program(
    module: nn.Module,
    args: Sequence[Any],
    kwargs: dict[str, Any] | None,
    rules: Registry,
    key: Any = None,
    dynamic_shapes: Any = None,
) -> ExportedProgram:
    """``torch.export`` the module, reusing the program of a structurally equal ``torch.nn`` module.

    With ``dynamic_shapes`` (dynamic axes) the program is symbolic and never shared.

    Exporting costs 0.05–0.3 s; a network repeats the same few layer configurations, and
    ``interpret_program`` reads weights from the module itself, so the graph can be shared.
    """
    if dynamic_shapes is not None:
        return _export(module, args, kwargs, rules, dynamic_shapes)
    key = _program_key(module, args, kwargs, rules) if key is None else key
    program = _PROGRAMS.get(key) if key is not None else None
    if program is None:
        program = _export(module, args, kwargs, rules)
        if key is not None:
            if len(_PROGRAMS) >= _MAX_PROGRAMS:
                _PROGRAMS.pop(next(iter(_PROGRAMS)))
            _PROGRAMS[key] = program
    return program


def _program_key(
    module: nn.Module, args: Sequence[Any], kwargs: dict[str, Any] | None, rules: Registry
) -> Any:
    """Everything the ATen graph of a ``torch.nn`` layer depends on, or None (never cached).

    Only PyTorch's own layers: their graph is a function of their class, plain attributes
    (configuration, mode), which tensors they hold, and the inputs' dtypes/shapes — not of the
    weights' values.
    User modules may read arbitrary attributes, so they are always exported afresh.
    """
    configs = [_config(m) for m in module.modules()]
    if any(c is None for c in configs):
        return None
    spec = pytree.tree_map_only(torch.Tensor, lambda t: (t.dtype, tuple(t.shape)), (tuple(args), kwargs))
    tensors = tuple(
        (name, t.dtype, tuple(t.shape), isinstance(t, nn.Parameter))
        for name, t in [*module.named_parameters(), *module.named_buffers()]
    )
    return (repr(configs), repr(spec), tensors, id(rules), len(rules.functions))


_MODULE_STATE = frozenset(vars(nn.Module()))  # what nn.Module.__init__ sets: hooks, tensors, children
_KEPT_STATE = {"training", "_non_persistent_buffers_set"}
_SIMPLE = (int, float, bool, str, type(None), torch.dtype, torch.device)


def _config(m: nn.Module) -> tuple[Any, ...] | None:
    """A ``torch.nn`` layer's class and plain attributes (``repr`` omits some, e.g. ceil_mode)."""
    if not type(m).__module__.startswith("torch.nn."):
        return None
    state = vars(m)
    if any(
        state[k] for k in _MODULE_STATE - _KEPT_STATE - {"_parameters", "_buffers", "_modules"} if k in state
    ):
        return None  # hooks change what the layer computes
    items = [(k, v) for k, v in sorted(state.items()) if k not in _MODULE_STATE or k in _KEPT_STATE]
    if not all(_simple(v) for _, v in items):
        return None
    return (type(m), *items)


def _simple(value: Any) -> bool:
    if isinstance(value, (tuple, list, set, frozenset)):
        return all(_simple(v) for v in value)
    return isinstance(value, _SIMPLE)


def _grouped_varargs(module: nn.Module, dynamic_shapes: Any) -> Any:
    """Per-argument ``dynamic_shapes`` with the ``*args`` entries as one tuple.

    torch.export matches ``dynamic_shapes`` to ``forward``'s parameters, so a ``forward(x, *past)``
    called with five tensors wants ``(dx, (dp0, dp1, dp2, dp3))``, not five entries.
    """
    if not isinstance(dynamic_shapes, tuple):
        return dynamic_shapes
    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        return dynamic_shapes
    star = [i for i, p in enumerate(params) if p.kind is inspect.Parameter.VAR_POSITIONAL]
    if not star or len(dynamic_shapes) <= len(params):  # one entry per parameter already
        return dynamic_shapes
    return (*dynamic_shapes[: star[0]], tuple(dynamic_shapes[star[0] :]))


def _export(
    module: nn.Module,
    args: Sequence[Any],
    kwargs: dict[str, Any] | None,
    rules: Registry,
    dynamic_shapes: Any = None,
) -> ExportedProgram:
    """``torch.export`` the module; decompose (keeping ops with rules) only when that completes it."""
    # dynamic shapes: recurrent layers as one op, not their decomposition unrolled over time
    routing = recurrent_as_one_op() if dynamic_shapes is not None else contextlib.nullcontext()
    dynamic_shapes = _grouped_varargs(module, dynamic_shapes)
    try:
        with warnings.catch_warnings(), routing, torch_output_to_debug_log("torch.export"):
            warnings.simplefilter("ignore")
            program = torch.export.export(
                module, tuple(args), kwargs or None, strict=False, dynamic_shapes=dynamic_shapes
            )
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
        if type(exc).__name__ in _DATA_DEPENDENT:  # a Python value taken from a tensor's data
            raise ValueDependentTraceError(
                f"torch.export of {type(module).__qualname__} depends on tensor values at"
                f" {_user_line(str(exc))} (a Python branch, loop count or value taken from a tensor)."
                f" {REWRITES}"
            ) from exc
        if dynamic_shapes is not None and "onstraint" in str(exc):  # a dynamic dim got specialized
            pinned = LoweringError(f"torch.export found that the model restricts a dynamic axis: {first}")
            pinned.torch_message = str(exc)  # type: ignore[attr-defined]  # read by ``lower_export``
            raise pinned from exc
        raise TraceError(f"torch.export failed on {type(module).__qualname__}: {first}") from exc
    functional_in_place(program)
    if all(_lowerable(n.target, rules) for n in program.graph.nodes if n.op == "call_function"):
        return program
    table = torch.export.default_decompositions()
    for op in list(table.keys()):
        if rules.lookup_function(op) is not None:
            del table[op]
    try:
        decomposed = program.run_decompositions(table)
    except Exception:  # decomposition is a second chance; the original names what is missing
        return program
    nodes = [n for n in decomposed.graph.nodes if n.op == "call_function"]
    # when ops are still missing, the original's high-level names make the better error message
    return decomposed if all(_lowerable(n.target, rules) for n in nodes) else program


_DATA_DEPENDENT = ("GuardOnDataDependentSymNode",)
_CALL_SITE = re.compile(r'File "([^"]+)", line (\d+), in \w+\n\s*(.+)')


def _value_reads(program: ExportedProgram) -> list[str]:
    """Source lines of ``aten.item`` nodes: a Python value read from a tensor inside the graph."""
    out = []
    for n in program.graph.nodes:
        if n.op == "call_function" and getattr(n.target, "__name__", "").startswith(_ITEM_OPS):
            trace = str(n.meta.get("stack_trace") or "")
            out.append(_user_line(trace) if trace else n.name)
    return out


_ITEM_OPS = ("item", "_local_scalar_dense")


def _user_line(text: str) -> str:
    """``model.py:12: `if x.sum() > 0:``` from torch.export's "The following call raised" note."""
    found = _CALL_SITE.findall(text)
    if not found:
        return "a line of the model"
    file, line, code = found[-1]
    return f"{Path(file).name}:{line}: `{code.strip()}`"


def _lowerable(target: Any, rules: Registry) -> bool:
    if not isinstance(target, torch._ops.OpOverload):
        return True  # operator.getitem and friends are structural
    if not target._schema.returns or target._schema.name in ("aten::sym_size", "aten::sym_numel"):
        return True
    mutates = any(a.alias_info is not None and a.alias_info.is_write for a in target._schema.arguments)
    return not mutates and rules.lookup_function(target) is not None


def interpret_program(
    program: ExportedProgram,
    builder: Any,
    session: Session,
    inputs: Sequence[Any],
    prefix: str = "",
    module: nn.Module | None = None,
    symbols: dict[str, str] | None = None,
    mutations: dict[int, Any] | None = None,
) -> list[Any]:
    """Run the program's graph on symbolic ``inputs`` (flat user inputs); flat user outputs.

    Parameters and buffers are read from ``module`` when given (the program may be shared).
    ``mutations``, when given, receives {user input position: its new value} for the inputs the
    program writes in place (a wrapped ``x[:, 1:] += y`` helper).
    """
    user = iter(inputs)
    values: list[Any] = []
    own: dict[str, torch.Tensor] = {}
    if module is not None:
        own = dict(
            [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]
        )
    for spec in program.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            values.append(next(user))
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            tensor = own.get(spec.target) if spec.kind != InputKind.CONSTANT_TENSOR else None
            tensor = program.state_dict.get(spec.target) if tensor is None else tensor
            tensor = program.constants[spec.target] if tensor is None else tensor
            name = spec.target.removeprefix("fn.") if isinstance(module, _Call) else spec.target
            label = prefix + name if spec.kind != InputKind.CONSTANT_TENSOR else None
            is_tensor = isinstance(tensor, torch.Tensor)
            values.append(constant(tensor.detach(), label=label) if is_tensor else tensor)
        else:
            values.append(None)  # tokens / custom objects: no data flows through them
    interpreter = Interpreter(program.graph_module, builder, session, prefix=prefix)
    interpreter.symbols = symbols or {}
    outputs = interpreter.run(*values)
    specs = program.graph_signature.output_specs
    if mutations is not None:  # new values of user inputs the program writes in place
        names = [s.arg.name for s in program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
        for o, s in zip(outputs, specs, strict=True):
            if s.kind == OutputKind.USER_INPUT_MUTATION and s.target in names:
                mutations[names.index(s.target)] = o
    return [o for o, s in zip(outputs, specs, strict=True) if s.kind == OutputKind.USER_OUTPUT]


def lower_export(
    builder: Any,
    module: nn.Module,
    example: Sequence[torch.Tensor],
    inputs: Sequence[Value],
    session: Session,
    spec: Any = None,
) -> list[Any]:
    """The ``export`` front end: flat outputs of ``module`` called on ``inputs``."""
    dims = spec.export_dims(example, module) if spec is not None else None
    try:
        program = export_program(module, example, None, builder.rules, dynamic_shapes=dims)
    except LoweringError as exc:  # a dynamic axis torch.export pinned: bounds, or a clear error
        if spec is None:
            raise
        program = export_bounds.export_again(builder, module, example, spec, exc)
    reads = _value_reads(program)
    if reads:
        raise ValueDependentTraceError(
            f"torch.export of {type(module).__qualname__}: the model takes a Python value from a tensor"
            f" (.item(), float(t), int(t)) at {'; '.join(reads)}; the artifact cannot compute it. {REWRITES}"
        )
    progress.retotal(sum(n.op.startswith("call_") for n in program.graph_module.graph.nodes), "lowering")
    symbols = _symbols_of(program, inputs) if spec is not None else None
    return interpret_program(program, builder, session, inputs, module=module, symbols=symbols)


def lower_submodule(
    builder: Any,
    session: Session,
    module: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    example: tuple[tuple[Any, ...], dict[str, Any]],
    prefix: str,
) -> Any:
    """A leaf module without a module rule (FX front end), lowered through its ATen graph."""
    if _dynamic_values(pytree.tree_leaves((args, kwargs))):
        return lower_call(builder, session, module, args, kwargs, example, prefix, own=module)
    program = export_program(module, example[0], example[1], builder.rules)
    leaves = pytree.tree_leaves((args, kwargs))
    n_user = sum(s.kind == InputKind.USER_INPUT for s in program.graph_signature.input_specs)
    if len(leaves) != n_user:
        leaves = [leaf for leaf in leaves if isinstance(leaf, Value)]
    flat = interpret_program(program, builder, session, leaves, prefix, module)
    return pytree.tree_unflatten(flat, program.call_spec.out_spec)


class _Call(nn.Module):
    """One torch Python-level call as a module, so that ``torch.export`` can lower it alone."""

    def __init__(self, fn: Any, template: list[Any], spec: pytree.TreeSpec) -> None:
        super().__init__()
        self.fn, self.template, self.spec = fn, template, spec

    def forward(self, *tensors: torch.Tensor) -> Any:
        given = iter(tensors)
        leaves = [next(given) if leaf is _TENSOR else leaf for leaf in self.template]
        args, kwargs = pytree.tree_unflatten(leaves, self.spec)
        return self.fn(*args, **kwargs)


_TENSOR = object()  # a tensor's place in a ``_Call`` template


def lower_call(
    builder: Any,
    session: Session,
    fn: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    example: tuple[tuple[Any, ...], dict[str, Any]],
    where: str,
    own: nn.Module | None = None,
) -> Any:
    """``fn(*args, **kwargs)`` (FX front end, ``F.interpolate``…) lowered through its ATen graph.

    The program depends only on ``fn``, the non-tensor arguments and the tensors' dtypes and
    shapes, so it is cached by exactly those. Under dynamic axes the tensors' symbolic sizes
    become ``torch.export`` dims, and the program is symbolic too. ``own``: a module called
    (weights are read from it under its own names).
    """
    leaves, spec = pytree.tree_flatten(example)
    tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
    symbolic = [leaf for leaf in pytree.tree_leaves((args, kwargs)) if isinstance(leaf, Value)]
    if len(symbolic) != len(tensors):
        raise LoweringError(f"{where}: the tensor arguments of {describe(fn)} changed between passes")
    template = [_TENSOR if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]
    call = _Call(fn, template, spec)
    if _dynamic_values(symbolic):
        program = _export(call, tensors, None, builder.rules, _export_dims(symbolic, where, describe(fn)))
        symbols = _symbols_of(program, symbolic)
    else:
        shown = [("tensor", t.dtype, tuple(t.shape)) if isinstance(t, torch.Tensor) else t for t in leaves]
        key = (fn, str(spec), repr(shown), id(builder.rules), len(builder.rules.functions))
        program, symbols = export_program(call, tensors, None, builder.rules, key), None
    prefix = where + "." if own is None else where
    module = None if own is None else call
    mutations: dict[int, Any] = {}
    flat = interpret_program(program, builder, session, symbolic, prefix, module, symbols, mutations)
    session.writes.extend((symbolic[i], new) for i, new in sorted(mutations.items()))
    return pytree.tree_unflatten(flat, program.call_spec.out_spec)


def _dynamic_values(leaves: Sequence[Any]) -> bool:
    return any(isinstance(v, Value) and v.is_symbolic for v in leaves)


def _export_dims(values: Sequence[Value], where: str, what: str) -> tuple[Any, ...]:
    """``dynamic_shapes`` for ``_Call.forward(*values)``: one ``Dim`` per symbol name."""
    dims: dict[str, Any] = {}
    out: list[Any] = []
    for k, v in enumerate(values):
        by_axis = {}
        for axis, d in enumerate(v.shape or ()):
            if isinstance(d, int):
                continue
            name = str(d)
            if not name.isidentifier():
                raise LoweringError(
                    f"{where}: {what} is lowered through torch.export, which takes plain symbols as"
                    f" sizes; tensor argument {k} has size {name} on axis {axis}"
                )
            by_axis[axis] = dims.setdefault(name, torch.export.Dim(name, min=1))
        out.append(by_axis or None)
    return (tuple(out),)  # ``*tensors`` is one argument to torch.export


def _symbols_of(program: ExportedProgram, values: Sequence[Value]) -> dict[str, str]:
    """torch.export's ``s0``, ``s1``… → the symbols of the values passed as its user inputs."""
    names = [s.arg.name for s in program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    nodes = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    out: dict[str, str] = {}
    for name, v in zip(names, values, strict=True):
        for dim, ours in zip(nodes[name].meta["val"].shape, v.shape or (), strict=False):
            if isinstance(dim, torch.SymInt) and not isinstance(ours, int):
                out[str(dim.node.expr)] = str(ours)
    return out
