"""The ``torch.export`` front end: the ATen graph, interpreted by the FX ``Interpreter``.

``torch.export.export(strict=False)`` keeps high-level ops such as ``aten.linear`` or
``aten.scaled_dot_product_attention``. Only when some op has no rule is the program run
through ``run_decompositions`` — with a table from which every op that has a rule is
removed, so decomposition only ever replaces what could not be lowered anyway.
Parameters, buffers and constants become constant values labelled by their module path.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind
from torch.utils import _pytree as pytree

from torchlower.core import progress
from torchlower.core.dynamic import not_dynamic, resize
from torchlower.core.dynamic_forms import linear
from torchlower.core.model_io import state_kept
from torchlower.core.values import Value, constant
from torchlower.errors import LoweringError, ValueDependentTraceError
from torchlower.frontends import export_bounds
from torchlower.frontends.export_program import export_program, value_reads
from torchlower.frontends.fx_interpreter import Interpreter
from torchlower.frontends.provenance import REWRITES, raised_at
from torchlower.frontends.session import Session
from torchlower.rules.registry import describe


def interpret_program(
    program: ExportedProgram,
    builder: Any,
    session: Session,
    inputs: Sequence[Any],
    prefix: str = "",
    module: nn.Module | None = None,
    symbols: dict[str, str] | None = None,
    mutations: dict[int, Any] | None = None,
    reads_error: Exception | None = None,
) -> list[Any]:
    """Run the program's graph on symbolic ``inputs`` (flat user inputs); flat user outputs.

    ``reads_error``: raised at an ``aten.item`` whose tensor is not a known size (see
    ``Interpreter.read_size``).

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
    interpreter = Interpreter(program.graph_module, builder, session, prefix=prefix, escape=ESCAPE)
    interpreter.symbols = symbols or {}
    interpreter.reads_error = reads_error
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
    if spec is not None:  # torch.export pins sizes 0 and 1 of its example: capture at 2
        example = _capture_example(builder, spec, example, module)
    try:
        program = export_program(module, example, None, builder.rules, dynamic_shapes=dims)
    except LoweringError as exc:  # a dynamic axis torch.export pinned: bounds, or a clear error
        if spec is None:
            raise
        program = export_bounds.export_again(builder, module, example, spec, exc)
    reads = value_reads(program)
    refused = ValueDependentTraceError(
        f"torch.export of {type(module).__qualname__}: the model takes a Python value from a tensor"
        f" (.item(), float(t), int(t)) at {'; '.join(reads)}; the artifact cannot compute it. {REWRITES}"
    )
    if reads and spec is None:  # only a size read back from a tensor has a value the artifact knows
        raise refused
    progress.retotal(sum(n.op.startswith("call_") for n in program.graph_module.graph.nodes), "lowering")
    symbols = _symbols_of(program, inputs) if spec is not None else None
    return interpret_program(
        program, builder, session, inputs, module=module, symbols=symbols, reads_error=refused
    )


def _capture_example(
    builder: Any, spec: Any, example: Sequence[torch.Tensor], module: nn.Module
) -> tuple[torch.Tensor, ...]:
    """The example torch.export traces: a dynamic symbol at 0 or 1 (a batch-1 example) moved to
    2, which torch.export does not specialize; the check still runs at the example's size. A
    model PyTorch cannot run there is not dynamic in that axis (``x.expand(2, 2 * S)``)."""
    point = spec.capture_point()
    moved = [s for s in spec.base if point[s] != spec.base[s]]
    if not moved:
        return tuple(example)
    at = ", ".join(f"{s}={point[s]}" for s in moved)
    moved_example = spec.example_at(example, point)
    try:
        with torch.no_grad(), state_kept(module):
            module(*moved_example)
    except Exception as exc:  # PyTorch itself refuses the other size: say where
        line = raised_at(exc)
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise not_dynamic(
            spec, moved, f"PyTorch fails at {at}{f' at {line}' if line else ''} ({first})", advice=True
        ) from exc
    was = ", ".join(f"{s}={spec.base[s]}" for s in moved)
    builder.notes.append(
        f"dynamic axes {spec.where(moved)}: torch.export captured at {at} (it specializes sizes 0 and 1"
        f" of its example); checked at the example's {was} as well"
    )
    return moved_example


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
        dims = _export_dims(symbolic, where, describe(fn))
        program = export_program(
            call, _off_size_one(tensors, symbolic), None, builder.rules, dynamic_shapes=dims
        )
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
    """``dynamic_shapes`` for ``_Call.forward(*values)``: one ``Dim`` per symbol name, and
    derived Dims for sizes such as ``16*h`` (a U-Net's feature maps when ``H = 32*h``)."""
    dims: dict[str, Any] = {}
    out: list[Any] = []
    for k, v in enumerate(values):
        by_axis = {}
        for axis, d in enumerate(v.shape or ()):
            if isinstance(d, int):
                continue
            form = linear(d)
            if form is None:
                raise LoweringError(
                    f"{where}: {what} is lowered through torch.export, which takes symbols and their"
                    f" multiples (k*h + c) as sizes; tensor argument {k} has size {d} on axis {axis}"
                )
            root = dims.setdefault(form.symbol, torch.export.Dim(form.symbol, min=1))
            by_axis[axis] = root if form.plain else form.k * root + form.c
        out.append(by_axis or None)
    return (tuple(out),)  # ``*tensors`` is one argument to torch.export


def _off_size_one(tensors: Sequence[torch.Tensor], values: Sequence[Value]) -> list[torch.Tensor]:
    """The example tensors with each symbol at 0 or 1 moved to 2 on every axis it sizes (``k*h + c``
    at ``h = 2``; values cycled): torch.export specializes sizes 0 and 1 of its example, so a
    batch-1 example pinned B in a module FX hands to it (ultralytics' Detect head). The symbolic
    program holds at the example's size too, and the export's check runs there."""
    forms = [[linear(d) if not isinstance(d, int) else None for d in v.shape or ()] for v in values]
    pairs = zip(tensors, forms, strict=True)
    at = {f.symbol: (t.shape[a] - f.c) // f.k for t, fs in pairs for a, f in enumerate(fs) if f}
    moved = {s for s, n in at.items() if n <= 1}
    if not moved:
        return list(tensors)
    out = []
    for t, fs in zip(tensors, forms, strict=True):
        for axis, f in enumerate(fs):
            if f is not None and f.symbol in moved:
                t = resize(t, axis, 2 * f.k + f.c)
        out.append(t)
    return out


def _symbols_of(program: ExportedProgram, values: Sequence[Value]) -> dict[str, str]:
    """torch.export's ``s0``, ``s1``… → the symbols of the values passed as its user inputs."""
    names = [s.arg.name for s in program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    nodes = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    out: dict[str, str] = {}
    for name, v in zip(names, values, strict=True):
        for dim, ours in zip(nodes[name].meta["val"].shape, v.shape or (), strict=False):
            if isinstance(dim, torch.SymInt) and not isinstance(ours, int):
                theirs = sorted(map(str, dim.node.expr.free_symbols))
                mine = ours.symbols if hasattr(ours, "symbols") else [str(ours)]
                if len(theirs) == 1 and len(mine) == 1:  # 32*s39 is 32*h: s39 is h
                    out[theirs[0]] = mine[0]
    return out


# what the FX interpreter hands to torch.export when FX could not trace a module or call
ESCAPE = SimpleNamespace(lower_submodule=lower_submodule, lower_call=lower_call)
