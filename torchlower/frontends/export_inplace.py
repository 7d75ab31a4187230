"""In-place ATen ops that nothing can observe, made functional in a ``torch.export`` graph.

torch.export (non-strict) keeps ``aten.add_`` & co.; the interpreter lowers functional ops
only, and the generic way out (``run_decompositions``) traces the program a second time.
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram


def functional_in_place(program: ExportedProgram) -> None:
    """``x.add_(y)`` on an intermediate only that op reads → ``add(x, y)``, in place in the graph.

    Nothing else can observe ``x`` (no other user, not a view of another value, not an input),
    so the functional op computes the same; otherwise the in-place op would send the whole
    program through ``run_decompositions``, a second trace (Falcon's ``mlp_output +=``).
    """
    changed = False
    for n in program.graph.nodes:
        if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload) or not n.args:
            continue
        name = n.target._schema.name.split("::")[-1]
        base = n.args[0]
        if not name.endswith("_") or name.endswith("__") or not isinstance(base, torch.fx.Node):
            continue
        if (
            base.op != "call_function"
            or len(base.users) != 1
            or not isinstance(base.target, torch._ops.OpOverload)
        ):
            continue
        if any(r.alias_info is not None for r in base.target._schema.returns):
            continue  # a view: the write would reach the value it views
        functional = getattr(getattr(torch.ops.aten, name[:-1], None), n.target._overloadname, None)
        if _same_arguments(functional, n.target) and n.target.namespace == "aten":
            n.target = functional
            changed = True
    if changed:
        program.graph_module.recompile()


def _same_arguments(functional: object, in_place: torch._ops.OpOverload) -> bool:
    """Same argument types (``pow_.Scalar`` is ``pow.Tensor_Scalar``, not ``pow.Scalar``)."""
    if not isinstance(functional, torch._ops.OpOverload):
        return False
    kinds = [(a.name, str(a.type)) for a in functional._schema.arguments]
    return kinds == [(a.name, str(a.type)) for a in in_place._schema.arguments]
