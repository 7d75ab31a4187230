"""Pulse-safe forms of what tract's pulse transform streams wrongly (``export(stream=...)`` only,
so archives without ``stream=`` keep their bytes).

tract 0.23.9 pulses a strided ``deconv`` (a ``ConvTranspose1d`` overlap-add decoder) without
complaint and reports its delay in input frames instead of output steps: a decoder of stride 8
after a stride-8 encoder reports a delay of 1 where the stream lags 8 samples (the numbers are
right, the alignment is not). The same transposed convolution is written as a convolution over
frames followed by an interleave, which tract pulses with the right delay:

with stride ``s``, kernel ``k`` zero-padded to ``k' = m·s`` and ``n = q·s + r``,
``y[n] = Σ_i W[:, :, i·s + r] · h[q − i]`` (``i < m``): a ``conv`` with ``m`` taps, ``Cout·s``
output channels (``W2[co·s + r, :, j] = W[co, :, (m−1−j)·s + r]``) and padding ``m − 1`` on both
sides gives every frame's ``s`` samples, a partial ``reshape`` ``[Cout·s] → [Cout, s]``, a
``transpose`` and a partial ``reshape`` ``[Q, s] → [Q·s]`` lay them out in time, and a slice
drops the deconv's own padding (and the zero taps).

``cumsum`` over a symbolic axis is written by ``rules/scan.py`` as ``x @ Lᵀ`` with ``L`` the lower
triangle of a ``tract_core_range`` over the axis: tract cannot pulse that product (a square over
the streaming axis). A streaming export writes it as one ``tract_core_scan`` with a running sum
instead, which tract pulses (the state carries over from chunk to chunk).
"""

from __future__ import annotations

from typing import Any

import torch

from torchlower.core.values import Value
from torchlower.nnef import graph_edit
from torchlower.nnef.builder import NNEFBuilder

Assignment = graph_edit.Assignment


def pulse_safe(b: NNEFBuilder) -> list[str]:
    """Rewrite every strided 1-d ``deconv`` whose weights are constants; returns notes."""
    producers = graph_edit.producers(b)
    notes: list[str] = []

    def step(a: Assignment, out: list[Assignment]) -> bool:
        running = running_sum(b, a, producers)
        if running is not None:
            out.extend(running)
            notes.append(
                f"{a.scope or a.outputs[0].name}: cumsum over the streaming axis written as a running"
                " sum (tract_core_scan), which tract pulses (it cannot pulse the triangle product)"
            )
            return True
        replaced = overlap_add(b, a, producers)
        if replaced is None:
            out.append(a)
            return False
        out.extend(replaced)
        notes.append(
            f"{a.scope or a.outputs[0].name}: a strided ConvTranspose1d written as conv + interleave,"
            " which tract pulses with the right delay (its pulsed deconv reports the delay in frames)"
        )
        return True

    graph_edit.rewrite(b, step)
    return notes


