"""``F.interpolate`` under the FX front end when its output size is symbolic.

FX cannot see into ``F.interpolate``; the front end lowers such calls through torch.export,
which receives the output size as the capture's integers (``size=skip.shape[2:]`` of a skip
connection with its own symbols), baking them. With a symbolic size the call goes straight to
the ATen resampling rule instead, the way torch.export and jit record it.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch.nn.functional as F

from torchlower.core.values import SymDim, Value

_OPS = {
    "nearest": "upsample_nearest{n}d",
    "nearest-exact": "_upsample_nearest_exact{n}d",
    "linear": "upsample_linear1d",
    "bilinear": "upsample_bilinear2d",
    "trilinear": "upsample_trilinear3d",
    "bicubic": "upsample_bicubic2d",
}
_SIGNATURE = inspect.signature(F.interpolate)


def symbolic_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, list[Any]] | None:
    """``(aten key, rule arguments)`` of an ``F.interpolate`` call whose size is symbolic, else None."""
    try:
        bound = _SIGNATURE.bind(*args, **kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    a = bound.arguments
    x, size, scale = a["input"], a["size"], a["scale_factor"]
    if (
        not isinstance(x, Value)
        or x.rank is None
        or x.rank < 3
        or a["antialias"]
        or a["recompute_scale_factor"]
    ):
        return None
    spatial = x.rank - 2
    sizes = (
        list(size) if isinstance(size, (list, tuple)) else ([size] * spatial if size is not None else None)
    )
    if sizes is None or not any(isinstance(s, SymDim) for s in sizes) or a["mode"] not in _OPS:
        return None
    scales = (
        None
        if scale is None
        else [float(s) for s in (scale if isinstance(scale, (list, tuple)) else [scale] * spatial)]
    )
    op = "aten::" + _OPS[a["mode"]].format(n=spatial) + ".vec"
    if a["mode"] in ("nearest", "nearest-exact"):
        return op, [x, sizes, scales]
    return op, [x, sizes, bool(a["align_corners"]), scales]
