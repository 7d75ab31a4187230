"""The lowest size PyTorch runs a model at, consulted only where a size ``min``/``max`` is not
decided over every positive size.

A Conformer's relative-position shift slices ``[:, :, 1:]`` of a length ``2·floor((T + 240)/320) - 2``:
the clamp ``min(1, that)`` is 1 only from T = 400, which is also where PyTorch starts to run (its
last conv kernel is larger than the input below). tract cannot equate sizes holding such a
``min``, so the lowering decides it over the sizes the model runs at, and the symbol's lower bound
is then adopted: declared in the archive (``tract_assert T >= 400``), checked at the bound and said
in the report (``pipeline/capture.adopt_floors``). Lazy: the model is probed only when a decision
needs it, so exports that never meet such a ``min`` run nothing more.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field


@dataclass
class Floors:
    """Lowest sizes per symbol, found on demand; ``used`` records the decisions that needed one."""

    find: Callable[[str], int | None]  # symbol -> lowest size PyTorch runs at (None: unknown)
    known: dict[str, int | None] = field(default_factory=dict)
    used: dict[str, str] = field(default_factory=dict)  # symbol -> an expression it decided

    def of(self, symbol: str) -> int | None:
        if symbol not in self.known:
            self.known[symbol] = self.find(symbol)
        return self.known[symbol]


_CURRENT: ContextVar[Floors | None] = ContextVar("torchlower_size_floors", default=None)


@contextmanager
def floors_in_force(find: Callable[[str], int | None]) -> Iterator[Floors]:
    """Within the block, undecided size extrema may be decided from ``find``'s lower bounds."""
    floors = Floors(find)
    token = _CURRENT.set(floors)
    try:
        yield floors
    finally:
        _CURRENT.reset(token)


def current() -> Floors | None:
    return _CURRENT.get()
