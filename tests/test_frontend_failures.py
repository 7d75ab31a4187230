"""No raw exception from any front end (issue 30, item 3).

A front end that meets something it cannot handle raises a typed error naming the front end
and the culprit; ``auto`` records it and tries the next. The model below runs eagerly and
raises a foreign exception (not torchlower's, not torch.export's own) inside each front end:
under ``torch.jit.trace``, with FX proxies and under torch.export's fake tensors.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import torchlower
from torchlower.errors import TorchlowerError, TraceError


class Picky(nn.Module):
    """Refuses, with a different foreign exception, each way of being captured."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.jit.is_tracing():
            raise KeyError("no tracing here")
        if isinstance(x, torch.fx.Proxy):
            raise AttributeError("no proxies here")
        if torch.compiler.is_compiling() or type(x) is not torch.Tensor:
            raise ZeroDivisionError("no fake tensors here")
        return x * 2


@pytest.mark.parametrize(
    ("frontend", "foreign"), [("jit", "KeyError"), ("fx", "AttributeError"), ("export", "ZeroDivisionError")]
)
def test_each_front_end_turns_a_foreign_exception_into_a_typed_one(
    frontend: str, foreign: str, tmp_path: Path
) -> None:
    path = tmp_path / "m.nnef.tgz"
    with pytest.raises(TorchlowerError) as caught:
        torchlower.export(Picky(), torch.randn(2, 3), path, frontend=frontend)
    text = str(caught.value)
    assert isinstance(caught.value, TraceError), type(caught.value)
    assert foreign in text and "test_frontend_failures.py:" in text, text  # the exception and the line
    assert frontend in text.lower(), text  # the front end that failed
    assert not path.exists()


def test_auto_records_every_front_end_and_raises_a_typed_error(tmp_path: Path) -> None:
    path = tmp_path / "m.nnef.tgz"
    with pytest.raises(TorchlowerError) as caught:
        torchlower.export(Picky(), torch.randn(2, 3), path)
    notes = "\n".join(getattr(caught.value, "__notes__", []))
    everything = str(caught.value) + "\n" + notes
    for frontend, foreign in (("jit", "KeyError"), ("fx", "AttributeError"), ("export", "ZeroDivisionError")):
        assert foreign in everything, (frontend, everything)
    skipped = [n.split()[0] for n in getattr(caught.value, "__notes__", []) if "front end skipped" in n]
    assert len(skipped) >= 2, notes  # the raised error is one front end's, the notes the others'
    assert not path.exists()
