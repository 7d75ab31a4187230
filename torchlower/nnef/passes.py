"""Passes over the NNEF builder's graph before it is written: fewer ops, fewer and smaller files.

Every pass keeps the function the graph computes (up to float rounding where constants are
pre-multiplied) and is deterministic: it walks assignments in order and names new values
through the builder. Dead code is dropped by ``NNEFBuilder.live_assignments``; here:

- ``fold_constant_chains``: ``(x ∘ a) ∘ b`` → ``x ∘ (a ∘ b)`` for constant ``a``, ``b`` and ∘ in
  {add, mul}, and ``(x + a) · b`` → ``x · b + a · b`` so a scale can reach the op before it;
- ``fold_affine``: a per-output-channel constant ``mul`` / ``add`` after a ``conv`` or a
  constant-weight ``matmul`` goes into its weights / bias (batch norm after conv or linear);
- ``simplify_layout``: identity transposes, casts, copies and empty squeezes go; consecutive
  transposes and reshapes merge; ``x·1``, ``x/1``, ``x−0`` go;
- ``share_constants``: variables with the same dtype, shape and bytes become one;
- then ``fusions.apply``: op chains that tract runs faster as one kernel (attention as
  ``tract_transformers_sdpa`` at short sequence lengths), see ``nnef/fusions.py``;
- ``patches.patch_matmul``: a patch-embedding conv read channel-last becomes one matmul, so
  tract keeps the residual stream contiguous (``nnef/patches.py``);
- ``layout.canonical_layout``: layout chains as at most one transpose (``nnef/layout.py``).

tract's own optimizer already fuses many of these at load time (its profile shows no separate
mul/add after a conv); doing them here shrinks the artifact and the load work.
"""

from __future__ import annotations

from typing import Any

import torch

from torchlower.core.values import Value
from torchlower.nnef import graph_edit as edit
from torchlower.nnef import text
from torchlower.nnef.builder import NNEFBuilder

Assignment = text.Assignment
_ARITH = {"add": torch.add, "mul": torch.mul}


def optimize(b: NNEFBuilder) -> None:
    """Run every pass to a fixed point; the builder's assignments are replaced."""
    if b.quantization:  # graph.quant keys are value names: leave quantized graphs as they are
        return
    b.assignments = b.live_assignments()
    for _ in range(8):
        changed = False
        for step in (simplify_layout, fold_constant_chains, fold_affine):
            changed |= step(b)
        b.assignments = b.live_assignments()
        if not changed:
            break
    from torchlower.nnef import fusions

    if fusions.apply(b):
        b.assignments = b.live_assignments()
    from torchlower.nnef import layout, patches

    if patches.patch_matmul(b):
        b.assignments = b.live_assignments()
    if layout.canonical_layout(b):
        b.assignments = b.live_assignments()
    share_constants(b)
    b.assignments = b.live_assignments()


# ---- simplify_layout ----------------------------------------------------------------------
def simplify_layout(b: NNEFBuilder) -> bool:
    """Drop identity layout ops and merge chains of transposes / reshapes / equal casts."""
    producers = edit.producers(b)
    renames: dict[str, Value] = {}

    def source(a: Assignment) -> Assignment | None:
        x = a.args[0] if a.args else None
        return producers.get(x.name) if isinstance(x, Value) else None

    changed = False
    for a in b.assignments:
        if len(a.outputs) != 1 or not a.args or not isinstance(a.args[0], Value):
            continue
        x, inner = a.args[0], source(a)
        if a.op == "transpose":
            axes = list(a.attrs.get("axes", []))
            if (
                inner is not None
                and inner.op == "transpose"
                and len(inner.attrs.get("axes", [])) == len(axes)
                and isinstance(inner.args[0], Value)
            ):
                axes = [list(inner.attrs["axes"])[i] for i in axes]  # out[i] = in[p[q[i]]]
                x = inner.args[0]
                a.args[0], a.attrs["axes"], changed = x, axes, True
            if axes == list(range(len(axes))):
                renames[a.outputs[0].name] = x
        elif a.op == "reshape" and _full_reshape(a) and inner is not None and inner.op == "reshape":
            shape = a.attrs.get("shape", [])
            if all(not isinstance(d, int) or d != 0 for d in shape):
                a.args[0], changed = inner.args[0], True  # only the element count reaches this one
        elif a.op == "copy" or (a.op in ("squeeze", "unsqueeze") and list(a.attrs.get("axes", [1])) == []):
            renames[a.outputs[0].name] = x
        elif a.op == "tract_core_cast" and inner is not None and inner.op == "tract_core_cast":
            if inner.attrs.get("to") == a.attrs.get("to"):
                renames[a.outputs[0].name] = x
        elif len(a.args) == 2 and type(a.args[1]) is float and _neutral(a.op, a.args[1]):
            renames[a.outputs[0].name] = x
    renames = {k: v for k, v in renames.items() if _keeps_meta(producers, k, v)}
    edit.substitute(b, renames)
    return changed or bool(renames)


