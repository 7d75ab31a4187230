"""The main job of ``make demo``: export a small image classifier, verify it in tract, report.

Run with ``python -m torchlower.cli.demo`` (or ``torchlower demo``).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch
from torch import nn


def image_classifier(num_classes: int = 10) -> nn.Module:
    """A small CNN with every layer family of a classic classifier (conv/bn/relu/pool/linear)."""

    def block(cin: int, cout: int) -> nn.Sequential:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())

    return nn.Sequential(
        block(3, 16),
        nn.MaxPool2d(2),
        block(16, 32),
        nn.MaxPool2d(2),
        block(32, 64),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, num_classes),
    )


def main(out: str | None = None) -> int:
    from rich.console import Console
    from rich.table import Table

    import torchlower

    torch.manual_seed(0)
    model = image_classifier().eval()
    for m in model.modules():  # non-trivial batch-norm statistics make the check meaningful
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    x = torch.randn(1, 3, 32, 32)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(out) if out else Path(tmp) / "classifier.nnef.tgz"
        report = torchlower.export(model, x, path, input_names=["image"], output_names=["logits"])
        size = path.stat().st_size
    console = Console()
    table = Table(title="torchlower demo: image classifier → NNEF → tract")
    table.add_column("item")
    table.add_column("value")
    for t in report.inputs:
        table.add_row(f"input {t.name}", f"{list(t.shape)} {t.dtype}")
    for t in report.outputs:
        table.add_row(f"output {t.name}", f"{list(t.shape)} {t.dtype}")
    ops = ", ".join(f"{op}×{n}" for op, n in sorted(report.op_histogram.items()))
    table.add_row("ops", ops)
    table.add_row("weight bytes", f"{report.weight_bytes:,}")
    table.add_row("archive bytes", f"{size:,}")
    table.add_row("front end", report.frontend)
    for e in report.errors:
        table.add_row(f"max |torch − tract| {e.name}", f"{e.max_abs:.3g} (rel {e.max_rel:.3g})")
    console.print(table)
    ok = report.max_abs_error <= 1e-5
    console.print("[green]verified: max error ≤ 1e-5[/green]" if ok else "[red]error above 1e-5[/red]")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else None))
