"""Patch embeddings (a conv whose kernel equals its stride, read channel-last) as one matmul.

A ViT's patch embedding is ``conv(x, W, stride = kernel) → flatten → transpose(1, 2)``. tract
0.23.9 removes that transpose by pushing it down the graph until a matmul absorbs it, so every
op in between — the residual stream, and with it each layer norm's ``Reduce<Sum>``, ``Sub`` and
``RmsNorm`` and the packing of each projection's input — runs over the channel axis with a
stride instead of along contiguous rows. Measured on the zoo's ``vit_tiny`` (17 tokens × 64,
1 thread, tract 0.23.9): each layer norm costs ~33 µs that way against ~4 µs contiguous, and
the whole model 259 µs against 131 µs once the patches are a matmul (torch_to_nnef's artifact
has the same strided layer norms).

Non-overlapping patches are a reshape of the input, so the conv is written as
``reshape → transpose → reshape`` of ``x`` into rows of patches and one ``matmul`` with the
filter as a ``[out, in·k…]`` matrix; the output is channel-last from the start and there is no
transpose left for tract to push. Same products, summed in another order (f32 rounding only).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from torchlower.core.values import Value
from torchlower.nnef import graph_edit as edit
from torchlower.nnef import text
from torchlower.nnef.builder import NNEFBuilder

Assignment = text.Assignment


def patch_matmul(b: NNEFBuilder) -> bool:
    """Rewrite every ``conv → [reshape to (N, O, P)] → transpose [0, 2, 1]`` over patches."""
    if not b.tract or b.precision != "f32":
        return False
    producers, uses = edit.producers(b), edit.uses(b)
    consumers = {x.name: a for a in b.assignments for x in a.args if isinstance(x, Value)}
    replace: dict[int, list[Assignment]] = {}
    for conv in b.assignments:
        found = _match(b, conv, producers, uses, consumers)
        if found is not None:
            end, new = found
            replace[id(end)] = new
    return edit.splice(b, replace)


def _kernel(conv: Assignment, spatial: list[int], k: list[int]) -> list[int] | None:
    """Patches per spatial axis when the conv tiles its input with non-overlapping kernels."""
    a = conv.attrs
    n = len(k)
    if a.get("groups", 1) != 1 or a.get("border", "constant") != "constant":
        return None
    if list(a.get("dilation", [1] * n)) not in ([1] * n, []):
        return None
    if any(tuple(p) != (0, 0) for p in a.get("padding", [(0, 0)] * n)):
        return None
    stride = list(a.get("stride", [1] * n))
    if len(stride) != n:
        return None
    for s, i, kk in zip(stride, spatial, k, strict=True):
        # the conv rule writes stride 1 where one window covers the axis (i == kk)
        if i % kk or (s != kk and i != kk):
            return None
    return [i // kk for i, kk in zip(spatial, k, strict=True)]


def _match(
    b: NNEFBuilder,
    conv: Assignment,
    producers: dict[str, Assignment],
    uses: Any,
    consumers: dict[str, Assignment],
) -> tuple[Assignment, list[Assignment]] | None:
    if conv.op != "conv" or len(conv.args) != 3 or len(conv.outputs) != 1:
        return None
    x, w_arg, bias_arg = conv.args
    if not isinstance(x, Value) or x.dtype != torch.float32 or not isinstance(w_arg, Value):
        return None
    shape, w = edit.static(x.shape), edit.const(b, w_arg, producers)
    if shape is None or w is None or w.dtype != torch.float32 or w.dim() != len(shape) or w.dim() < 3:
        return None
    n_, c, spatial = shape[0], shape[1], shape[2:]
    o, k = w.shape[0], list(w.shape[2:])
    if w.shape[1] != c:
        return None
    per_axis = _kernel(conv, spatial, k)
    if per_axis is None:
        return None
    if isinstance(bias_arg, float):
        bias: Any = None if bias_arg == 0.0 else bias_arg
    else:
        bias_t = edit.const(b, bias_arg, producers)
        if bias_t is None or bias_t.numel() not in (1, o):
            return None
        bias = bias_arg
    p = math.prod(per_axis)
    y = conv.outputs[0]
    step = consumers.get(y.name) if uses[y.name] == 1 else None
    if step is not None and step.op == "reshape" and len(spatial) > 1:
        if edit.static(step.outputs[0].shape) != [n_, o, p] or uses[step.outputs[0].name] != 1:
            return None
        step = consumers.get(step.outputs[0].name)
    if step is None or step.op != "transpose" or list(step.attrs.get("axes", [])) != [0, 2, 1]:
        return None
    if edit.static(step.outputs[0].shape) != [n_, p, o]:
        return None
    return step, _rewrite(b, conv, x, w_arg, bias, n_, c, per_axis, k, o, step)


def _rewrite(
    b: NNEFBuilder,
    conv: Assignment,
    x: Value,
    w_arg: Value,
    bias: Any,
    n_: int,
    c: int,
    per_axis: list[int],
    k: list[int],
    o: int,
    end: Assignment,
) -> list[Assignment]:
    scope, z = end.scope, end.outputs[0]
    s = len(k)
    p, ck = math.prod(per_axis), c * math.prod(k)
    split = [n_, c] + [d for pair in zip(per_axis, k, strict=True) for d in pair]
    perm = [0] + [2 + 2 * i for i in range(s)] + [1] + [3 + 2 * i for i in range(s)]
    moved = [split[i] for i in perm]

    def val(hint: str, shp: list[int]) -> Value:
        return Value(b.fresh(f"{z.name}_{hint}"), torch.float32, tuple(shp))

    xs, xt, rows = val("patches", split), val("patches", moved), val("rows", [n_ * p, ck])
    w2, mm = val("filter", [o, ck]), val("proj", [n_ * p, o])
    new = [
        Assignment([xs], "reshape", [x], {"shape": split}, scope),
        Assignment([xt], "transpose", [xs], {"axes": perm}, scope),
        Assignment([rows], "reshape", [xt], {"shape": [n_ * p, ck]}, scope),
        Assignment([w2], "reshape", [w_arg], {"shape": [o, ck]}, conv.scope),
        Assignment([mm], "matmul", [rows, w2], {"transposeA": False, "transposeB": True}, conv.scope),
    ]
    if bias is not None:
        biased = val("proj", [n_ * p, o])
        new.append(Assignment([biased], "add", [mm, bias], {}, conv.scope))
        mm = biased
    new.append(Assignment([z], "reshape", [mm], {"shape": [n_, p, o]}, scope))
    return new
