"""Small edits of the NNEF builder's assignment list that every pass and guard shares: who
produces and who uses a value, renaming uses, splicing replacements in, new variables.

Kept apart from ``passes`` so the passes, guards and fusions that use them import this module
and ``passes`` can import them back without a circle.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import torch

from torchlower.core.values import Value
from torchlower.nnef import text
from torchlower.nnef.builder import NNEFBuilder

Assignment = text.Assignment


def substitute(b: NNEFBuilder, renames: dict[str, Value]) -> None:
    """Point every use of a renamed value at its replacement (chains resolved)."""
    if not renames:
        return

    def final(v: Value) -> Value:
        while v.name in renames:
            v = renames[v.name]
        return v

    def sub(item: Any) -> Any:
        if isinstance(item, Value):
            return final(item)
        if isinstance(item, (list, tuple)):
            return type(item)(sub(i) for i in item)
        return item

    for a in b.assignments:
        a.args = [sub(x) for x in a.args]
        a.attrs = {k: sub(v) for k, v in a.attrs.items()}
    b.outputs = [(n, final(v)) for n, v in b.outputs]


def uses(b: NNEFBuilder) -> Counter[str]:
    count: Counter[str] = Counter()

    def walk(item: Any) -> None:
        if isinstance(item, Value):
            count[item.name] += 1
        elif isinstance(item, (list, tuple)):
            for i in item:
                walk(i)

    for a in b.assignments:
        walk(a.args)
        walk(list(a.attrs.values()))
    for _, v in b.outputs:
        count[v.name] += 2  # an output is never folded away
    return count


def producers(b: NNEFBuilder) -> dict[str, Assignment]:
    return {o.name: a for a in b.assignments for o in a.outputs}


def const(b: NNEFBuilder, item: Any, producers: dict[str, Assignment]) -> torch.Tensor | None:
    """The tensor behind an operand: a float literal, or a plain (not block-packed) variable."""
    if isinstance(item, float):
        return torch.tensor(item)
    if isinstance(item, Value):
        a = producers.get(item.name)
        if a is not None and a.op.startswith("variable"):
            weight = b.weights.get(a.attrs["label"])
            if isinstance(weight, torch.Tensor):
                return weight
    return None


def variable(b: NNEFBuilder, tensor: torch.Tensor, label: str) -> tuple[Value, Assignment]:
    """A new variable assignment (not yet placed) holding ``tensor``."""
    label = label if label not in b.weights else b.fresh(label.replace("/", "_"))
    b.weights[label] = tensor
    out = Value(b.fresh(label), tensor.dtype, tuple(tensor.shape), label=label)
    kind = "logical" if tensor.dtype == torch.bool else "scalar" if tensor.is_floating_point() else "integer"
    attrs = {"label": label, "shape": list(tensor.shape)}
    return out, Assignment([out], f"variable<{kind}>", [], attrs)


def operand(b: NNEFBuilder, tensor: torch.Tensor, label: str, before: list[Assignment]) -> Any:
    """A rank-0 float folds to a literal; anything else becomes a variable defined ``before``."""
    if tensor.dim() == 0 and tensor.is_floating_point():
        return float(tensor.item())
    value, define = variable(b, tensor.contiguous(), label)
    before.append(define)
    return value


def static(shape: Any) -> list[int] | None:
    """``shape`` as a list when every size is a plain int (no symbol), else None."""
    if shape is None or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        return None
    return list(shape)


def splice(b: NNEFBuilder, replace: dict[int, list[Assignment]]) -> bool:
    """Put ``replace[id(a)]`` in place of each such assignment ``a``; the chains it consumed are
    left dead for ``live_assignments`` to drop. Says whether anything was replaced."""
    if not replace:
        return False
    out: list[Assignment] = []
    for a in b.assignments:
        out.extend(replace.get(id(a), [a]))
    b.assignments = out
    return True


def rewrite(b: NNEFBuilder, step: Callable[[Assignment, list[Assignment]], bool]) -> bool:
    """Rebuild the assignment list; ``step(a, out)`` appends ``a``'s replacement(s) and says if it changed."""
    out: list[Assignment] = []
    changed = False
    for a in list(b.assignments):
        changed |= step(a, out)
    b.assignments = out
    return changed
