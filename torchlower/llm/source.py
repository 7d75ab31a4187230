"""Where an LLM comes from: a local Hugging Face folder (``save_pretrained``) or a loaded model.

Every problem with the folder is found here, before any tracing, and reported as a typed
error naming the file and the fix — never as a traceback from deep inside ``transformers``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from torchlower.errors import InvalidArgumentError

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")
LEGACY_WEIGHT_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json")
TOKENIZER_FILES = (
    "preprocessor_config.json",
    "vocab.json",
    "merges.txt",
    "normalizer.json",
    "added_tokens.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
)


PARTS = ("decoder",)  # what ``part=`` may name: export that part of a larger checkpoint


class SourceError(InvalidArgumentError):
    """The model folder cannot be used: missing or unreadable config / weights / tokenizer."""


class WrongModelError(SourceError):
    """The checkpoint would not be exported whole: its config names another class than the one
    torchlower can load, or loading leaves checkpoint weights unused (a Whisper encoder behind
    ``WhisperForCausalLM``). ``part="decoder"`` (``--part decoder``) exports the part on purpose."""

    def __init__(
        self, message: str, *, config_class: str | None, loaded_class: str, unused: list[str]
    ) -> None:
        super().__init__(message)
        self.config_class = config_class  # config.json's ``architectures[0]``
        self.loaded_class = loaded_class  # the causal-LM class transformers maps the config to
        self.unused = unused  # checkpoint tensors no parameter of the loaded model took


@dataclass
class Source:
    """A causal LM ready to wrap: the model in eval mode, its config and the files to bundle."""

    model: nn.Module
    config: Any
    folder: Path | None = None
    files: dict[str, bytes] = field(default_factory=dict)  # bundled as-is: config, tokenizer
    mapping: Any = None  # stream.Mapping when the weights are memory-mapped
    unused: list[str] = field(default_factory=list)  # checkpoint tensors the model did not take
    part: str | None = None  # the part of the checkpoint exported on purpose (``PARTS``)
    # float dtypes of the checkpoint's tensors as stored (safetensors names: ``BF16``, ``F16``)
    stored_dtypes: tuple[str, ...] = ()

    @property
    def model_type(self) -> str:
        return str(getattr(self.config, "model_type", "unknown"))

    @property
    def text_config(self) -> Any:
        return self.config.get_text_config(decoder=True)


def open_source(source: str | os.PathLike[str] | nn.Module, part: str | None = None) -> Source:
    """A ``Source`` from a folder path or a loaded ``PreTrainedModel`` (never downloads).

    A folder must be exported whole: ``WrongModelError`` when its config names a class other
    than the causal LM transformers loads, or when checkpoint tensors stay unused, unless
    ``part`` names the part exported on purpose (``"decoder"``).
    """
    if part is not None and part not in PARTS:
        raise InvalidArgumentError(f"part must be one of {', '.join(PARTS)} (or None); got {part!r}")
    if isinstance(source, nn.Module):
        config = getattr(source, "config", None)
        if config is None or not hasattr(config, "model_type"):
            raise InvalidArgumentError(
                f"source is a {type(source).__name__} without a Hugging Face config; pass a "
                "transformers PreTrainedModel (e.g. LlamaForCausalLM) or its save_pretrained folder"
            )
        stored = sorted({str(p.dtype) for p in source.parameters() if p.dtype != torch.float32})
        if stored:
            raise InvalidArgumentError(
                f"source is a {type(source).__name__} in {', '.join(stored)}; the export computes in"
                " f32 (or f16 with precision='f16'): pass model.float(), or its save_pretrained folder"
                " (loaded as f32, with a note of the conversion in the report)"
            )
        files = {"config.json": config.to_json_string(use_diff=False).encode()}
        return Source(source, config, None, files)
    if not isinstance(source, (str, os.PathLike)):
        raise InvalidArgumentError(
            f"source must be a model folder path or a PreTrainedModel, got {type(source).__name__}"
        )
    folder = Path(source)
    config = load_config(folder)
    files = bundled_files(folder)
    model, mapping, unused = load_model(folder, config)
    if part is None:
        refuse_partial(folder, config, type(model).__name__, unused)
    stored = stored_float_dtypes(weight_files(folder))
    return Source(model, config, folder, files, mapping, unused, part, stored)


def open_speech_seq2seq(
    source: str | os.PathLike[str] | nn.Module,
) -> tuple[nn.Module, dict[str, bytes]] | None:
    """A Whisper, Speech2Text or Moonshine ``ForConditionalGeneration`` (folder or model) and its
    files to bundle; None for anything else (``open_named``)."""
    from torchlower.llm.seq2seq import ARCHITECTURES

    return open_named(source, ARCHITECTURES)


def open_named(
    source: str | os.PathLike[str] | nn.Module, architectures: dict[str, str], mapped: bool = False
) -> tuple[nn.Module, dict[str, bytes], Any] | None:
    """The model of a folder whose config names ``architectures[model_type]`` (or a loaded model
    of one of those classes), loaded through that class, its files to bundle and, with
    ``mapped``, the ``stream.Mapping`` its weights view when the checkpoint is all-f32
    safetensors (None otherwise); None for any other model. The folder's weights must all be
    taken (``WrongModelError`` otherwise)."""
    if isinstance(source, nn.Module):
        if type(source).__name__ not in architectures.values():
            return None
        return source, {"config.json": source.config.to_json_string(use_diff=False).encode()}, None
    if not isinstance(source, (str, os.PathLike)):
        return None
    folder = Path(source)
    config = load_config(folder)
    named = [str(a) for a in (getattr(config, "architectures", None) or [])]
    wanted = architectures.get(str(config.model_type))
    if wanted is None or wanted not in named:
        return None
    import transformers

    files = weight_files(folder)
    check_weights_readable(files)
    cls = getattr(transformers, wanted)
    if mapped:
        from torchlower.llm import stream

        try:
            model, mapping = stream.mapped_model(files, config, cls)
        except stream.NotStreamable:
            pass
        else:
            refuse_partial(folder, config, type(model).__name__, list(mapping.unused))
            stream.generation_config(model, folder)
            return model, bundled_files(folder), mapping
    try:
        model, info = cls.from_pretrained(
            str(folder), local_files_only=True, dtype=torch.float32, output_loading_info=True
        )
    except Exception as exc:
        raise SourceError(f"{files[0]}: transformers cannot load the checkpoint: {exc}") from exc
    refuse_partial(
        folder, config, type(model).__name__, sorted(str(k) for k in info.get("unexpected_keys", ()))
    )
    return model.eval(), bundled_files(folder), None


def refuse_partial(folder: Path, config: Any, loaded: str, unused: list[str]) -> None:
    """``WrongModelError`` when the checkpoint is not the loaded class, or not all of it is used."""
    named = [str(a) for a in (getattr(config, "architectures", None) or [])]
    other = bool(named) and loaded not in named
    if not other and not unused:
        return
    shown = ", ".join(unused[:8]) + (f", … ({len(unused)} in all)" if len(unused) > 8 else "")
    why = []
    if other:
        why.append(f"config.json names {named[0]} but transformers loads it as {loaded}")
    if unused:
        why.append(f"{len(unused)} checkpoint tensor(s) would not be exported: {shown}")
    raise WrongModelError(
        f"{folder}: not exported whole — {'; '.join(why)}. An archive of it would lack what those "
        f"weights compute. Export the {loaded} part on purpose with --part decoder "
        "(torchlower.llm.export(..., part='decoder')).",
        config_class=named[0] if named else None,
        loaded_class=loaded,
        unused=unused,
    )


def load_config(folder: Path) -> Any:
    """The folder's ``config.json`` as a transformers config, with typed errors."""
    if not folder.is_dir():
        raise SourceError(f"{folder}: not a folder; pass a folder written by save_pretrained")
    path = folder / "config.json"
    if not path.is_file():
        raise SourceError(
            f"{path}: missing; a model folder needs config.json and weights "
            "(model.save_pretrained(folder) writes both)"
        )
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SourceError(f"{path}: not readable JSON ({exc}); re-create it with save_pretrained") from exc
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    model_type = raw.get("model_type") if isinstance(raw, dict) else None
    if not model_type or model_type not in transformers.CONFIG_MAPPING:
        raise SourceError(
            f"{path}: model_type {model_type!r} is not a transformers architecture this install knows"
        )
    try:
        return transformers.AutoConfig.from_pretrained(str(folder), local_files_only=True)
    except Exception as exc:
        raise SourceError(f"{path}: transformers cannot read this config: {exc}") from exc


