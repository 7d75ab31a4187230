"""The typed refusal of positions past an archive's context bound (shared by both runners)."""

from __future__ import annotations

from torchlower.errors import InvalidArgumentError


class ContextLengthError(InvalidArgumentError):
    """More positions than the archive holds (its ``P + S <= max_context`` bound, which comes
    from the model's position tables): refused before tract, which would read past them."""

    def __init__(self, message: str, *, max_context: int, needed: int) -> None:
        super().__init__(message)
        self.max_context, self.needed = max_context, needed
