"""Brute-force semantics of the target / normalized convs, pool transpose and trilinear upsample,
written from the IR definitions like ``reference.py`` (dicts of voxels, loops over offsets).

Logical coordinates ``c = C / S``. A target conv writes onto the target's voxels: target ``o``
reads input ``c = o·s − p + k·d``; a target transposed conv: target ``c`` reads input ``o`` with
``o·s = c + p − k·d``. A generated transposed support is every ``o·s − p + k·d``.
"""

from __future__ import annotations

import torch

from torchlower.lattice.reference import Key, Ref, conv_weight, finish, offsets


def _onto(
    x: Ref, voxels: dict[Key, torch.Tensor], stride: tuple[int, int, int], channels: int, *others: Ref
) -> Ref:
    ref = x.derive(voxels, stride, channels)
    for other in others:
        ref.history = {**other.history, **ref.history}
    ref.history[stride] = list(voxels)
    return ref


def _logical(key: Key, stride: tuple[int, int, int]) -> list[int]:
    return [key[i + 1] // stride[i] for i in range(3)]


def _phys(batch: int, logical: list[int], stride: tuple[int, int, int]) -> Key:
    return (batch, *(logical[i] * stride[i] for i in range(3)))  # type: ignore[return-value]


def target_conv(x: Ref, target: Ref, weight, bias, kernel, stride, padding, dilation) -> Ref:
    out = {}
    for key in target.voxels:
        o = _logical(key, target.stride)
        acc = torch.zeros(weight.shape[0], dtype=torch.float64)
        for k, off in enumerate(offsets(kernel)):
            c = _phys(
                key[0], [o[i] * stride[i] - padding[i] + off[i] * dilation[i] for i in range(3)], x.stride
            )
            if c in x.voxels:
                acc += conv_weight(weight, k).double() @ x.voxels[c].double()
        out[key] = finish(acc, bias)
    return _onto(x, out, target.stride, weight.shape[0], target)


def _transposed_inputs(x: Ref, key: Key, out_stride, kernel, stride, padding, dilation):
    """``(k, input key)`` for every offset of target ``key`` whose input voxel exists."""
    c = _logical(key, out_stride)
    for k, off in enumerate(offsets(kernel)):
        num = [c[i] + padding[i] - off[i] * dilation[i] for i in range(3)]
        if all(num[i] % stride[i] == 0 for i in range(3)):
            o = _phys(key[0], [num[i] // stride[i] for i in range(3)], x.stride)
            if o in x.voxels:
                yield k, o


def target_conv_transpose(x: Ref, target: Ref, weight, bias, kernel, stride, padding, dilation) -> Ref:
    out = {}
    for key in target.voxels:
        acc = torch.zeros(weight.shape[0], dtype=torch.float64)
        for k, o in _transposed_inputs(x, key, target.stride, kernel, stride, padding, dilation):
            acc += conv_weight(weight, k).double() @ x.voxels[o].double()
        out[key] = finish(acc, bias)
    return _onto(x, out, target.stride, weight.shape[0], target)


def normalized(run, x: Ref, weight, bias, eps: float, pointwise: bool) -> Ref:
    """``conv(x, W) / sqrt(conv(1, W²) + eps) + b`` from two runs of the plain conv ``run(ref, W, b)``;
    pointwise geometry is the plain conv."""
    if pointwise:
        return run(x, weight, bias)
    num = run(x, weight, None)
    ones = Ref({k: torch.ones(x.channels) for k in x.voxels}, x.stride, x.channels, dict(x.history))
    den = run(ones, weight * weight, None)
    num.voxels = {
        key: finish(n.double() / torch.sqrt(den.voxels[key].double() + eps), bias)
        for key, n in num.voxels.items()
    }
    return num


def generated_keys(x: Ref, kernel, stride, padding, dilation) -> tuple[tuple[int, int, int], list[Key]]:
    out_stride = tuple(x.stride[i] // stride[i] for i in range(3))
    keys = set()
    for key in x.voxels:
        o = _logical(key, x.stride)
        for off in offsets(kernel):
            keys.add(
                _phys(
                    key[0],
                    [o[i] * stride[i] - padding[i] + off[i] * dilation[i] for i in range(3)],
                    out_stride,
                )
            )
    return out_stride, sorted(keys)  # type: ignore[return-value]


def _support(x: Ref, target: Ref | None, kernel, stride, padding, dilation):
    if target is not None:
        return target.stride, list(target.voxels)
    return generated_keys(x, kernel, stride, padding, dilation)


def pool_transpose(x: Ref, target: Ref | None, kernel, stride, padding, dilation) -> Ref:
    out_stride, keys = _support(x, target, kernel, stride, padding, dilation)
    out = {}
    for key in keys:
        rows = [
            x.voxels[o] for _, o in _transposed_inputs(x, key, out_stride, kernel, stride, padding, dilation)
        ]
        out[key] = torch.stack(rows).mean(dim=0) if rows else torch.zeros(x.channels)
    others = (target,) if target is not None else ()
    return _onto(x, out, out_stride, x.channels, *others)  # type: ignore[arg-type]


def trilinear_upsample(x: Ref, target: Ref | None, stride) -> Ref:
    kernel = [2 * s - 1 for s in stride]
    padding = [s - 1 for s in stride]
    out_stride, keys = _support(x, target, kernel, stride, padding, (1, 1, 1))
    tent = []
    for off in offsets(kernel):  # type: ignore[arg-type]
        w = 1.0
        for i in range(3):
            w *= 1 - abs(off[i] - (stride[i] - 1)) / stride[i]
        tent.append(w)
    out = {}
    for key in keys:
        acc, norm = torch.zeros(x.channels, dtype=torch.float64), 0.0
        for k, o in _transposed_inputs(x, key, out_stride, kernel, stride, padding, (1, 1, 1)):
            acc += tent[k] * x.voxels[o].double()
            norm += tent[k]
        out[key] = (acc / norm if norm > 0 else acc).float()
    others = (target,) if target is not None else ()
    return _onto(x, out, out_stride, x.channels, *others)  # type: ignore[arg-type]
