"""ATen operators by their schema names, for front ends that call torch on constant operands."""

from __future__ import annotations

from typing import Any

import torch


def overload(op: str) -> Any:
    """``"aten::add.Tensor"`` → ``torch.ops.aten.add.Tensor`` (``.default`` when none is named)."""
    name, overload_name = ([*op.split("::", 1)[1].split("."), "default"])[:2]
    return getattr(getattr(torch.ops.aten, name), overload_name)
