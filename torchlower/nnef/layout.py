"""Layout chains (reshape / squeeze / unsqueeze / transpose) rewritten to at most one transpose.

tract runs every ``transpose`` as one ``MoveAxis`` per displaced axis, each a full copy of the
tensor, and keeps moves of size-1 axes; reshapes and squeezes are free (``IntoShape``). PyTorch's
multi-head attention produces chains such as ``reshape [L,1,3,E] → unsqueeze → transpose
[3,1,2,0,4] → squeeze`` (three MoveAxis in tract, one needed) and batch-first / sequence-first
swaps of a size-1 batch axis (a MoveAxis where a reshape does). This pass computes what a chain
does to the elements and writes it as ``reshape → transpose → reshape`` over the fewest axes:
the same elements in the same order, so the numbers are bit-identical.

The chain is analysed as a permutation of "atoms": blocks of the input's axes that every reshape
in the chain either keeps whole or groups (an atom is split when a later reshape cuts it; a
chain whose reshapes cut across atom boundaries in an incompatible way is left alone). Size-1
axes carry no atoms. Static shapes only.
"""

from __future__ import annotations

from typing import Any

from torchlower.core.values import Value
from torchlower.nnef import graph_edit as edit
from torchlower.nnef import text
from torchlower.nnef.builder import NNEFBuilder

Assignment = text.Assignment
_LAYOUT = ("reshape", "squeeze", "unsqueeze", "transpose")


def canonical_layout(b: NNEFBuilder) -> bool:
    """Rewrite every maximal single-use layout chain that holds a transpose (see module doc)."""
    producers, uses = edit.producers(b), edit.uses(b)
    consumers: dict[str, Assignment] = {}
    for a in b.assignments:
        for x in a.args:
            if isinstance(x, Value):
                consumers[x.name] = a
    replace: dict[int, list[Assignment]] = {}
    for end in b.assignments:
        if not _is_layout(end):
            continue
        out = end.outputs[0].name
        nxt = consumers.get(out)
        if uses[out] == 1 and nxt is not None and _is_layout(nxt):
            continue  # not the end of its chain
        chain = [end]
        while True:
            x = chain[0].args[0]
            prev = producers.get(x.name) if isinstance(x, Value) else None
            if prev is None or not _is_layout(prev) or uses[x.name] != 1:
                break
            chain.insert(0, prev)
        if not any(a.op == "transpose" for a in chain):
            continue
        new = _rewrite_chain(b, chain)
        if new is not None:
            replace[id(end)] = new
    return edit.splice(b, replace)


def _is_layout(a: Assignment) -> bool:
    if a.op not in _LAYOUT or len(a.outputs) != 1 or len(a.args) != 1 or not isinstance(a.args[0], Value):
        return False
    if a.op == "reshape" and (a.attrs.get("axis_start", 0) != 0 or a.attrs.get("axis_count", -1) != -1):
        return False
    return edit.static(a.args[0].shape) is not None and edit.static(a.outputs[0].shape) is not None


