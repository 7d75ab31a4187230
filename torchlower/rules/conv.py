"""Convolutions (1-3 d, transposed) and explicit padding.

Every ATen spelling lands on one ``_conv``: ``_convolution`` (jit), ``convolution`` and
``conv{1,2,3}d`` / ``conv_transpose{1,2,3}d`` (export). Padding modes other than zeros arrive
as a separate ``pad`` op (that is how ``nn.Conv`` applies them), lowered to NNEF ``pad`` with
tract's border names, or to slices + concat for circular padding.
"""

from __future__ import annotations

from collections.abc import Sequence

from torchlower.core.values import Dim, Shape, SymDim, Value, at_least, constant
from torchlower.errors import LoweringError
from torchlower.rules import rule
from torchlower.rules.common import Builder, shape_of
from torchlower.rules.creation import filled
from torchlower.rules.layout import concat

Pairs = list[tuple[int, int]]
_BORDER = {"constant": "constant", "reflect": "reflect", "replicate": "replicated"}


def _expand(values: Sequence[int] | int, n: int, name: str) -> list[int]:
    values = [values] if isinstance(values, int) else list(values)
    if len(values) == 1:
        values = values * n
    if len(values) != n:
        raise LoweringError(f"conv: {name} has {len(values)} entries, expected 1 or {n}")
    return [int(v) for v in values]


