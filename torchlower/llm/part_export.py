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

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from torchlower.core import model_io
from torchlower.core import tolerance as tolerances
from torchlower.errors import CheckError, InvalidArgumentError
from torchlower.llm import bundle
from torchlower.nnef import archive
from torchlower.pipeline import capture, optimize, reference, report, request, write
from torchlower.pipeline import check as checks

F16_TOLERANCE = 3e-2  # of the output scale (llm.exporter.F16_TOLERANCE)
SAMPLE = "io/example.npz"  # a part's bundled sample (``io_samples``)


def export_part(
    module: nn.Module, example: tuple[torch.Tensor, ...], target: Path, names_in: list[str],
    names_out: list[str], axes: dict[str, Any] | None, precision: str, compress: str | None,
    check: bool, extensions: list[str], props: dict[str, Any], files: dict[str, bytes],
    frontend: str = "export", rewrite: Callable[[Any], object] | None = None,
    keep_float: frozenset[str] = frozenset(), io_samples: bool = False,
    mapping: Any = None,
) -> tuple[report.ExportReport, dict[str, torch.Tensor] | None]:  # fmt: skip
    """``torchlower.export``'s stages, with the graph's bounds, properties and bundled files;
    ``rewrite(builder)`` runs after the pipeline's passes (e.g. ``precision.keep_f32``);
    ``keep_float``: parameters q4_0 leaves float (a token table); ``io_samples`` bundles the
    example and the part's outputs on it as ``io/example.npz`` (what ``torchlower check`` of
    the part alone compares with).

    Unchecked, the part never runs in PyTorch (the parts' dynamic axes are token and cache
    lengths, which need no probe of multiples; the outputs' shapes come from the graph). With ``mapping``
    (``stream.Mapping``: the weights view the checkpoint file) the pages the trace and passes read
    are dropped and each tensor's pages as the archive writes it, so the resident set stays
    near the largest activation, not the part's weights."""
    req = request.request(
        module, example, target, input_names=names_in, output_names=names_out, frontend=frontend,
        check=check, tolerance=None, precision=precision, compress=compress, dynamic_axes=axes,
        dynamic_shapes=None, allow_value_dependent_trace=False,
    )  # fmt: skip
    ref = reference.run_reference(module, req, names_out) if check else reference.unrun(module, names_out)
    # torch itself in f16 is this far from f32 on these models (docs/llm.md), as the causal-LM check
    tolerance = (
        F16_TOLERANCE * tolerances.output_scale([t.numpy() for t in ref.expected])
        if precision == "f16"
        else None
    )
    captured = capture.capture(req, ref)
    builder = captured.builder
    ref = ref if check else reference.graph_outputs(ref, builder)
    builder.release = mapping.release if mapping is not None else None
    dequantized = optimize.compress(builder, ref.module, compress, keep_float)
    optimize.optimize(builder)
    if rewrite is not None:
        rewrite(builder)
    weights = builder.live_weights()
    builder.example_sizes = req.example_sizes
    if io_samples:
        files = files | {SAMPLE: _sample(ref.module, req.example, names_in, names_out, dequantized)}
    graph = bundle.with_header(builder.graph_text(), extensions, bundle.properties_fragment(props))
    release = None
    if mapping is not None:
        mapping.release_all()  # the eager run, folds and passes may have read weights
        release = mapping.release
    with write.staging(req.target, check) as staging:
        written = archive.write(
            staging, graph, weights, builder.quant_text(), files, release, huffman_only=True
        )
        if mapping is not None:  # small tensors share pages the writer's pieces leave behind
            mapping.release_all()
        result = report.export_report(written, req, ref, captured, weights)
        if check:
            outcome = checks.check_export(
                written, ref.module, req.example, ref.expected, ref.output_names, req.spec, tolerance,
                builder, dequantized, req.target,
            )  # fmt: skip
            report.record_check(result, outcome)
    result.path = req.target
    return result, dequantized


def _sample(
    module: nn.Module, example: tuple[torch.Tensor, ...], names_in: list[str], names_out: list[str],
    dequantized: dict[str, torch.Tensor] | None,
) -> bytes:  # fmt: skip
    """The example and the part's outputs on it (a compressed part: its dequantized weights, the
    values tract should reproduce), under the graph's names."""
    with torch.no_grad():
        returned = module(*example) if dequantized is None else functional_call(module, dequantized, example)
    outputs = model_io.flatten_outputs(returned)
    arrays = dict(zip(names_in, (t.numpy() for t in example), strict=True))
    return bundle.npz(arrays | dict(zip(names_out, (t.detach().numpy() for t in outputs), strict=True)))


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
    model: nn.Module,
    *parts: tuple[nn.Module, dict[str, torch.Tensor] | None],
    aliases: dict[int, str] | None = None,
) -> nn.Module:
    """``model`` itself, or a copy running the dequantized weights of the compressed parts (each
    part's weights named as the part names its parameters, found by identity; ``aliases`` name
    the parameters the parts hold as copies, from ``seq2seq_head.untie_head``). Each replaced
    weight is a new parameter of the copy, so a tied table keeps its own values when only the
    head was packed."""
    if not any(weights for _, weights in parts):
        return model
    names: dict[int, list[str]] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(n)
    names |= {i: [n] for i, n in (aliases or {}).items()}
    state: dict[str, torch.Tensor] = {}
    for part, weights in parts:
        own = dict(part.named_parameters(remove_duplicate=False))
        for name, tensor in (weights or {}).items():
            if name not in own or id(own[name]) not in names:
                raise CheckError(f"dequantized weight {name!r} has no parameter in {type(model).__name__}")
            found = names[id(own[name])]  # a tied parameter: the model's name that ends as the part's
            state[next((n for n in found if n.endswith(name)), found[0])] = tensor
    clone = copy.deepcopy(model)
    for name, tensor in state.items():
        owner, _, attr = name.rpartition(".")
        target = clone.get_submodule(owner)
        old = getattr(target, attr)
        fresh = nn.Parameter(tensor.detach().to(old.dtype).reshape(old.shape), requires_grad=False)
        setattr(target, attr, fresh)
    return clone.eval()


def judge_decoding(
    result: Any,
    what: str,
    tokens: list[int],
    logits: list[np.ndarray],
    hf: Any,
    reference_is_model: bool,
    precision: str,
) -> None:
    """The end-to-end check of a multi-archive export: tract's greedy ``tokens`` / ``logits``
    against HF's (``hf(model_kind, forced)`` → tokens, logits of the reference or original model).
    Records the tokens and the logit error against the original model; raises ``CheckError``."""  # fmt: skip
    want = hf("reference", tokens)[1]
    ref_tokens = hf("reference", None)[0]
    original = hf("original", tokens)[1]
    result.tokens, result.reference_tokens = tokens, ref_tokens
    error = float(np.abs(np.stack(logits) - want).max())
    result.logit_error = float(np.abs(np.stack(logits) - original).max())
    tol = (1e-4 if reference_is_model else 1e-3) * max(1.0, float(np.abs(want).max()))
    if precision != "f16" and (tokens != ref_tokens or error > tol):
        raise CheckError(
            f"{result.path}: tract's {what} disagree with Hugging Face (nothing written): tokens"
            f" {tokens} vs {ref_tokens}, max logit error {error:.3g} > {tol:.3g}"
        )
