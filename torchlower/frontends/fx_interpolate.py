"""``F.interpolate`` under the FX front end when its input or output size is symbolic.

FX cannot see into ``F.interpolate``; the front end lowers such calls through torch.export,
which receives the output size as the capture's integers (``size=skip.shape[2:]`` of a skip
connection with its own symbols), baking them, and takes only symbols and their multiples as
input sizes (an FPN level after two strided convs is ``(H + 3)/4``: refused). With a symbolic
input or size the call goes straight to the ATen resampling rule instead, with the arguments
torch.export and jit record (``upsample_nearest2d.vec(x, None, [2.0, 2.0])`` for a scale factor).
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
    """``(aten key, rule arguments)`` of an ``F.interpolate`` call over symbolic sizes, else None.

    None (torch.export lowers it) when nothing is symbolic, for ``area`` (adaptive pooling),
    ``antialias`` and ``recompute_scale_factor`` (torch computes the size in Python then).
    """
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
        or x.shape is None
        or a["antialias"]
        or a["recompute_scale_factor"]
        or a["mode"] not in _OPS
        or (size is None) == (scale is None)
    ):
        return None
    spatial = x.rank - 2
    sizes = None if size is None else (list(size) if isinstance(size, (list, tuple)) else [size] * spatial)
    scales = (
        None
        if scale is None
        else [float(s) for s in (scale if isinstance(scale, (list, tuple)) else [scale] * spatial)]
    )
    moving = any(isinstance(d, SymDim) for d in x.shape[2:])
    if not moving and not any(isinstance(s, SymDim) for s in sizes or ()):
        return None
    op = "aten::" + _OPS[a["mode"]].format(n=spatial) + ".vec"
    if a["mode"] in ("nearest", "nearest-exact"):
        return op, [x, sizes, scales if sizes is None else None]
    return op, [x, sizes, bool(a["align_corners"]), scales if sizes is None else None]
