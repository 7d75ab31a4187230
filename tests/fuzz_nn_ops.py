"""Argument drawers and callables of the fuzz catalogue's linear-algebra, conv, pool and norm ops."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from hypothesis import strategies as st

from tests.fuzz_spec import Args, Draw, Spec, broadcast_shape, weight


# ---- linear algebra, conv, pool, norms ---------------------------------------------------------
def _linear_args(d: Draw, x: Spec) -> Args:
    n_out = d(st.integers(1, 6))
    bias = (weight(d, n_out),) if d(st.booleans()) else ()
    return Args(weights=(weight(d, n_out, x.shape[-1], scale=0.5), *bias))


def _linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    return F.linear(x, w, b)


def _matmul_args(d: Draw, x: Spec) -> Args:
    n = d(st.integers(1, 5))
    batch = x.shape[:-2] if x.rank > 2 and d(st.booleans()) else ()
    batch = broadcast_shape(d, batch) if batch else ()
    return Args(others=(((*batch, x.shape[-1], n), torch.float32),))


def _spatial(x: Spec) -> int:
    return x.rank - 2


def _conv_args(d: Draw, x: Spec) -> Args | None:
    if x.rank not in (3, 4):
        return None
    cin, size = x.shape[1], x.shape[2:]
    groups = d(st.sampled_from([g for g in (1, 2, 3) if cin % g == 0]))
    cout = groups * d(st.integers(1, 3))
    k = [d(st.integers(1, 3)) for _ in size]
    dil = [d(st.integers(1, 2)) for _ in size]
    stride = [d(st.integers(1, 3)) for _ in size]
    pad = d(st.sampled_from(["int", "same", "valid"]))
    ints = [d(st.integers(0, (kk - 1) * dd)) for kk, dd in zip(k, dil, strict=True)]
    padding: Any = ints if pad == "int" else pad
    if pad == "same":
        stride = [1] * len(size)
    bias = (weight(d, cout),) if d(st.booleans()) else ()
    params = {"stride": stride, "padding": padding, "dilation": dil, "groups": groups}
    return Args(params, weights=(weight(d, cout, cin // groups, *k, scale=0.5), *bias))


def _conv(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None, **p: Any) -> torch.Tensor:
    return (F.conv1d if x.dim() == 3 else F.conv2d)(x, w, b, **p)


def _conv_t_args(d: Draw, x: Spec) -> Args | None:
    if x.rank not in (3, 4):
        return None
    cin, size = x.shape[1], x.shape[2:]
    groups = d(st.sampled_from([g for g in (1, 2) if cin % g == 0]))
    cout_g = d(st.integers(1, 3))
    k = [d(st.integers(1, 3)) for _ in size]
    stride = [d(st.integers(1, 3)) for _ in size]
    dil = [d(st.integers(1, 2)) for _ in size]
    pad = [d(st.integers(0, (kk - 1) * dd)) for kk, dd in zip(k, dil, strict=True)]
    out_pad = [d(st.integers(0, max(s, dd) - 1)) for s, dd in zip(stride, dil, strict=True)]
    bias = (weight(d, cout_g * groups),) if d(st.booleans()) else ()
    params = {"stride": stride, "padding": pad, "output_padding": out_pad, "groups": groups, "dilation": dil}
    return Args(params, weights=(weight(d, cin, cout_g, *k, scale=0.5), *bias))


def _conv_t(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None, **p: Any) -> torch.Tensor:
    return (F.conv_transpose1d if x.dim() == 3 else F.conv_transpose2d)(x, w, b, **p)


def _pool_args(d: Draw, x: Spec) -> Args | None:
    if x.rank not in (3, 4):
        return None
    k = [d(st.integers(1, min(3, n))) for n in x.shape[2:]]
    stride = [d(st.integers(1, 3)) for _ in k]
    pad = [d(st.integers(0, kk // 2)) for kk in k]
    return Args({"kernel_size": k, "stride": stride, "padding": pad, "ceil_mode": d(st.booleans())})


def _max_pool(x: torch.Tensor, **p: Any) -> torch.Tensor:
    return (F.max_pool1d if x.dim() == 3 else F.max_pool2d)(x, **p)


def _avg_pool_args(d: Draw, x: Spec) -> Args | None:
    a = _pool_args(d, x)
    return a and Args({**a.params, "count_include_pad": d(st.booleans())})


def _avg_pool(x: torch.Tensor, **p: Any) -> torch.Tensor:
    return (F.avg_pool1d if x.dim() == 3 else F.avg_pool2d)(x, **p)


def _adaptive_args(d: Draw, x: Spec) -> Args | None:
    return (
        Args({"output_size": [d(st.integers(1, n + 1)) for n in x.shape[2:]]}) if x.rank in (3, 4) else None
    )


def _adaptive_avg(x: torch.Tensor, output_size: list[int]) -> torch.Tensor:
    return (F.adaptive_avg_pool1d if x.dim() == 3 else F.adaptive_avg_pool2d)(x, output_size)


def _adaptive_max(x: torch.Tensor, output_size: list[int]) -> torch.Tensor:
    return (F.adaptive_max_pool1d if x.dim() == 3 else F.adaptive_max_pool2d)(x, output_size)


def _batch_norm_args(d: Draw, x: Spec) -> Args | None:
    if x.rank < 2:
        return None
    c = x.shape[1]
    stats = (weight(d, c), weight(d, c, positive=True))
    affine = (weight(d, c), weight(d, c)) if d(st.booleans()) else ()
    return Args({"eps": d(st.sampled_from([1e-5, 1e-3, 0.1]))}, weights=stats + affine)


def _batch_norm(
    x: torch.Tensor, m: torch.Tensor, v: torch.Tensor, *wb: torch.Tensor, eps: float
) -> torch.Tensor:
    return F.batch_norm(x, m, v, *wb, training=False, eps=eps)


def _layer_norm_args(d: Draw, x: Spec) -> Args:
    shape = list(x.shape[x.rank - d(st.integers(1, x.rank)) :])
    affine = (weight(d, *shape), weight(d, *shape)) if d(st.booleans()) else ()
    return Args({"shape": shape, "eps": d(st.sampled_from([1e-5, 0.1]))}, weights=affine)


def _layer_norm(x: torch.Tensor, *wb: torch.Tensor, shape: list[int], eps: float) -> torch.Tensor:
    return F.layer_norm(x, shape, *wb, eps=eps)


def _group_norm_args(d: Draw, x: Spec) -> Args | None:
    if x.rank < 2:
        return None
    c = x.shape[1]
    groups = d(st.sampled_from([g for g in range(1, c + 1) if c % g == 0]))
    affine = (weight(d, c), weight(d, c)) if d(st.booleans()) else ()
    return Args({"groups": groups}, weights=affine)


def _group_norm(x: torch.Tensor, *wb: torch.Tensor, groups: int) -> torch.Tensor:
    return F.group_norm(x, groups, *wb)