def _conv(
    b: Builder,
    x: Value,
    w: Value,
    bias: Value | None,
    stride: Sequence[int],
    padding: Sequence[int] | str,
    dilation: Sequence[int],
    groups: int,
    transposed: bool = False,
    output_padding: Sequence[int] = (0,),
) -> Value:
    n = w.rank - 2
    k = list(shape_of(w)[2:])
    stride, dilation = _expand(stride, n, "stride"), _expand(dilation, n, "dilation")
    pairs = _padding(padding, k, dilation, n)
    batched = x.rank == n + 2
    if not batched:
        x = b.call("unsqueeze", [x], {"axes": [0]}, dtype=x.dtype, shape=(1, *shape_of(x)))
    out_channels = shape_of(w)[1] * groups if transposed else shape_of(w)[0]
    spatial = shape_of(x)[2:]
    attrs: dict = {"border": "constant", "padding": pairs, "stride": stride, "dilation": dilation}
    if transposed:
        extra = _expand(output_padding, n, "output_padding")
        out = [
            (i - 1) * s - p0 - p1 + d * (kk - 1) + e + 1 if isinstance(i, int) else None
            for i, s, (p0, p1), d, kk, e in zip(spatial, stride, pairs, dilation, k, extra, strict=True)
        ]
        if any(extra):  # tract derives output_padding from an explicit output_shape
            if any(o is None for o in out):
                raise LoweringError("conv_transpose: output_padding needs static spatial input dims")
            attrs["output_shape"] = out
        op = "deconv"
    else:
        spans = [
            i + p0 + p1 - d * (kk - 1) - 1 if isinstance(i, int) else None
            for i, (p0, p1), d, kk in zip(spatial, pairs, dilation, k, strict=True)
        ]
        out = [span // s + 1 if span is not None else None for span, s in zip(spans, stride, strict=True)]
        # one window position: the stride is moot; tract would split it into a Downsample it then
        # fails to move over an ``unsqueeze`` of that axis ("Invalid axis" at load)
        attrs["stride"] = [1 if span == 0 else s for span, s in zip(spans, stride, strict=True)]
        op = "conv"
    attrs["groups"] = int(groups)
    shape: Shape | None = None
    if all(o is not None for o in out):
        shape = (shape_of(x)[0], out_channels, *out)  # type: ignore[arg-type]
    if transposed:
        w = _deconv_filter(b, w, groups)
    y = b.call(op, [x, w, _bias(b, bias)], attrs, dtype=x.dtype, shape=shape)
    if not batched:
        y = b.call("squeeze", [y], {"axes": [0]}, dtype=x.dtype, shape=None if shape is None else shape[1:])
    return y


def _deconv_filter(b: Builder, w: Value, groups: int) -> Value:
    """torch's ``[in, out/g, *k]`` transposed-conv weight as tract's ``[out, in/g, *k]``."""
    cin, cout_g, *k = shape_of(w)
    split = [groups, cin // groups, cout_g, *k]
    out = [cout_g * groups, cin // groups, *k]
    if w.is_const:
        return constant(w.const.reshape(split).transpose(1, 2).reshape(out), label=w.label)
    perm = [0, 2, 1, *range(3, len(split))]
    w = b.call("reshape", [w], {"shape": split}, dtype=w.dtype, shape=tuple(split))
    w = b.call("transpose", [w], {"axes": perm}, dtype=w.dtype)
    return b.call("reshape", [w], {"shape": out}, dtype=w.dtype, shape=tuple(out))


def _padding(padding: Sequence[int] | str, k: list[int], dilation: list[int], n: int) -> Pairs:
    if padding == "valid":
        return [(0, 0)] * n
    if padding == "same":  # torch puts the odd element on the right
        totals = [d * (kk - 1) for d, kk in zip(dilation, k, strict=True)]
        return [(t // 2, t - t // 2) for t in totals]
    if isinstance(padding, str):
        raise LoweringError(f"conv: padding must be ints, 'same' or 'valid', got {padding!r}")
    return [(p, p) for p in _expand(padding, n, "padding")]


def _bias(b: Builder, bias: Value | None) -> Value | float:
    if bias is None:
        return 0.0
    if bias.is_const:
        return constant(bias.const.reshape(1, -1), label=bias.label)
    return b.call("unsqueeze", [bias], {"axes": [0]}, dtype=bias.dtype)


@rule("aten::_convolution")
def _convolution(
    b: Builder,
    x: Value,
    w: Value,
    bias: Value | None,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    transposed: bool,
    output_padding: Sequence[int],
    groups: int,
    benchmark: bool = False,
    deterministic: bool = False,
    cudnn_enabled: bool = True,
    allow_tf32: bool = True,
) -> Value:
    """_convolution(Tensor input, Tensor weight, Tensor? bias, SymInt[] stride, SymInt[] padding,
    SymInt[] dilation, bool transposed, SymInt[] output_padding, SymInt groups, bool benchmark,
    bool deterministic, bool cudnn_enabled, bool allow_tf32) -> Tensor"""
    return _conv(b, x, w, bias, stride, padding, dilation, groups, transposed, output_padding)


@rule("aten::convolution")
def convolution(
    b: Builder,
    x: Value,
    w: Value,
    bias: Value | None,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    transposed: bool,
    output_padding: Sequence[int],
    groups: int,
) -> Value:
    """convolution(Tensor input, Tensor weight, Tensor? bias, SymInt[] stride, SymInt[] padding,
    SymInt[] dilation, bool transposed, SymInt[] output_padding, SymInt groups) -> Tensor"""
    return _conv(b, x, w, bias, stride, padding, dilation, groups, transposed, output_padding)


@rule("aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::_convolution_mode")
def conv(
    b: Builder,
    x: Value,
    w: Value,
    bias: Value | None,
    stride: Sequence[int],
    padding: Sequence[int] | str,
    dilation: Sequence[int],
    groups: int,
) -> Value:
    """conv2d(Tensor input, Tensor weight, Tensor? bias=None, SymInt[2] stride=1,
    SymInt[2] padding=0 | str padding="valid", SymInt[2] dilation=1, SymInt groups=1) -> Tensor"""
    return _conv(b, x, w, bias, stride, padding, dilation, groups)


@rule("aten::conv_transpose1d", "aten::conv_transpose2d", "aten::conv_transpose3d")
def conv_transpose(
    b: Builder,
    x: Value,
    w: Value,
    bias: Value | None,
    stride: Sequence[int],
    padding: Sequence[int],
    output_padding: Sequence[int],
    groups: int,
    dilation: Sequence[int],
) -> Value:
    """conv_transpose2d.input(Tensor input, Tensor weight, Tensor? bias=None, SymInt[2] stride=1,
    SymInt[2] padding=0, SymInt[2] output_padding=0, SymInt groups=1, SymInt[2] dilation=1)"""
    return _conv(b, x, w, bias, stride, padding, dilation, groups, True, output_padding)


# ---- padding ---------------------------------------------------------------------------


def pad_pairs(pad: Sequence[int], rank: int) -> Pairs:
    """torch's flat ``(last_lo, last_hi, prev_lo, prev_hi, ...)`` as NNEF pairs for every dim."""
    if len(pad) % 2 or len(pad) // 2 > rank:
        raise LoweringError(f"pad: expected an even number of at most {2 * rank} entries, got {list(pad)}")
    pairs: Pairs = [(0, 0)] * rank
    for i in range(len(pad) // 2):
        pairs[rank - 1 - i] = (_amount(pad[2 * i]), _amount(pad[2 * i + 1]))
    return pairs


def _amount(p: Dim) -> Dim:
    return p if isinstance(p, SymDim) else int(p)


@rule("aten::pad")
def pad(
    b: Builder, x: Value, pad: Sequence[int], mode: str = "constant", value: float | None = None
) -> Value:
    """pad(Tensor self, SymInt[] pad, str mode="constant", float? value=None) -> Tensor"""
    pairs = pad_pairs(pad, x.rank)
    if mode == "circular":
        return _circular(b, x, pairs)
    if mode not in _BORDER:
        raise LoweringError(f"pad: mode must be constant, reflect, replicate or circular, got {mode!r}")
    return _pad(b, x, pairs, mode, value or 0.0)


@rule("aten::constant_pad_nd")
def constant_pad_nd(b: Builder, x: Value, pad: Sequence[int], value: float = 0.0) -> Value:
    """constant_pad_nd(Tensor self, SymInt[] pad, Scalar value=0) -> Tensor"""
    return _pad(b, x, pad_pairs(pad, x.rank), "constant", value)


@rule("aten::reflection_pad1d", "aten::reflection_pad2d", "aten::reflection_pad3d")
def reflection_pad(b: Builder, x: Value, padding: Sequence[int]) -> Value:
    """reflection_pad2d(Tensor self, SymInt[4] padding) -> Tensor"""
    return _pad(b, x, pad_pairs(padding, x.rank), "reflect", 0.0)


@rule("aten::replication_pad1d", "aten::replication_pad2d", "aten::replication_pad3d")
def replication_pad(b: Builder, x: Value, padding: Sequence[int]) -> Value:
    """replication_pad2d(Tensor self, SymInt[4] padding) -> Tensor"""
    return _pad(b, x, pad_pairs(padding, x.rank), "replicate", 0.0)


@rule("aten::_pad_circular")
def pad_circular(b: Builder, x: Value, pad: Sequence[int]) -> Value:
    """_pad_circular(Tensor self, SymInt[] pad) -> Tensor"""
    return _circular(b, x, pad_pairs(pad, x.rank))


def _pad(b: Builder, x: Value, pairs: Pairs, mode: str, value: float) -> Value:
    """NNEF pad for the positive part; negative entries (constant mode) crop with a slice."""
    if any(isinstance(p, SymDim) for pair in pairs for p in pair):
        return _pad_by_symbols(b, x, pairs, mode, value)
    if any(p < 0 for pair in pairs for p in pair):
        if mode != "constant":
            raise LoweringError(f"pad: negative padding is only supported in constant mode, got {pairs}")
        crop = [(max(-lo, 0), max(-hi, 0)) for lo, hi in pairs]
        x = _crop(b, x, crop)
        pairs = [(max(lo, 0), max(hi, 0)) for lo, hi in pairs]
    if not any(p for pair in pairs for p in pair):
        return x
    shape = tuple(d + lo + hi for d, (lo, hi) in zip(shape_of(x), pairs, strict=True))
    attrs = {"padding": pairs, "border": _BORDER[mode], "value": float(value)}
    return b.call("pad", [x], attrs, dtype=x.dtype, shape=shape)


def _pad_by_symbols(b: Builder, x: Value, pairs: Pairs, mode: str, value: float) -> Value:
    """Padding by a size expression (``F.pad(x, (0, (4 - T % 4) % 4))``, EnCodec's padding to a
    multiple): tract's ``pad`` takes integers only, so the filled parts are concatenated."""
    for axis, (lo, hi) in enumerate(pairs):
        for amount in (lo, hi):
            low = at_least(amount.expr) if isinstance(amount, SymDim) else amount
            if mode != "constant" or low is None or low < 0:
                raise LoweringError(
                    f"pad: padding axis {axis} by {amount} needs mode 'constant' and an amount that is"
                    f" never negative (mode {mode!r}); make that axis static"
                )
    static = [(p if isinstance(p, int) else 0 for p in pair) for pair in pairs]
    x = _pad(b, x, [tuple(p) for p in static], mode, value)  # type: ignore[misc]
    for axis, (lo, hi) in enumerate(pairs):
        parts = [x]
        for amount, at in ((lo, 0), (hi, 1)):
            if isinstance(amount, SymDim):
                shape = list(shape_of(x))
                shape[axis] = amount
                parts.insert(at * len(parts), filled(b, value, shape, x.dtype))
        if len(parts) > 1:
            x = concat(b, parts, axis)
    return x


def _slice(b: Builder, x: Value, axis: int, begin: int, end: int) -> Value:
    shape = list(shape_of(x))
    shape[axis] = end - begin
    attrs = {"axes": [axis], "begin": [begin], "end": [end]}
    return b.call("slice", [x], attrs, dtype=x.dtype, shape=tuple(shape))


def _static(x: Value, axis: int, what: str) -> int:
    size = shape_of(x)[axis]
    if not isinstance(size, int):
        raise LoweringError(f"{what} along a dynamic dim ({size}) is not supported")
    return size


def _crop(b: Builder, x: Value, crop: Pairs) -> Value:
    """Negative padding: a slice, whose end is a size expression on a dynamic dim (``S - 2``)."""
    for axis, (lo, hi) in enumerate(crop):
        if lo or hi:
            x = _slice(b, x, axis, lo, shape_of(x)[axis] - hi)
    return x


def _circular(b: Builder, x: Value, pairs: Pairs) -> Value:
    """Wrap around: [x[-lo:], x, x[:hi]] along each padded dim."""
    for axis, (lo, hi) in enumerate(pairs):
        if lo < 0 or hi < 0:
            raise LoweringError(f"pad: circular padding must be non-negative, got {pairs}")
        if not (lo or hi):
            continue
        size = _static(x, axis, "circular padding")
        if lo > size or hi > size:
            raise LoweringError(f"pad: circular padding {lo, hi} exceeds the size {size} of dim {axis}")
        parts = ([_slice(b, x, axis, size - lo, size)] if lo else []) + [x]
        parts += [_slice(b, x, axis, 0, hi)] if hi else []
        shape = list(shape_of(x))
        shape[axis] = size + lo + hi
        x = b.call("concat", [parts], {"axis": axis}, dtype=x.dtype, shape=tuple(shape))
    return x