def _neutral(op: str, c: float) -> bool:
    """``x op c == x`` bit for bit (``x + 0.0`` is not: it turns −0.0 into 0.0)."""
    return (op in ("mul", "div") and c == 1.0) or (op == "sub" and c == 0.0)


def _keeps_meta(producers: dict[str, Assignment], name: str, by: Value) -> bool:
    """Never replace a value with one of another dtype (e.g. a scalar literal's promotion)."""
    old = producers[name].outputs[0]
    return old.dtype is None or by.dtype is None or old.dtype == by.dtype


def _full_reshape(a: Assignment) -> bool:
    return a.attrs.get("axis_start", 0) == 0 and a.attrs.get("axis_count", -1) == -1


# ---- fold_constant_chains -----------------------------------------------------------------
def _split(
    a: Assignment, b: NNEFBuilder, producers: dict[str, Assignment]
) -> tuple[Value, torch.Tensor, Any] | None:
    """``(x, c, operand)`` when ``a`` is add/mul of a tensor ``x`` and a float constant ``c``."""
    if a.op not in _ARITH or len(a.args) != 2 or a.attrs:
        return None
    first, second = a.args
    for x, c in ((first, second), (second, first)):
        if isinstance(x, Value) and edit.const(b, x, producers) is None:
            const = edit.const(b, c, producers)
            if const is not None and const.is_floating_point():
                return x, const, c
    return None


def fold_constant_chains(b: NNEFBuilder) -> bool:
    """``(x ∘ a) ∘ b`` → ``x ∘ (a ∘ b)``; ``(x + a) · b`` → ``x · b + a · b`` (single-use inner)."""
    producers, uses = edit.producers(b), edit.uses(b)

    def step(a: Assignment, out: list[Assignment]) -> bool:
        outer = _split(a, b, producers)
        inner_a = producers.get(outer[0].name) if outer else None
        inner = _split(inner_a, b, producers) if inner_a is not None else None
        if outer is None or inner is None or uses[outer[0].name] != 1 or not _same_float(inner[1], outer[1]):
            out.append(a)
            return False
        x, c_in, c_out = inner[0], inner[1], outer[1]
        label = f"constants/{a.outputs[0].name}"
        if inner_a.op == a.op:  # one op with the combined constant
            merged = _ARITH[a.op](c_in, c_out).to(c_in.dtype)
            a.args = [x, edit.operand(b, merged, label, out)]
        elif inner_a.op == "add":  # (x + c) * s = x * s + c * s: the scale moves next to x
            scaled = Value(b.fresh(inner_a.outputs[0].name), a.outputs[0].dtype, a.outputs[0].shape)
            shift = (c_in * c_out).to(c_in.dtype)
            out.append(Assignment([scaled], "mul", [x, outer[2]], {}))
            a.op, a.args = "add", [scaled, edit.operand(b, shift, label, out)]
        else:
            out.append(a)
            return False
        out.append(a)
        return True

    return edit.rewrite(b, step)


def _same_float(x: torch.Tensor, y: torch.Tensor) -> bool:
    return x.dtype == y.dtype or x.dim() == 0 or y.dim() == 0


# ---- fold_affine --------------------------------------------------------------------------
def fold_affine(b: NNEFBuilder) -> bool:
    """A per-output-channel ``mul``/``add`` after ``conv`` or constant-weight ``matmul`` → weights/bias."""
    producers, uses = edit.producers(b), edit.uses(b)

    def step(a: Assignment, out: list[Assignment]) -> bool:
        split = _split(a, b, producers)
        op = producers.get(split[0].name) if split else None
        if split is None or op is None or uses[split[0].name] != 1 or op.op not in ("conv", "matmul"):
            out.append(a)
            return False
        fused = _fold_conv(b, producers, op, a.op, split[1], out) if op.op == "conv" else None
        if op.op == "matmul" and a.op == "mul":
            fused = _fold_matmul(b, producers, op, split[1], out)
        if fused is None:
            out.append(a)
            return False
        out.append(Assignment(a.outputs, op.op, fused, dict(op.attrs)))
        return True

    return edit.rewrite(b, step)