def _rewrite_chain(b: NNEFBuilder, chain: list[Assignment]) -> list[Assignment] | None:
    x: Value = chain[0].args[0]
    y: Value = chain[-1].outputs[0]
    found = _atoms(chain)
    if found is None:
        return None
    sizes, in_order, out_order = found
    # merge atoms that are neighbours in the input and stay neighbours in the output
    groups: list[list[int]] = []
    for atom in out_order:
        if groups and in_order.index(groups[-1][-1]) + 1 == in_order.index(atom):
            groups[-1].append(atom)
        else:
            groups.append([atom])
    by_input = sorted(groups, key=lambda g: in_order.index(g[0]))
    perm = [by_input.index(g) for g in groups]
    out_shape = edit.static(y.shape)
    assert out_shape is not None
    if perm == list(range(len(perm))):
        return [Assignment([y], "reshape", [x], {"shape": out_shape}, chain[-1].scope)]
    if len(chain) == 1:
        return None  # one transpose already (tract may fold it into a matmul operand as it is)
    grouped = [_prod(sizes[a] for a in g) for g in by_input]
    moved = [grouped[p] for p in perm]
    new: list[Assignment] = []
    src = x
    if grouped != edit.static(x.shape):
        src = Value(b.fresh(f"{y.name}_atoms"), x.dtype, tuple(grouped))
        new.append(Assignment([src], "reshape", [x], {"shape": grouped}, chain[-1].scope))
    if moved == out_shape:
        new.append(Assignment([y], "transpose", [src], {"axes": perm}, chain[-1].scope))
        return new
    t = Value(b.fresh(f"{y.name}_moved"), x.dtype, tuple(moved))
    new.append(Assignment([t], "transpose", [src], {"axes": perm}, chain[-1].scope))
    new.append(Assignment([y], "reshape", [t], {"shape": out_shape}, chain[-1].scope))
    return new


def _prod(xs: Any) -> int:
    p = 1
    for v in xs:
        p *= v
    return p


def _atoms(chain: list[Assignment]) -> tuple[dict[int, int], list[int], list[int]] | None:
    """(atom sizes, atoms in input order, atoms in output order), or None when not expressible."""
    shape = edit.static(chain[0].args[0].shape)
    assert shape is not None
    sizes: dict[int, int] = {}
    in_order: list[int] = []
    dims: list[list[int]] = []
    for d in shape:
        if d == 0:
            return None
        if d == 1:
            dims.append([])
            continue
        sizes[len(sizes)] = d
        in_order.append(len(sizes) - 1)
        dims.append([len(sizes) - 1])
    for a in chain:
        rank = len(dims)
        if a.op == "transpose":
            axes = list(a.attrs.get("axes", []))
            if sorted(axes) != list(range(len(axes))) or len(axes) > rank:
                return None
            axes += list(range(len(axes), rank))  # NNEF: trailing axes stay
            dims = [dims[i] for i in axes]
        elif a.op == "squeeze":
            axes = [ax % rank for ax in a.attrs.get("axes", [])]
            if any(dims[ax] for ax in axes):
                return None
            dims = [d for i, d in enumerate(dims) if i not in axes]
        elif a.op == "unsqueeze":
            for ax in sorted(a.attrs.get("axes", [])):
                dims.insert(ax, [])
        else:  # reshape to the output's static shape
            target = edit.static(a.outputs[0].shape)
            assert target is not None
            regrouped = _regroup([atom for d in dims for atom in d], target, sizes, in_order)
            if regrouped is None:
                return None
            dims = regrouped
        if [_prod(sizes[x] for x in d) for d in dims] != edit.static(a.outputs[0].shape):
            return None
    return sizes, in_order, [atom for d in dims for atom in d]


def _regroup(
    seq: list[int], target: list[int], sizes: dict[int, int], in_order: list[int]
) -> list[list[int]] | None:
    """Group the atom sequence ``seq`` into ``target`` dims, splitting atoms where a dim ends inside one."""
    seq = list(seq)
    out: list[list[int]] = []
    i = 0
    for t in target:
        group: list[int] = []
        have = 1
        while have < t:
            if i >= len(seq):
                return None
            atom = sizes[seq[i]]
            if have * atom <= t:
                group.append(seq[i])
                have *= atom
                i += 1
                continue
            need = t // have
            if t % have or atom % need:
                return None
            outer = max(sizes) + 1  # split seq[i] into (need, atom // need)
            inner = outer + 1
            sizes[outer], sizes[inner] = need, atom // need
            old = seq[i]
            seq[i : i + 1] = [outer, inner]
            k = in_order.index(old)
            in_order[k : k + 1] = [outer, inner]
            del sizes[old]
            group.append(outer)
            have *= need
            i += 1
        if have != t:
            return None
        out.append(group)
    return out if i == len(seq) else None
