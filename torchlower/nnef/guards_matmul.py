"""The guards around ``matmul``: rewrites of its operands that tract 0.23's einsum declutter gets wrong.

Listed, with the tract behaviour each avoids, in ``nnef/guards.py`` (which runs them):
``broadcast_after_matmul``, ``broadcast_as_product``, ``flat_matmul_after_reshape``,
``normal_weights``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from torchlower.core.values import Value
from torchlower.nnef import graph_edit as edit
from torchlower.nnef import text
from torchlower.nnef.builder import NNEFBuilder

Assignment = text.Assignment
_PRODUCTS = ("matmul", "linear", "conv", "deconv")
_LAYOUT = ("reshape", "transpose", "squeeze", "unsqueeze", "tract_core_broadcast")
_SMALLEST = torch.finfo(torch.float32).tiny
_SCAN = 1 << 18  # elements per slice of a weight's denormal scan (1 MiB): small temporaries, few calls


def normal_weights(b: NNEFBuilder) -> bool:
    """Float32 denormals in a constant operand of a matmul or conv become ±the smallest normal.

    tract 0.23.9's matmul and conv kernels flush denormal operands to zero: ``inf · 1e-45`` in
    a dot product came out NaN where torch gives inf (found by the special-values fuzz, ``silu(x @ w)``).
    ±1.18e-38 keeps the product's sign and infinity; a finite product moves by at most
    ``|x| · 1.18e-38``, below float32's resolution of anything but a product near its largest
    values. Denormals of a runtime operand are flushed still (docs/reliability.md)."""
    producers, changed = edit.producers(b), False
    for a in b.assignments:
        if a.op not in _PRODUCTS:
            continue
        for v in a.args:
            source = _variable_behind(v, producers)
            label = source.attrs["label"] if source is not None else None
            w = b.weights.get(label) if label is not None else None
            if not isinstance(w, torch.Tensor) or w.dtype != torch.float32:
                continue
            if _has_denormal(w, b.release):
                denormal = (w != 0) & (w.abs() < _SMALLEST)
                b.weights[label] = torch.where(denormal, torch.copysign(torch.tensor(_SMALLEST), w), w)
                changed = True
    return changed


def _has_denormal(w: torch.Tensor, release: Callable[[torch.Tensor], None] | None) -> bool:
    """Whether ``w`` holds a denormal, read slice by slice: the temporaries stay small, and each
    slice read is handed to ``release`` (a memory-mapped weight drops its pages as it goes)."""
    if not w.is_contiguous():  # a view: scanned whole (reshaping would copy it anyway)
        return bool(((w != 0) & (w.abs() < _SMALLEST)).any())
    flat = w.reshape(-1)
    for i in range(0, flat.numel(), _SCAN):
        part = flat[i : i + _SCAN]
        if bool(((part != 0) & (part.abs() < _SMALLEST)).any()):
            return True
        if release is not None:  # from the previous slice: the page they share is whole in it
            release(flat[max(0, i - _SCAN) : i + _SCAN])
    return False


def _variable_behind(v: object, producers: dict[str, Assignment]) -> Assignment | None:
    """The ``variable`` a matmul/conv operand reads, through layout ops (a transposed weight)."""
    while isinstance(v, Value) and (p := producers.get(v.name)) is not None:
        if p.op.startswith("variable"):
            return p
        if p.op not in _LAYOUT or not p.args:
            return None
        v = p.args[0]
    return None


def broadcast_after_matmul(b: NNEFBuilder) -> bool:
    """``matmul(broadcast(x), w)`` → ``broadcast(matmul(x, w))`` when only batch axes broadcast."""
    producers, uses = edit.producers(b), edit.uses(b)
    return replacing(b, lambda a: _matmul_then_broadcast(b, a, producers, uses))


def _matmul_then_broadcast(
    b: NNEFBuilder, a: Assignment, producers: dict[str, Assignment], uses: dict[str, int]
) -> list[Assignment] | None:
    y = a.outputs[0]
    if a.op != "matmul" or len(a.args) != 2 or y.shape is None:
        return None
    args = list(a.args)
    for i, v in enumerate(args):
        p = producers.get(v.name) if isinstance(v, Value) else None
        if p is None or p.op != "tract_core_broadcast" or uses[v.name] != 1:
            continue
        src, target = p.args[0], list(p.attrs.get("shape", []))
        if not isinstance(src, Value) or src.shape is None or len(src.shape) != len(target):
            continue
        if list(src.shape[-2:]) == target[-2:]:  # only batch axes broadcast
            args[i] = src
    if args == list(a.args):
        return None
    product = Value(b.fresh(f"{y.name}_unbroadcast"), y.dtype, None)
    return [
        Assignment([product], "matmul", args, dict(a.attrs)),
        Assignment([y], "tract_core_broadcast", [product], {"shape": list(y.shape)}),
    ]


def broadcast_as_product(b: NNEFBuilder) -> bool:
    """``broadcast(concat(..))`` read by a concat that a matmul reads → ``concat(..) · ones``."""
    producers = edit.producers(b)
    readers: dict[str, list[Assignment]] = {}
    for a in b.assignments:
        for v in [*a.args, *(x for arg in a.args if isinstance(arg, list) for x in arg)]:
            if isinstance(v, Value):
                readers.setdefault(v.name, []).append(a)

    def into_matmul(v: Value) -> bool:
        concats = [r for r in readers.get(v.name, []) if r.op == "concat"]
        return any(m.op == "matmul" for c in concats for m in readers.get(c.outputs[0].name, []))

    return replacing(
        b,
        lambda a: (
            _as_product(b, a, producers)
            if a.op == "tract_core_broadcast" and into_matmul(a.outputs[0])
            else None
        ),
    )


def _as_product(b: NNEFBuilder, a: Assignment, producers: dict[str, Assignment]) -> list[Assignment] | None:
    """The broadcast as a product with ones (x · 1.0 is x, NaN and -0.0 included): tract splits
    that, and the concatenated cache keeps its one reader, as ``detect_kv_cache`` needs."""
    src = a.args[0] if a.args else None
    inner = producers.get(src.name) if isinstance(src, Value) else None
    if (
        inner is None
        or inner.op != "concat"
        or src.shape is None
        or not (src.dtype and src.dtype.is_floating_point)
    ):
        return None
    target = list(a.attrs.get("shape", []))
    if len(target) != len(src.shape):
        return None
    ones_shape = [t if d == 1 and t != 1 else 1 for d, t in zip(src.shape, target, strict=True)]
    ones = Value(b.fresh(f"{src.name}_ones"), src.dtype, tuple(ones_shape))
    return [
        Assignment([ones], "tract_core_broadcast", [1.0], {"shape": ones_shape}, a.scope),
        Assignment(list(a.outputs), "mul", [src, ones], {}, a.scope),
    ]


def flat_matmul_after_reshape(b: NNEFBuilder) -> bool:
    """``matmul(reshape(..), C)`` with ``C`` a ``[1, …, 1, K, N]`` constant → 2-D matmul + reshapes."""
    producers = edit.producers(b)
    return replacing(b, lambda a: _flattened_matmul(b, a, producers))


def _flattened_matmul(
    b: NNEFBuilder, a: Assignment, producers: dict[str, Assignment]
) -> list[Assignment] | None:
    if a.op != "matmul" or len(a.args) != 2 or a.attrs.get("transposeA", False):
        return None
    x, w = a.args
    y = a.outputs[0]
    if not (isinstance(x, Value) and isinstance(w, Value)) or w.shape is None:
        return None
    source, weight = producers.get(x.name), producers.get(w.name)
    if source is None or source.op != "reshape" or weight is None or not weight.op.startswith("variable"):
        return None
    if x.shape is None:  # its own target shape, when it spells every size
        target = source.attrs.get("shape", [])
        if not target or not all(isinstance(d, int) and d > 0 for d in target):
            return None
        x = Value(x.name, x.dtype, tuple(target))
    if len(w.shape) < 3 or len(x.shape) != len(w.shape) or any(d != 1 for d in w.shape[:-2]):
        return None
    if _keeps_batch_axes(source, x):
        return None  # the bug needs a reshape of the batch axes (measured: the guard costs 1-4 %)
    k = x.shape[-1]
    n = w.shape[-2] if a.attrs.get("transposeB", False) else w.shape[-1]
    shape = [*x.shape[:-1], n]
    rows = Value(b.fresh(f"{y.name}_rows"), x.dtype, None)
    matrix = Value(b.fresh(f"{w.name}_2d"), w.dtype, tuple(w.shape[-2:]))
    product = Value(b.fresh(f"{y.name}_2d"), y.dtype, None)
    return [
        Assignment([rows], "reshape", [x], {"shape": [-1, k]}),
        Assignment([matrix], "reshape", [w], {"shape": list(w.shape[-2:])}),
        Assignment([product], "matmul", [rows, matrix], dict(a.attrs)),
        Assignment([y], "reshape", [product], {"shape": shape}),
    ]


def _keeps_batch_axes(reshape: Assignment, x: Value) -> bool:
    """Whether ``reshape`` leaves the matmul's batch axes (all but the last two) as they were.

    Only such a reshape (heads merged into the feature axis, rows merged into M) is folded by
    tract without touching the constant's broadcast axes; merging or splitting batch axes
    (``[3, 2, 5, K] → [30, 1, K]``) is what tract gets wrong."""
    source = reshape.args[0] if reshape.args else None
    if not isinstance(source, Value) or source.shape is None or x.shape is None:
        return False
    batch = list(x.shape[:-2])
    return (
        len(source.shape) >= len(batch)
        and list(source.shape[: len(batch)]) == batch
        and all(isinstance(d, int) for d in batch)
    )


def replacing(b: NNEFBuilder, replace: Callable[[Assignment], list[Assignment] | None]) -> bool:
    """Each assignment replaced by ``replace(a)`` where that is not None (``graph_edit.rewrite``)."""

    def step(a: Assignment, out: list[Assignment]) -> bool:
        new = replace(a)
        out.extend([a] if new is None else new)
        return new is not None

    return edit.rewrite(b, step)
