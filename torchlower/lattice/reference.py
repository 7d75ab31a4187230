"""Brute-force sparse semantics, written from the IR definitions and independent of the fast
path (no hashing, no kernel maps): voxels live in a ``dict`` from ``(b, x, y, z)`` to a feature
row, and every op loops over voxels and kernel offsets in plain Python. Slow and obvious on
purpose — it is what the artifact and the modules are checked against.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

Key = tuple[int, int, int, int]


@dataclass
class Ref:
    """A sparse value: ``voxels[(b, x, y, z)] = feature row``, physical coords, ``stride``."""

    voxels: dict[Key, torch.Tensor]
    stride: tuple[int, int, int]
    channels: int
    history: dict[tuple[int, int, int], list[Key]]  # supports seen, for transposed convs

    @staticmethod
    def of(
        coords: torch.Tensor, feats: torch.Tensor, stride: tuple[int, int, int], history: dict | None = None
    ) -> Ref:
        voxels = {tuple(int(v) for v in c): f for c, f in zip(coords.tolist(), feats, strict=True)}
        hist = dict(history or {})
        hist[stride] = list(voxels)
        return Ref(voxels, stride, int(feats.shape[1]), hist)  # type: ignore[arg-type]

    def derive(self, voxels: dict[Key, torch.Tensor], stride: tuple[int, int, int], channels: int) -> Ref:
        hist = dict(self.history)
        hist.setdefault(stride, list(voxels))
        return Ref(voxels, stride, channels, hist)

    def sorted(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Coordinates and features in (batch, x, y, z) order."""
        keys = sorted(self.voxels)
        coords = torch.tensor(keys, dtype=torch.int32).reshape(-1, 4)
        feats = torch.stack([self.voxels[k] for k in keys]) if keys else torch.zeros(0, self.channels)
        return coords, feats


def offsets(kernel: tuple[int, int, int]) -> list[tuple[int, int, int]]:
    return list(itertools.product(*(range(k) for k in kernel)))


def conv_weight(weight: torch.Tensor, k: int) -> torch.Tensor:
    """The ``[O, I]`` matrix of kernel position ``k`` (x-major, z fastest)."""
    return weight.reshape(weight.shape[0], -1, weight.shape[-1])[:, k, :]


