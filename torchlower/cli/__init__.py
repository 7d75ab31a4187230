"""The ``torchlower`` command line (console script and ``python -m torchlower``)."""

from __future__ import annotations

from torchlower.cli.main import main

__all__ = ["main"]
