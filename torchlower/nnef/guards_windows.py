"""Window ops on sizes that are multiples: padding no window reads is dropped, so tract's size
arithmetic divides exactly.

tract 0.23.9 derives a strided conv's output size as ``(in + pad - kernel) / stride + 1`` and
cannot simplify a floor division that is not exact: for a U-Net input ``8 * h`` a 3×3 stride-2
conv with padding (1, 1) gives ``(8*h - 1) / 2 + 1``, three of them ``(7 + 8*h) / 8``, and the
decoder's ``reshape`` / ``concat`` to ``h`` fails to load ("4*((7+8*h)/8)*… should be equal to
4*(h)*…"). When the input size is ``k*h + c`` with the stride dividing ``k``, the remainder of
that division is a constant ``r``: the last ``r`` positions of trailing padding (or, past the
padding, of the input) are read by no window. Dropping them changes no output value and makes
tract's quotient exact (``(8*h - 2) / 2 + 1`` is ``4*h``). Other sizes are left as they are.
"""

from __future__ import annotations

from typing import Any

from torchlower.core.dynamic_forms import linear
from torchlower.core.values import Value
from torchlower.nnef import text
from torchlower.nnef.builder import NNEFBuilder
from torchlower.nnef.guards_matmul import replacing

Assignment = text.Assignment
_POOLS = ("max_pool", "box", "avg_pool", "argmax_pool", "max_pool_with_index", "sum_pool")


def exact_windows(b: NNEFBuilder) -> bool:
    """Convs and pools on multiples read no unused padding (see the module docstring)."""
    return replacing(b, lambda a: _exact(b, a))


def _exact(b: NNEFBuilder, a: Assignment) -> list[Assignment] | None:
    x = a.args[0] if a.args else None
    if a.op not in ("conv", *_POOLS) or not isinstance(x, Value) or x.shape is None:
        return None
    pads, strides = a.attrs.get("padding"), a.attrs.get("stride")
    if not pads or not strides:
        return None
    first = x.rank - len(pads)  # conv pads its spatial axes only, pools every axis
    kernel = _kernel(a, len(pads))
    if kernel is None or first < 0:
        return None
    dilation = list(a.attrs.get("dilation") or [1] * len(pads))
    pads, cuts = [tuple(p) for p in pads], {}
    for j, (s, k, d) in enumerate(zip(strides, kernel, dilation, strict=True)):
        form = linear(x.shape[first + j])
        if s <= 1 or form is None or form.k % s or not isinstance(k, int):
            continue
        before, after = pads[j]
        r = (form.c + before + after - d * (k - 1) - 1) % s  # positions past the last window
        trim = min(r, after)
        pads[j] = (before, after - trim)
        if r > trim and not b.quantization:  # graph.quant names values: no new ones there
            cuts[first + j] = r - trim
    if pads == [tuple(p) for p in a.attrs["padding"]] and not cuts:
        return None
    steps, source = [], x
    if cuts:
        shape = list(x.shape)
        for axis, n in cuts.items():
            shape[axis] = x.shape[axis] - n
        source = Value(b.fresh(f"{x.name}_read"), x.dtype, tuple(shape))
        attrs = {"axes": list(cuts), "begin": [0] * len(cuts), "end": [shape[i] for i in cuts]}
        steps.append(Assignment([source], "slice", [x], attrs, a.scope))
    steps.append(Assignment(a.outputs, a.op, [source, *a.args[1:]], {**a.attrs, "padding": pads}, a.scope))
    return steps


def _kernel(a: Assignment, n: int) -> list[Any] | None:
    """The window's size per padded axis: a conv filter's spatial dims, a pool's ``size``."""
    if a.op == "conv":
        w = a.args[1] if len(a.args) > 1 else None
        return list(w.shape[2:]) if isinstance(w, Value) and w.shape is not None else None
    size = a.attrs.get("size")
    return list(size) if size is not None and len(size) == n else None
