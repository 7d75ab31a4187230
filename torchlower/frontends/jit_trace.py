"""Tracing for the TorchScript front end: ``torch.jit.trace``, its faster equivalent route,
dummy-quantized inputs for quantized models, and the extra traces dynamic axes need."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from torchlower.core import dynamic
from torchlower.core.dynamic import Spec
from torchlower.core.size_fit import SizeFitter
from torchlower.errors import DynamicAxisError, LoweringError
from torchlower.frontends import jit_sizes
from torchlower.frontends.autograd_inline import functions_inlined
from torchlower.frontends.provenance import raised_at
from torchlower.frontends.script_inline import helpers_traced


def _is_quantized_input_module(module: nn.Module) -> bool:
    """True when the first compute layer is a quantized conv/linear (expects quantized input)."""
    for sub in module.modules():
        if type(sub).__name__ == "Quantize":  # a QuantStub converted: it quantizes the input itself
            return False
        kind = type(sub).__module__
        if kind.startswith("torch.ao.nn.quantized") and type(sub).__name__ in {
            "Conv1d", "Conv2d", "Conv3d", "Linear", "ConvTranspose1d", "ConvTranspose2d",
        }:  # fmt: skip
            return True
        if isinstance(sub, (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)):
            return False
    return False


def maybe_quantize_args(module: nn.Module, args: tuple[Any, ...] | None) -> tuple[Any, ...] | None:
    """Quantize float tensor args when ``module`` expects quantized input.

    Only to make tracing work: the scale (1.0) and zero point (0) are dummies and the
    quantized values are not representative of real data.
    """
    if args is None or not _is_quantized_input_module(module):
        return args
    return tuple(
        torch.quantize_per_tensor(a, 1.0, 0, torch.quint8)
        if isinstance(a, torch.Tensor) and a.is_floating_point() and not a.is_quantized
        else a
        for a in args
    )


def trace(
    module: nn.Module,
    fn_name: str,
    args: tuple[Any, ...] | None,
    python_values: set[str] | None = None,
    conversions: list[str] | None = None,
) -> Any:
    """``torch.jit.trace``; ``python_values`` collects where the model turned a tensor (or a
    size) into a Python value, which the trace then holds as a constant (``file.py:12``);
    ``conversions`` gets the tracer's "Converting a tensor to a Python …" warnings."""
    if isinstance(module, torch.jit.ScriptModule):  # already a graph: read as scripted (jit_script)
        return module
    inputs = () if args is None else args
    options: dict[str, Any] = {"check_trace": False}
    if "strict" in torch.jit.trace.__code__.co_varnames:
        options["strict"] = False
    with warnings.catch_warnings(record=True) as caught:  # jit.trace is deprecated upstream
        warnings.simplefilter("always", category=torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        with functions_inlined(), helpers_traced():
            if fn_name == "forward":
                traced = torch.jit.trace(module, inputs, **options)
            else:
                traced = torch.jit.trace_module(module, {fn_name: inputs}, **options)
    for w in caught:  # the model's own warnings still reach the user
        if not issubclass(w.category, torch.jit.TracerWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if conversions is not None:
        conversions += converted(caught)
    if python_values is not None:
        python_values |= {
            f"{Path(w.filename).name}:{w.lineno}"
            for w in caught
            if issubclass(w.category, torch.jit.TracerWarning)
        }
    return traced


def converted(caught: list[warnings.WarningMessage]) -> list[str]:
    """``file.py:12: Converting a tensor to a Python boolean`` for each such tracer warning.

    They may be sizes (correct in the trace) or values (frozen at the example's value):
    ``provenance.value_conversions`` tells which.
    """
    out = []
    for w in caught:
        text = str(w.message)
        if issubclass(w.category, torch.jit.TracerWarning) and text.startswith("Converting a tensor"):
            out.append(f"{Path(w.filename).name}:{w.lineno}: {text.split(' might ')[0]}")
    return out


@dataclass
class FastTrace:
    graph: torch.Graph
    state: list[tuple[str, torch.Tensor]]  # (state_dict key, tensor) of the trailing graph inputs
    conversions: list[str]  # the tracer's warnings about tensors turned into Python values


def fast_trace(module: nn.Module, args: tuple[Any, ...]) -> FastTrace | None:
    """Trace with ``_get_trace_graph`` where it is equivalent to ``torch.jit.trace``; else None.

    Equivalent means: plain (not scripted, not quantized) module and tensor inputs, every
    parameter and buffer in the state dict exactly once (tied or non-persistent tensors would
    get other labels), and outputs that are tensors in (nested) tuples or lists.
    """
    if isinstance(module, torch.jit.ScriptModule) or not all(
        isinstance(a, torch.Tensor) and not a.is_quantized for a in args
    ):
        return None
    state = torch.jit._unique_state_dict(module, keep_vars=True)
    held = [t for _, t in module.named_parameters(remove_duplicate=False)]
    held += [t for _, t in module.named_buffers(remove_duplicate=False)]
    if len(state) != len(held) or {id(t) for t in state.values()} != {id(t) for t in held}:
        return None
    if any(t.is_quantized for t in held):
        return None
    scopes: dict[Any, str] = {"__module": module}
    for name, child in module.named_modules(remove_duplicate=False):
        if name:
            scopes[child] = f"__module.{name}"  # last name wins, as in torch.jit.trace_module
    old = torch.jit._trace._trace_module_map
    torch.jit._trace._trace_module_map = scopes  # scope names, as torch.jit.trace records them
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", category=torch.jit.TracerWarning)
            with functions_inlined(), helpers_traced():
                graph, out = torch.jit._get_trace_graph(module, args, strict=False)
    except (RuntimeError, TypeError, ValueError):
        return None  # the full route reports the failure with its own message
    finally:
        torch.jit._trace._trace_module_map = old
    if not _tensor_tree(out) or len(list(graph.inputs())) != len(args) + len(state):
        return None
    for w in caught:  # the model's own warnings still reach the user
        if not issubclass(w.category, torch.jit.TracerWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return FastTrace(graph, list(state.items()), converted(caught))


def _tensor_tree(item: Any) -> bool:
    if isinstance(item, (tuple, list)):
        return all(_tensor_tree(i) for i in item)
    return isinstance(item, torch.Tensor)


def dynamic_overrides(
    module: nn.Module, fn_name: str, args: tuple[Any, ...], graph: torch.Graph, spec: Spec
) -> jit_sizes.JitOverrides:
    """Trace at every other point of ``spec``; the graphs' differences become symbols. Where
    the traces do not decide a size, the fitter names more sizes to trace at."""
    graphs = [graph]
    python_values: set[str] = set()
    for k, point in enumerate(list(spec.points[1:]), start=1):
        try:
            graphs.append(_traced_graph(module, fn_name, args, spec, point, python_values))
        except Exception as exc:  # the model may not run at a size (index out of range, …)
            if k == spec.far:
                spec.drop_far()  # an extra witness only: the check never runs there
                continue
            line = raised_at(exc)
            raise dynamic.not_dynamic(
                spec,
                [s for s in spec.base if point[s] != spec.base[s]],
                f"the model fails at sizes {point}"
                f"{f' at {line}' if line else ''}"
                f" ({str(exc).strip().splitlines()[0] if str(exc).strip() else exc!r})",
            ) from exc
    fitter = SizeFitter(spec, "jit")
    try:
        while True:
            out = jit_sizes.jit_overrides(spec, graphs, fitter, module)
            if fitter.complete():
                out.graph = graphs[out.master] if out.master else None
                return out
            extra = fitter.wanted()
            if not extra:
                raise fitter.unresolved()
            for point in extra:
                try:
                    graphs.append(_traced_graph(module, fn_name, args, spec, point, python_values))
                except Exception:  # a size the model refuses tells nothing: try others
                    fitter.add(point, captured=False)
                else:
                    fitter.add(point, captured=True)
    except LoweringError as exc:
        if not python_values:
            raise
        where = ", ".join(sorted(python_values))
        kind = DynamicAxisError if isinstance(exc, DynamicAxisError) else LoweringError
        raise kind(f"{exc}. The model turned a tensor or size into a Python value at {where}") from exc


def _traced_graph(
    module: nn.Module,
    fn_name: str,
    args: tuple[Any, ...],
    spec: Spec,
    point: dict[str, int],
    python_values: set[str],
) -> torch.Graph:
    moved = maybe_quantize_args(module, spec.example_at(args, point))
    traced = trace(module, fn_name, moved, python_values)
    fn = traced if fn_name == "forward" else getattr(traced, fn_name)
    other = fn.graph.copy()
    torch._C._jit_pass_inline(other)
    return other
