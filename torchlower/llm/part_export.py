"""One graph of a multi-archive LLM export (a speech encoder-decoder's encoder or decoder, a
multimodal LM's vision encoder, embedding or decoder): ``torchlower.export``'s stages with the
graph's bounds, properties and bundled files, checked against the part in PyTorch."""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from torchlower.core import tolerance as tolerances
from torchlower.errors import CheckError, InvalidArgumentError
from torchlower.llm import bundle
from torchlower.nnef import archive
from torchlower.pipeline import capture, optimize, reference, report, request, write
from torchlower.pipeline import check as checks

F16_TOLERANCE = 3e-2  # of the output scale (llm.exporter.F16_TOLERANCE)


def export_part(
    module: nn.Module, example: tuple[torch.Tensor, ...], target: Path, names_in: list[str],
    names_out: list[str], axes: dict[str, Any] | None, precision: str, compress: str | None,
    check: bool, extensions: list[str], props: dict[str, Any], files: dict[str, bytes],
    frontend: str = "export", rewrite: Callable[[Any], object] | None = None,
) -> tuple[report.ExportReport, dict[str, torch.Tensor] | None]:  # fmt: skip
    """``torchlower.export``'s stages, with the graph's bounds, properties and bundled files;
    ``rewrite(builder)`` runs after the pipeline's passes (e.g. ``precision.keep_f32``)."""
    req = request.request(
        module, example, target, input_names=names_in, output_names=names_out, frontend=frontend,
        check=check, tolerance=None, precision=precision, compress=compress, dynamic_axes=axes,
        dynamic_shapes=None, allow_value_dependent_trace=False,
    )  # fmt: skip
    ref = reference.run_reference(module, req, names_out)
    # torch itself in f16 is this far from f32 on these models (docs/llm.md), as the causal-LM check
    tolerance = (
        F16_TOLERANCE * tolerances.output_scale([t.numpy() for t in ref.expected])
        if precision == "f16"
        else None
    )
    captured = capture.capture(req, ref)
    builder = captured.builder
    dequantized = optimize.compress(builder, ref.module, compress)
    optimize.optimize(builder)
    if rewrite is not None:
        rewrite(builder)
    weights = builder.live_weights()
    builder.example_sizes = req.example_sizes
    graph = bundle.with_header(builder.graph_text(), extensions, bundle.properties_fragment(props))
    with write.staging(req.target, check) as staging:
        written = archive.write(staging, graph, weights, builder.quant_text(), files, huffman_only=True)
        result = report.export_report(written, req, ref, captured, weights)
        if check:
            outcome = checks.check_export(
                written, ref.module, req.example, ref.expected, ref.output_names, req.spec, tolerance,
                builder, dequantized, req.target,
            )  # fmt: skip
            report.record_check(result, outcome)
    result.path = req.target
    return result, dequantized


def folder_target(path: str | os.PathLike[str], what: str) -> Path:
    """The output folder of a multi-archive export (its parent must exist; no archive suffix)."""
    target = Path(path)
    if target.name.endswith(archive.ARCHIVE_SUFFIXES):
        raise InvalidArgumentError(
            f"{target}: {what} exports as a folder of archives and a manifest;"
            f" give a folder path (e.g. {target.name.split('.')[0]}_tract)"
        )
    if not target.parent.is_dir():
        raise InvalidArgumentError(f"output folder {str(target.parent)!r} does not exist")
    return target


@contextlib.contextmanager
def naming(folder: Path, target: Path) -> Iterator[None]:
    """Errors raised while the parts are staged name the user's folder, not the staging one."""
    try:
        yield
    except CheckError as exc:
        raise CheckError(str(exc).replace(str(folder), str(target)), exc.errors) from exc


def dequantized_model(
    model: nn.Module, *parts: tuple[nn.Module, dict[str, torch.Tensor] | None]
) -> nn.Module:
    """``model`` itself, or a copy running the dequantized weights of the compressed parts
    (each part's weights are named as the part names its parameters: found by identity)."""
    if not any(weights for _, weights in parts):
        return model
    names = {id(p): n for n, p in model.named_parameters(remove_duplicate=False)}
    state: dict[str, torch.Tensor] = {}
    for part, weights in parts:
        own = dict(part.named_parameters(remove_duplicate=False))
        for name, tensor in (weights or {}).items():
            if name not in own or id(own[name]) not in names:
                raise CheckError(f"dequantized weight {name!r} has no parameter in {type(model).__name__}")
            state[names[id(own[name])]] = tensor
    clone = copy.deepcopy(model)
    params = dict(clone.named_parameters(remove_duplicate=False))
    with torch.no_grad():
        for name, tensor in state.items():
            params[name].copy_(tensor)
    return clone.eval()