def overlap_add(b: NNEFBuilder, a: Assignment, producers: dict[str, Assignment]) -> list[Assignment] | None:
    if a.op != "deconv" or "output_shape" in a.attrs or len(a.args) != 3:
        return None
    stride, dilation = a.attrs.get("stride", [1]), a.attrs.get("dilation", [1])
    if len(stride) != 1 or stride[0] < 2 or list(dilation) != [1] or a.attrs.get("groups", 1) != 1:
        return None
    x, w_item, bias_item = a.args
    w = tensor_of(b, w_item, producers)
    if not isinstance(x, Value) or w is None or w.dim() != 3:
        return None
    bias = tensor_of(b, bias_item, producers) if not isinstance(bias_item, (int, float)) else None
    if bias is None and not isinstance(bias_item, (int, float)):
        return None
    result = a.outputs[0]
    if x.shape is None or len(x.shape) != 3:
        return None
    (s,) = stride
    ((p0, p1),) = a.attrs.get("padding", [(0, 0)]) or [(0, 0)]
    cout, cin, k = w.shape
    m = -(-k // s)
    wp = torch.nn.functional.pad(w, (0, m * s - k))
    w2 = wp.reshape(cout, cin, m, s).flip(2).permute(0, 3, 1, 2).reshape(cout * s, cin, m).contiguous()
    before: list[Assignment] = []
    label = w_item.label if isinstance(w_item, Value) and w_item.label else "deconv.weight"
    weight = graph_edit.operand(b, w2, f"{label}.frames", before)
    if bias is None:
        bias2: Any = float(bias_item)
    else:
        bias2 = graph_edit.operand(
            b, bias.reshape(1, -1).repeat_interleave(s, dim=1).contiguous(), f"{label}.frames_bias", before
        )
    dtype = result.dtype

    def value(hint: str) -> Value:
        return Value(b.fresh(f"{result.name}_{hint}"), dtype)

    frames, split, moved, flat = value("frames"), value("split"), value("moved"), value("time")
    conv_attrs = {
        "border": "constant",
        "padding": [(m - 1, m - 1)],
        "stride": [1],
        "dilation": [1],
        "groups": 1,
    }
    scope = a.scope
    steps = [
        Assignment([frames], "conv", [x, weight, bias2], conv_attrs, scope),
        Assignment(
            [split], "reshape", [frames], {"shape": [cout, s], "axis_start": 1, "axis_count": 1}, scope
        ),
        Assignment([moved], "transpose", [split], {"axes": [0, 1, 3, 2]}, scope),
        Assignment([flat], "reshape", [moved], {"shape": [-1], "axis_start": 2, "axis_count": 2}, scope),
    ]
    length = (x.shape[2] - 1) * s + k - p0 - p1  # the deconv's output length (a SymDim under T)
    slice_attrs = {"axes": [2], "begin": [p0], "end": [length + p0]}
    steps.append(Assignment([result], "slice", [flat], slice_attrs, scope))
    for v in before:
        v.scope = scope
    return before + steps


def tensor_of(b: NNEFBuilder, item: Any, producers: dict[str, Assignment]) -> torch.Tensor | None:
    """A constant operand's tensor: a constant ``Value`` (a variable once printed) or a variable."""
    if isinstance(item, Value) and item.is_const:
        return item.const
    return graph_edit.const(b, item, producers)


def _is_triangle(item: Any, producers: dict[str, Assignment]) -> bool:
    """``reshape(cast(le(reshape(r, [1, n]), reshape(r, [n, 1]))))`` with ``r = range(0, n, 1)``:
    the lower triangle ``rules/scan.py`` multiplies by."""
    a = producers.get(item.name) if isinstance(item, Value) else None
    while a is not None and a.op in ("reshape", "tract_core_cast"):
        a = producers.get(a.args[0].name) if isinstance(a.args[0], Value) else None
    if a is None or a.op != "le" or not all(isinstance(x, Value) for x in a.args):
        return False
    cols, rows = (producers.get(x.name) for x in a.args)
    if cols is None or rows is None or cols.op != "reshape" or rows.op != "reshape":
        return False
    source = {x.name for x in (cols.args[0], rows.args[0]) if isinstance(x, Value)}
    if len(source) != 1:
        return False
    ranged = producers.get(source.pop())
    return (
        ranged is not None
        and ranged.op == "tract_core_range"
        and ranged.args[:1] == [0]
        and ranged.args[2:3] == [1]
        and [len(cols.attrs["shape"]), len(rows.attrs["shape"])] == [2, 2]
        and cols.attrs["shape"][0] == 1
        and rows.attrs["shape"][1] == 1
    )


def running_sum(b: NNEFBuilder, a: Assignment, producers: dict[str, Assignment]) -> list[Assignment] | None:
    """``x @ Lᵀ`` (a cumsum over x's last axis) as a ``tract_core_scan`` with a running sum."""
    if a.op != "matmul" or len(a.args) != 2 or a.attrs.get("transposeB") is not True:
        return None
    x, triangle = a.args
    if not isinstance(x, Value) or x.shape is None or not _is_triangle(triangle, producers):
        return None
    lead = list(x.shape[:-1])
    if not all(isinstance(d, int) for d in lead):
        return None
    dtype = x.dtype or torch.float32
    before: list[Assignment] = []
    init = graph_edit.operand(b, torch.zeros([*lead, 1], dtype=dtype), "constants/running_sum", before)
    if not isinstance(init, Value):
        return None
    params = [("v", dtype, (*lead, 1)), ("acc", dtype, (*lead, 1))]
    frag = b.fragment("running_sum", params, lambda sub, v: [sub.call("add", [v[0], v[1]], dtype=dtype)])
    axis = len(x.shape) - 1
    attrs = {
        "body": frag.name,
        "scan": [(frag.params[0], x, axis, 1)],
        "full": list(frag.captures),
        "state": [(frag.params[1], init, frag.results[0])],
        "output": [(frag.results[0], "full", axis, 1)],
    }
    for v in before:
        v.scope = a.scope
    return [*before, Assignment(list(a.outputs), "tract_core_scan", [], attrs, a.scope)]
