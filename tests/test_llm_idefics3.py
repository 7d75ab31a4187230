"""Idefics3 and SmolVLM end to end (issue 31, item 2, the second VLM): the vision archive holds
the SigLIP-like tower and the pixel-shuffle connector for one tile; ``torchlower.llm.generate``
with the tiles of two images gives HF ``generate``'s greedy tokens (HF takes them as
``pixel_values`` [1, tiles, 3, H, W]).
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Any

import pytest
import torch

from tests import vlm_models

pytest.importorskip("transformers")
from torchlower import llm


@pytest.mark.parametrize(
    "kind", [pytest.param("Idefics3", marks=pytest.mark.xdist_group("idefics3")), "SmolVLM"]
)
def test_tokens_equal_hf_with_two_tiles(tmp_path: Path, kind: str, exports: Any) -> None:
    """Idefics3: the session's export (tests/archive_exports.py); SmolVLM its own."""
    if kind == "Idefics3":
        (folder, model), report = exports.folder("idefics3"), exports.exported("idefics3")
    else:
        folder, model = vlm_models.idefics3_folder(tmp_path / "hf", kind=kind)
        report = llm.export(folder, tmp_path / "tract")
    assert report.tokens == report.reference_tokens and report.logit_error < 1e-3
    manifest = json.loads((report.path / "manifest.json").read_text())
    assert manifest["model_type"] == kind.lower() and manifest["media"]["tokens_per_item"] == 16
    assert manifest["vision"]["inputs"] == {"pixel_values": [1, 3, 32, 32]}
    ids = vlm_models.prompt(model, images=2, seed=2)
    pixels = vlm_models.pixels(model, seed=12, images=2)
    with torch.no_grad():
        out = model.generate(
            input_ids=ids, pixel_values=pixels[None], max_new_tokens=32, min_new_tokens=32, do_sample=False
        )
    want = out[0, ids.shape[1] :].tolist()
    assert llm.generate(report.path, ids, 32, pixel_values=pixels) == want and len(set(want)) > 3


def _members(archive: Path) -> dict[str, bytes]:
    """An archive's members but its bundled sample (``io/``, which an unchecked export without
    ``io_samples`` does not write)."""
    with tarfile.open(archive) as tar:
        return {
            m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile() and "io/" not in m.name
        }


@pytest.mark.xdist_group("idefics3")
def test_unchecked_export_streams_the_checked_bytes(exports: Any, tmp_path: Path) -> None:
    """Unchecked, no module with weights runs in PyTorch on real tensors (shapes come from fake
    ones; the rotary tables are computed) and the weights view the memory-mapped checkpoint
    (``llm/stream.py``); the archives hold the checked export's graphs and tensors, byte for byte."""
    from torch._subclasses.fake_tensor import FakeTensor

    from torchlower.llm import source, vlm_families

    (folder, _), checked = exports.folder("idefics3"), exports.exported("idefics3")
    assert source.open_named(folder, vlm_families.ARCHITECTURES, mapped=True)[2] is not None
    real_calls: list[str] = []

    def count(module: torch.nn.Module, args: tuple[object, ...]) -> None:
        real = [a for a in args if isinstance(a, torch.Tensor) and not isinstance(a, FakeTensor)]
        if any(not a.is_meta for a in real) and next(module.parameters(), None) is not None:
            real_calls.append(type(module).__name__)

    hook = torch.nn.modules.module.register_module_forward_pre_hook(count)
    try:
        unchecked = llm.export(folder, tmp_path / "unchecked", check=False)
    finally:
        hook.remove()
    assert real_calls == []
    names = sorted(p.name for p in checked.path.iterdir())
    assert names == sorted(p.name for p in unchecked.path.iterdir()) and len(names) == 4
    for name in names:
        if name.endswith(".tgz"):
            got, want = _members(unchecked.path / name), _members(checked.path / name)
            assert got == want and any(n.endswith(".dat") for n in got), name
        else:
            assert (checked.path / name).read_bytes() == (unchecked.path / name).read_bytes(), name
    for part in ("embed", "encoder", "decoder"):  # the report's outputs come from the graph unchecked
        assert getattr(unchecked, part).outputs == getattr(checked, part).outputs, part