def weight_files(folder: Path) -> list[Path]:
    """The checkpoint files in load order; raises ``SourceError`` when there are none."""
    for name in (*WEIGHT_FILES, *LEGACY_WEIGHT_FILES):
        path = folder / name
        if not path.is_file():
            continue
        if not name.endswith(".index.json"):
            return [path]
        try:
            index = json.loads(path.read_text())
            shards = sorted({str(v) for v in index["weight_map"].values()})
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise SourceError(f"{path}: not a readable shard index ({exc})") from exc
        missing = [s for s in shards if not (folder / s).is_file()]
        if missing:
            raise SourceError(f"{path}: lists shards that are missing: {', '.join(missing)}")
        return [folder / s for s in shards]
    raise SourceError(
        f"{folder}: no weights (expected model.safetensors, a sharded model.safetensors.index.json "
        "or pytorch_model.bin); save the model with model.save_pretrained(folder)"
    )


def stored_float_dtypes(files: list[Path]) -> tuple[str, ...]:
    """The float dtypes the safetensors files store (headers only; ``.bin`` files say nothing)."""
    from torchlower.llm.stream import read_header

    found: set[str] = set()
    for path in files:
        if path.suffix == ".safetensors":
            header, _ = read_header(path)
            dtypes = {str(m.get("dtype", "")) for m in header.values()}
            found |= {d for d in dtypes if d.startswith(("F", "BF"))}
    return tuple(sorted(found))


