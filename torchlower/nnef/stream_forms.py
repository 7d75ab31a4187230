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