def subm_conv(x: Ref, weight: torch.Tensor, bias: torch.Tensor | None, kernel, dilation) -> Ref:
    out = {}
    center = [(k - 1) // 2 for k in kernel]
    for key in x.voxels:
        acc = torch.zeros(weight.shape[0], dtype=torch.float64)
        for k, off in enumerate(offsets(kernel)):
            n = (key[0], *(key[i + 1] + (off[i] - center[i]) * dilation[i] * x.stride[i] for i in range(3)))
            if n in x.voxels:
                acc += conv_weight(weight, k).double() @ x.voxels[n].double()
        out[key] = finish(acc, bias)
    return x.derive(out, x.stride, weight.shape[0])


def finish(acc: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return (acc + bias.double() if bias is not None else acc).float()


def strided_pairs(x: Ref, kernel, stride, padding, dilation):
    """(output key, kernel index, input key) for ``o·s = c + p − k·d``, in logical units."""
    out_stride = tuple(x.stride[i] * stride[i] for i in range(3))
    pairs = []
    for key in x.voxels:
        c = [key[i + 1] // x.stride[i] for i in range(3)]
        for k, off in enumerate(offsets(kernel)):
            num = [c[i] + padding[i] - off[i] * dilation[i] for i in range(3)]
            if all(num[i] % stride[i] == 0 for i in range(3)):
                o = (key[0], *(num[i] // stride[i] * out_stride[i] for i in range(3)))
                pairs.append((o, k, key))
    return out_stride, pairs


def conv(x: Ref, weight, bias, kernel, stride, padding, dilation) -> Ref:
    out_stride, pairs = strided_pairs(x, kernel, stride, padding, dilation)
    acc: dict[Key, torch.Tensor] = {}
    for o, k, i in pairs:
        acc.setdefault(o, torch.zeros(weight.shape[0], dtype=torch.float64))
        acc[o] += conv_weight(weight, k).double() @ x.voxels[i].double()
    return x.derive({o: finish(a, bias) for o, a in acc.items()}, out_stride, weight.shape[0])


def conv_transpose(x: Ref, weight, bias, kernel, stride, padding, dilation) -> Ref:
    """Onto the recorded support at stride ``S / s``: target c gets ``W[k]·x[o]`` when
    ``o·s = c + p − k·d``."""
    out_stride = tuple(x.stride[i] // stride[i] for i in range(3))
    out = {}
    for key in x.history[out_stride]:  # type: ignore[index]
        c = [key[i + 1] // out_stride[i] for i in range(3)]
        acc = torch.zeros(weight.shape[0], dtype=torch.float64)
        for k, off in enumerate(offsets(kernel)):
            num = [c[i] + padding[i] - off[i] * dilation[i] for i in range(3)]
            if all(num[i] % stride[i] == 0 for i in range(3)):
                o = (key[0], *(num[i] // stride[i] * x.stride[i] for i in range(3)))
                if o in x.voxels:
                    acc += conv_weight(weight, k).double() @ x.voxels[o].double()
        out[key] = finish(acc, bias)
    return x.derive(out, out_stride, weight.shape[0])  # type: ignore[arg-type]


def generative_conv_transpose(x: Ref, weight, bias, kernel, stride) -> Ref:
    out_stride = tuple(x.stride[i] // stride[i] for i in range(3))
    acc: dict[Key, torch.Tensor] = {}
    for key, f in x.voxels.items():
        for k, off in enumerate(offsets(kernel)):
            c = (
                key[0],
                *((key[i + 1] // x.stride[i] * stride[i] + off[i]) * out_stride[i] for i in range(3)),
            )
            acc.setdefault(c, torch.zeros(weight.shape[0], dtype=torch.float64))
            acc[c] += conv_weight(weight, k).double() @ f.double()
    return x.derive({c: finish(a, bias) for c, a in acc.items()}, out_stride, weight.shape[0])  # type: ignore[arg-type]


def pool(x: Ref, mode: str, kernel, stride, padding, dilation) -> Ref:
    out_stride, pairs = strided_pairs(x, kernel, stride, padding, dilation)
    seen: dict[Key, list[torch.Tensor]] = {}
    for o, _, i in pairs:
        seen.setdefault(o, []).append(x.voxels[i])
    reduce = {
        "max": lambda s: s.max(dim=0).values,
        "avg": lambda s: s.mean(dim=0),
        "sum": lambda s: s.sum(dim=0),
    }[mode]
    return x.derive({o: reduce(torch.stack(v)) for o, v in seen.items()}, out_stride, x.channels)


def global_pool(x: Ref, mode: str, batch_size: int) -> torch.Tensor:
    out = torch.zeros(batch_size, x.channels)
    for b in range(batch_size):
        rows = [f for k, f in x.voxels.items() if k[0] == b]
        if rows:
            s = torch.stack(rows)
            out[b] = s.mean(dim=0) if mode == "avg" else s.max(dim=0).values
    return out


JOIN_OPS = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "maximum": torch.maximum,
    "minimum": torch.minimum,
}


def join_keys(refs: list[Ref], join: str) -> list[Key]:
    sets = [set(r.voxels) for r in refs]
    if join == "left":
        return list(refs[0].voxels)
    if join == "right":
        return list(refs[-1].voxels)
    if join == "inner":
        return sorted(set.intersection(*sets))
    return sorted(set.union(*sets))


def binary(op: str, a: Ref, b: Ref, join: str, lhs_fill: float, rhs_fill: float) -> Ref:
    out = {}
    for key in join_keys([a, b], join):
        fa = a.voxels.get(key, torch.full((a.channels,), lhs_fill))
        fb = b.voxels.get(key, torch.full((b.channels,), rhs_fill))
        out[key] = JOIN_OPS[op](fa, fb)
    ref = a.derive(out, a.stride, a.channels)
    ref.history = {**b.history, **a.history, a.stride: list(out)}
    return ref


def cat(refs: list[Ref], join: str) -> Ref:
    out = {}
    for key in join_keys(refs, join):
        out[key] = torch.cat([r.voxels.get(key, torch.zeros(r.channels)) for r in refs])
    ref = refs[0].derive(out, refs[0].stride, sum(r.channels for r in refs))
    for r in refs[1:]:
        ref.history = {**r.history, **ref.history}
    return ref


def reindex(source: Ref, target: Ref, fill: float) -> Ref:
    out = {k: source.voxels.get(k, torch.full((source.channels,), fill)) for k in target.voxels}
    return target.derive(out, target.stride, source.channels)


def voxelize(points, feats, batch, active: int, voxel_size, origin, reduction: str) -> Ref:
    groups: dict[Key, list[torch.Tensor]] = {}
    for n in range(active):
        cell = tuple(math.floor((float(points[n, i]) - origin[i]) / voxel_size[i]) for i in range(3))
        groups.setdefault((int(batch[n]), *cell), []).append(feats[n])
    voxels = {
        k: (torch.stack(v).mean(0) if reduction == "mean" else torch.stack(v).sum(0))
        for k, v in groups.items()
    }
    return Ref(voxels, (1, 1, 1), int(feats.shape[1]), {(1, 1, 1): list(voxels)})


def devoxelize(points, x: Ref, batch, active: int, voxel_size, origin, interpolation: str) -> torch.Tensor:
    out = torch.zeros(points.shape[0], x.channels)
    for n in range(active):
        q = [(float(points[n, i]) - origin[i]) / voxel_size[i] / x.stride[i] for i in range(3)]
        b = int(batch[n])
        if interpolation == "nearest":
            key = (b, *(math.floor(q[i] + 0.5) * x.stride[i] for i in range(3)))
            if key in x.voxels:
                out[n] = x.voxels[key]
            continue
        acc = torch.zeros(x.channels, dtype=torch.float64)
        for corner in itertools.product((0, 1), repeat=3):
            w = 1.0
            for i in range(3):
                frac = q[i] - math.floor(q[i])
                w *= frac if corner[i] else 1 - frac
            key = (b, *((math.floor(q[i]) + corner[i]) * x.stride[i] for i in range(3)))
            if key in x.voxels:
                acc += w * x.voxels[key].double()
        out[n] = acc.float()
    return out