def check_weights_readable(files: list[Path]) -> None:
    """Open every safetensors header now, so a corrupt file is named before tracing."""
    from safetensors import safe_open

    for path in files:
        if path.suffix != ".safetensors":
            continue
        try:
            with safe_open(str(path), framework="pt") as handle:
                list(handle.keys())
        except Exception as exc:
            raise SourceError(
                f"{path}: not a readable safetensors checkpoint ({exc}); re-save the model with "
                "save_pretrained(folder, safe_serialization=True)"
            ) from exc


def load_model(folder: Path, config: Any) -> tuple[nn.Module, Any, list[str]]:
    """``AutoModelForCausalLM`` from the folder in f32 eval mode, offline, its memory map, and
    the checkpoint tensors it did not take.

    All-f32 safetensors checkpoints are memory-mapped (``stream.py``: nothing is read until
    written); others load into memory through transformers.
    """
    import torch
    import transformers

    if type(config) not in transformers.MODEL_FOR_CAUSAL_LM_MAPPING:
        raise SourceError(
            f"{folder / 'config.json'}: {type(config).__name__} has no causal-LM head in transformers; "
            "torchlower.llm exports decoder-only causal language models"
        )
    files = weight_files(folder)
    check_weights_readable(files)
    from torchlower.llm import stream

    try:
        model, mapping = stream.mapped_model(files, config)
        return model, mapping, list(mapping.unused)
    except stream.NotStreamable:
        pass
    try:
        model, info = transformers.AutoModelForCausalLM.from_pretrained(
            str(folder), local_files_only=True, dtype=torch.float32, output_loading_info=True
        )
    except Exception as exc:
        raise SourceError(f"{files[0]}: transformers cannot load the checkpoint: {exc}") from exc
    return model.eval(), None, sorted(str(k) for k in info.get("unexpected_keys", ()))


def bundled_files(folder: Path) -> dict[str, bytes]:
    """config.json and the tokenizer files present in the folder, byte for byte."""
    out = {"config.json": (folder / "config.json").read_bytes()}
    for name in TOKENIZER_FILES:
        if (folder / name).is_file():
            out[name] = (folder / name).read_bytes()
    return out


def check_tokenizer(files: dict[str, bytes], vocab_size: int, where: Path | None) -> None:
    """A bundled ``tokenizer.json`` must not produce ids beyond the embedding table."""
    blob = files.get("tokenizer.json")
    if blob is None:
        return
    path = (where / "tokenizer.json") if where is not None else Path("tokenizer.json")
    try:
        data = json.loads(blob)
        vocab = data.get("model", {}).get("vocab", {})
        ids = list(vocab.values()) if isinstance(vocab, dict) else list(range(len(vocab)))
        ids += [int(t["id"]) for t in data.get("added_tokens", [])]
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise SourceError(f"{path}: not a readable tokenizers JSON file ({exc})") from exc
    largest = max((int(i) for i in ids), default=-1)
    if largest >= vocab_size:
        raise SourceError(
            f"{path}: the tokenizer produces ids up to {largest} but the model's vocab_size is "
            f"{vocab_size}; bundle the tokenizer saved with this model (or resize the embeddings)"
        )