def _channels(c: torch.Tensor, rank: int, axis: int, n: int) -> torch.Tensor | None:
    """``c`` as a length-``n`` vector when it broadcasts along ``axis`` only (of a rank-``rank`` output)."""
    if c.dim() > rank:
        return None
    shape = [1] * (rank - c.dim()) + list(c.shape)
    if any(d != 1 for i, d in enumerate(shape) if i != axis) or shape[axis] not in (1, n):
        return None
    return c.reshape(-1).expand(n)


def _fold_conv(
    b: NNEFBuilder,
    producers: dict[str, Assignment],
    conv: Assignment,
    kind: str,
    c: torch.Tensor,
    before: list[Assignment],
) -> list[Any] | None:
    """New args of ``conv`` computing ``conv(...) * c`` or ``conv(...) + c``."""
    if len(conv.args) != 3 or not isinstance(conv.args[1], Value):
        return None
    weight = edit.const(b, conv.args[1], producers)
    bias = edit.const(b, conv.args[2], producers)
    if weight is None or bias is None or not weight.is_floating_point() or c.dtype != weight.dtype:
        return None
    n = weight.shape[0]
    vec = _channels(c, weight.dim(), 1, n)
    if vec is None or bias.numel() not in (1, n) or bias.dim() > 2:
        return None
    bias_vec = bias.reshape(-1).expand(n)
    label = producers[conv.args[1].name].attrs["label"]
    if kind == "mul":
        weight = weight * vec.reshape((n,) + (1,) * (weight.dim() - 1))
        bias_vec = bias_vec * vec
        w_arg = edit.operand(b, weight, f"{label}.folded", before)
    else:
        bias_vec = bias_vec + vec
        w_arg = conv.args[1]
    b_arg = edit.operand(b, bias_vec.reshape(1, n).to(weight.dtype), f"{label}.folded_bias", before)
    return [conv.args[0], w_arg, b_arg]


def _fold_matmul(
    b: NNEFBuilder,
    producers: dict[str, Assignment],
    mm: Assignment,
    c: torch.Tensor,
    before: list[Assignment],
) -> list[Any] | None:
    """New args of ``matmul(x, W)`` computing ``matmul(x, W) * c`` (scale along output columns)."""
    if mm.attrs.get("transposeA") or len(mm.args) != 2 or not isinstance(mm.args[1], Value):
        return None
    weight = edit.const(b, mm.args[1], producers)
    if weight is None or not weight.is_floating_point() or weight.dim() < 2 or c.dtype != weight.dtype:
        return None
    transposed = bool(mm.attrs.get("transposeB"))
    n = weight.shape[-2] if transposed else weight.shape[-1]
    vec = _channels(c, weight.dim(), weight.dim() - 1, n)
    if vec is None:
        return None
    scale = vec.reshape(n, 1) if transposed else vec
    label = producers[mm.args[1].name].attrs["label"]
    return [mm.args[0], edit.operand(b, weight * scale, f"{label}.folded", before)]


# ---- share_constants ----------------------------------------------------------------------
def share_constants(b: NNEFBuilder) -> bool:
    """Variables with equal dtype, shape and bytes become one (a labelled model weight is kept).

    Two model weights never merge (each keeps its label); bytes are compared only between
    candidates of the same kind, dtype and shape, so large distinct weights cost no compare.
    """
    classes: dict[tuple[Any, ...], list[list[Assignment]]] = {}
    for a in b.assignments:
        w = b.weights.get(a.attrs["label"]) if a.op.startswith("variable") else None
        if not isinstance(w, torch.Tensor):
            continue
        found = classes.setdefault((a.op, w.dtype, tuple(w.shape)), [])
        for members in found:
            if _named(a) and any(_named(m) for m in members):
                continue
            if _same_bytes(b.weights[members[0].attrs["label"]], w):
                members.append(a)
                break
        else:
            found.append([a])
    renames: dict[str, Value] = {}
    place: dict[int, Assignment] = {}  # id of the first member -> the member defined there
    for members in (m for found in classes.values() for m in found if len(m) > 1):
        keep = next((m for m in members if _named(m)), members[0])
        place[id(members[0])] = keep
        renames.update({m.outputs[0].name: keep.outputs[0] for m in members if m is not keep})
    if not renames:
        return False
    moved = {id(a) for a in place.values()}
    b.assignments = [place.get(id(a), a) for a in b.assignments if id(a) in place or id(a) not in moved]
    edit.substitute(b, renames)
    return True


def _named(a: Assignment) -> bool:
    return not a.attrs["label"].startswith("constants/")


def _same_bytes(x: torch.Tensor, y: torch.Tensor) -> bool:
    if x.data_ptr() == y.data_ptr() and x.stride() == y.stride():
        return True
    return torch.equal(
        x.contiguous().reshape(-1).view(torch.uint8), y.contiguous().reshape(-1).view(torch.uint8)
    )
