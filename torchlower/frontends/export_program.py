"""``torch.export`` of a module as the export front end wants it: decomposed only where that
completes it, in-place ops made functional, and the programs of PyTorch's own layers shared
between structurally equal instances. Both the front end (``export``) and its retries with
other bounds (``export_bounds``) capture through here.
"""

from __future__ import annotations

import contextlib
import inspect
import re
import traceback
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.export import ExportedProgram
from torch.utils import _pytree as pytree

from torchlower.errors import LoweringError, TraceError, ValueDependentTraceError
from torchlower.frontends.export_inplace import functional_in_place
from torchlower.frontends.provenance import REWRITES, model_frame, raised_at
from torchlower.frontends.torch_noise import torch_output_to_debug_log
from torchlower.rules.recurrent_modules import recurrent_as_one_op
from torchlower.rules.registry import Registry

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


@contextlib.contextmanager
def _helper_frames() -> Iterator[None]:
    """torch.export records in a node's ``stack_trace`` only the frames of functions named
    ``forward``, so an op used in a helper (``helpers.py:3 in odd``) was blamed on the forward
    line that called it; here it keeps every frame from the first ``forward`` inward (torch's
    own other mode), and errors name the helper's line as the jit and fx front ends do."""
    tracer = torch.fx.proxy.TracerBase
    original = tracer._filter_traceback_frames

    def every_frame(self: Any, summary: traceback.StackSummary) -> traceback.StackSummary:
        saved = self._record_forward_stack_traces_only
        self._record_forward_stack_traces_only = False
        try:
            return original(self, summary)
        finally:
            self._record_forward_stack_traces_only = saved

    tracer._filter_traceback_frames = every_frame  # type: ignore[method-assign]
    try:
        yield
    finally:
        tracer._filter_traceback_frames = original  # type: ignore[method-assign]


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
        with warnings.catch_warnings(), routing, torch_output_to_debug_log("torch.export"), _helper_frames():
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
        line = raised_at(exc)
        raise TraceError(
            f"torch.export failed on {type(module).__qualname__}{f' at {line}' if line else ''}:"
            f" {type(exc).__name__}: {first}"
        ) from exc
    functional_in_place(program)
    if _all_lowerable(program, rules):
        return program
    table = torch.export.default_decompositions()
    for op in list(table.keys()):
        if rules.lookup_function(op) is not None:
            del table[op]
    try:
        decomposed = program.run_decompositions(table)
    except Exception:  # decomposition is a second chance; the original names what is missing
        decomposed = None
    if decomposed is not None and _all_lowerable(decomposed, rules):
        return decomposed
    # functionalized only (no op decomposed): in-place writes through views (``h[..., -1] += 1``
    # on a padded tensor) become scatters; the raw program would lose them. Its missing ops keep
    # their high-level names, the better error message.
    try:
        functional = program.run_decompositions({})
    except Exception:
        return program
    return functional


def _all_lowerable(program: ExportedProgram, rules: Registry) -> bool:
    return all(_lowerable(n.target, rules) for n in program.graph.nodes if n.op == "call_function")


_DATA_DEPENDENT = ("GuardOnDataDependentSymNode",)
_CALL_SITE = re.compile(r'File "([^"]+)", line (\d+), in \w+\n\s*(.+)')


def value_reads(program: ExportedProgram) -> list[str]:
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
    found = model_frame(_CALL_SITE.findall(text)[::-1])
    if found is None:
        return "a line of the model"
    file, line, code = found
    return f"{Path(file).name}:{line}: `{code.strip()}`"


def _lowerable(target: Any, rules: Registry) -> bool:
    if not isinstance(target, torch._ops.OpOverload):
        return True  # operator.getitem and friends are structural
    if not target._schema.returns or target._schema.name in ("aten::sym_size", "aten::sym_numel"):
        return True
    mutates = any(a.alias_info is not None and a.alias_info.is_write for a in target._schema.arguments)
    return not mutates and rules.lookup_function(target) is not None
