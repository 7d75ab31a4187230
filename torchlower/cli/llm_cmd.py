"""``torchlower llm export DIR -o model.nnef.tgz``: a Hugging Face causal LM folder → tract archive."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from torchlower.cli import llm_generate_cmd
from torchlower.cli.console import Output, show_progress
from torchlower.cli.failures import output_error, short


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    llm = sub.add_parser(
        "llm", help="language models: export a Hugging Face causal LM with KV cache; generate in tract"
    )
    verbs = llm.add_subparsers(dest="llm_command", metavar="VERB", parser_class=type(sub._parser_class()))
    p = verbs.add_parser(
        "export",
        parents=[common],
        help="export a save_pretrained folder to an NNEF archive tract decodes with a KV cache",
        description="Load DIR (config.json + safetensors), export the causal LM with explicit KV-cache "
        "inputs/outputs (tract's detect_kv_cache naming), check it against Hugging Face in tract. "
        "Speech encoder-decoders (Whisper, …) and vision/audio LMs (LLaVA, Idefics3, SmolVLM, Qwen2-VL, "
        "Qwen2.5-VL, Qwen2-Audio) become a folder of archives and a manifest.json (docs/llm.md).",
    )
    p.add_argument("folder", metavar="DIR", help="model folder written by save_pretrained")
    p.add_argument("-o", "--output", required=True, help="archive path (.nnef.tgz, .nnef.tar or .nnef dir)")
    p.add_argument("--precision", choices=["f32", "f16"], default="f32", help="weights, compute and cache")
    p.add_argument("--compress", choices=["q4_0"], help="linear layers in 4-bit blocks")
    p.add_argument(
        "--embeddings", choices=["f32", "f16", "q4_0"], help="token embedding storage (default f32)"
    )
    p.add_argument(
        "--lm-head", choices=["f32", "f16", "q4_0"],
        help="LM head storage (default q4_0 with --compress q4_0, else as --embeddings)",
    )  # fmt: skip
    p.add_argument(
        "--logits",
        choices=["last", "all", "keep"],
        default="last",
        help="logits of the last or every position, or (keep) of the positions a last input"
        " logits_to_keep [K] names (speculative decoding)",
    )
    p.add_argument("--max-context", type=int, help="largest P + S (default: the config's positions)")
    p.add_argument("--no-check", action="store_true", help="write without comparing with Hugging Face")
    p.add_argument("--io-samples", action="store_true", help="bundle io/*.npz input/output samples")
    p.add_argument(
        "--frontend", action="store_true",
        help="Whisper: also the log-mel front end as frontend.nnef.tgz (raw 16 kHz samples → input_features,"
        " as WhisperFeatureExtractor); then llm generate takes audio",
    )  # fmt: skip
    p.add_argument(
        "--f32-parts",
        metavar="PARTS",
        help="with --precision f16: parts computed in f32, comma-separated from attention,norms,lm_head "
        "(default attention,norms; 'none' for f16 throughout)",
    )
    p.add_argument(
        "--part",
        choices=["decoder"],
        help="export only this part of a larger checkpoint (e.g. Whisper's decoder, without"
        " cross-attention); without it a checkpoint that would leave weights unused is refused",
    )
    p.add_argument(
        "--lora",
        metavar="ADAPTER",
        help="a peft LoRA adapter folder (adapter_config.json + adapter_model.safetensors) for DIR;"
        " its A/B matrices are separate tensors computed in the graph (swappable) unless --merge-lora",
    )
    p.add_argument(
        "--merge-lora", action="store_true", help="with --lora: merge W + scale·B@A into the weights"
    )
    p.set_defaults(run=run)
    llm_generate_cmd.add_parser(verbs, common)
    llm.set_defaults(run=None)


def run(args: argparse.Namespace, out: Output) -> int:
    from torchlower import llm

    with show_progress(out):
        report = llm.export(
            args.folder,
            args.output,
            precision=args.precision,
            compress=args.compress,
            embeddings=args.embeddings,
            lm_head=args.lm_head,
            logits=args.logits,
            max_context=args.max_context,
            check=not args.no_check,
            io_samples=args.io_samples,
            f32_parts=_parts(args.f32_parts),
            part=args.part,
            lora=args.lora,
            merge_lora=args.merge_lora,
            frontend=args.frontend,
        )
    if hasattr(report, "media"):  # a multimodal LM: a folder of three archives
        data = multimodal_json(report)
        out.emit(data, lambda console: render_multimodal(console, data))
        return 0
    if hasattr(report, "encoder"):  # a speech encoder-decoder: a folder of two archives
        data = seq2seq_json(report)
        out.emit(data, lambda console: render_seq2seq(console, data))
        return 0
    data = report_json(report)
    out.emit(data, lambda console: render(console, data))
    return 0


def _parts_json(report: Any, names: tuple[str, ...]) -> dict[str, Any]:
    parts = {}
    for name in names:
        part = getattr(report, name)
        parts[name] = {
            "path": str(part.path),
            "weight_bytes": part.weight_bytes,
            "weight_bytes_by_format": part.weight_bytes_by_format,
            "checked": bool(part.errors),
            "max_abs_error": part.max_abs_error if part.errors else None,
            "outputs_checked": [output_error(e) for e in part.errors],
        }
    return parts


def multimodal_json(report: Any) -> dict[str, Any]:
    return {
        "ok": True,
        "path": str(report.path),
        "kind": "multimodal_lm",
        "model_type": report.model_type,
        "architecture": report.architecture,
        "parameters": report.parameters,
        "layers": report.layers,
        "max_context": report.max_context,
        "precision": report.precision,
        "compress": report.compress,
        "parts": _parts_json(report, ("embed", "encoder", "decoder")),
        "media": report.media,  # placeholder token, rows per item, the encoder's input
        "artifact_bytes": report.archive_bytes,
        "bundled": report.bundled,
        "tokens": report.tokens,
        "reference_tokens": report.reference_tokens,
        "logit_error_vs_original": report.logit_error if report.tokens else None,
        "seconds": round(report.seconds, 3),
    }


def render_multimodal(console: Console, data: dict[str, Any]) -> None:
    table = Table(title=f"exported {data['path']}", show_header=False, title_justify="left")
    table.add_column("item", style="bold")
    table.add_column("value")
    table.add_row(
        "model", f"{data['architecture']}, {data['parameters']:,} parameters, {data['layers']} layers"
    )
    table.add_row("options", f"precision {data['precision']}, compress {data['compress'] or 'none'}")
    table.add_row("context", f"decoder P + S <= {data['max_context']}")
    media = data["media"]
    table.add_row(
        "media", f"{media['input']} → {media['tokens_per_item']} rows per item at token {media['token_id']}"
    )
    _render_parts(table, data)
    console.print(table)
    if not data["tokens"]:
        console.print("not checked (--no-check)")


def _render_parts(table: Table, data: dict[str, Any]) -> None:
    for name, part in data["parts"].items():
        formats = ", ".join(f"{k} {v:,}" for k, v in part["weight_bytes_by_format"].items())
        checked = f"; vs PyTorch max abs {short(part['max_abs_error'])} ✓" if part["checked"] else ""
        table.add_row(name, f"{part['path']} ({formats}){checked}")
    if data["tokens"]:
        same = sum(a == b for a, b in zip(data["tokens"], data["reference_tokens"], strict=False))
        table.add_row("greedy tokens", f"{same}/{len(data['tokens'])} equal to Hugging Face")
        table.add_row("logits vs original", short(data["logit_error_vs_original"]))
    table.add_row("artifact", f"{data['artifact_bytes']:,} bytes; bundled {', '.join(data['bundled'])}")
    table.add_row("time", f"{data['seconds']:.1f} s")


def seq2seq_json(report: Any) -> dict[str, Any]:
    encoder = json.loads((Path(report.path) / "manifest.json").read_text())["encoder"]
    front = ("frontend",) if report.frontend is not None else ()
    parts = _parts_json(report, (*front, "encoder", "decoder"))
    return {
        "ok": True,
        "path": str(report.path),
        "kind": "speech_seq2seq",
        "model_type": report.model_type,
        "architecture": report.architecture,
        "parameters": report.parameters,
        "layers": report.layers,
        "max_context": report.max_context,
        "precision": report.precision,
        "compress": report.compress,
        "parts": parts,
        "encoder_inputs": encoder["inputs"],  # e.g. {"input_features": [1, "T", 80]}
        "frames": encoder.get("frames"),  # the time axis and the lengths it takes
        "artifact_bytes": report.archive_bytes,
        "bundled": report.bundled,
        "tokens": report.tokens,
        "reference_tokens": report.reference_tokens,
        "logit_error_vs_original": report.logit_error if report.tokens else None,
        "seconds": round(report.seconds, 3),
    }


def render_seq2seq(console: Console, data: dict[str, Any]) -> None:
    table = Table(title=f"exported {data['path']}", show_header=False, title_justify="left")
    table.add_column("item", style="bold")
    table.add_column("value")
    table.add_row(
        "model", f"{data['architecture']}, {data['parameters']:,} parameters, {data['layers']} layers"
    )
    table.add_row("options", f"precision {data['precision']}, compress {data['compress'] or 'none'}")
    table.add_row("context", f"decoder P + S <= {data['max_context']}")
    frames = data["frames"] or {}
    for name, shape in data["encoder_inputs"].items():
        dims = [
            f"{frames['min']}..{frames['max']}" if i == frames.get("axis") and isinstance(n, str) else str(n)
            for i, n in enumerate(shape)
        ]
        table.add_row("encoder input", f"{name} [{', '.join(dims)}]")
    _render_parts(table, data)
    console.print(table)
    if not data["tokens"]:
        console.print("not checked (--no-check)")


def _parts(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    return () if text.strip() == "none" else tuple(p.strip() for p in text.split(",") if p.strip())


def report_json(report: Any) -> dict[str, Any]:
    return {
        "ok": True,
        "path": str(report.path),
        "model_type": report.model_type,
        "parameters": report.parameters,
        "layers": report.layers,
        "max_context": report.max_context,
        "precision": report.precision,
        "compress": report.compress,
        "embeddings": report.embeddings,
        "lm_head": report.lm_head,
        "unquantized": report.unquantized,
        "logits": report.logits,
        "weight_bytes": report.weight_bytes,
        "weight_bytes_by_format": report.weight_bytes_by_format,
        "artifact_bytes": report.archive_bytes,
        "bundled": report.bundled,
        "part": report.part,
        "unused_weights": report.unused_weights,
        "notes": report.notes,
        "lora": report.properties.get("torchlower.llm.lora"),  # merged / separate, None without
        "states": report.states,
        "seconds": round(report.seconds, 3),
        "checked": bool(report.errors),
        "max_abs_error": report.max_abs_error if report.errors else None,
        "logit_error_vs_original": report.logit_error if report.errors else None,
        "outputs_checked": [output_error(e) for e in report.errors],
    }


def render(console: Console, data: dict[str, Any]) -> None:
    table = Table(title=f"exported {data['path']}", show_header=False, title_justify="left")
    table.add_column("item", style="bold")
    table.add_column("value")
    table.add_row(
        "model", f"{data['model_type']}, {data['parameters']:,} parameters, {data['layers']} layers"
    )
    table.add_row("options", f"precision {data['precision']}, compress {data['compress'] or 'none'}, "
                  f"embeddings {data['embeddings']}, lm_head {data['lm_head']}, "
                  f"logits {data['logits']}")  # fmt: skip
    if data["states"]:  # a state-space model: fixed-size states, no position limit
        table.add_row(
            "context", f"S <= {data['max_context']} per call; {len(data['states'])} explicit states"
        )
    else:
        table.add_row("context", f"P + S <= {data['max_context']}")
    if data["part"]:
        table.add_row(
            "part", f"{data['part']} only; {len(data['unused_weights'])} checkpoint tensors left out"
        )
    formats = ", ".join(f"{k} {v:,}" for k, v in data["weight_bytes_by_format"].items())
    table.add_row("weights", f"{data['weight_bytes']:,} bytes ({formats})")
    for name, why in data["unquantized"].items():
        table.add_row("left float", f"{name}: {why}")
    if data["lora"]:
        table.add_row("lora", f"adapter {data['lora']}")
    for note in data["notes"]:
        table.add_row("note", note)
    table.add_row("artifact", f"{data['artifact_bytes']:,} bytes; bundled {', '.join(data['bundled'])}")
    if data["checked"]:
        logits = [e for e in data["outputs_checked"] if e["name"].startswith("outputs")]
        for e in logits:
            table.add_row(
                f"check {e['name']}", f"max abs {short(e['max_abs'])}, rel {short(e['max_rel'])}  ✓"
            )
        table.add_row("check caches", f"{len(data['outputs_checked']) - len(logits)} outputs ✓, max abs "
                      f"{short(data['max_abs_error'])}")  # fmt: skip
        table.add_row("logits vs original", short(data["logit_error_vs_original"]))
    table.add_row("time", f"{data['seconds']:.1f} s")
    console.print(table)
    if not data["checked"]:
        console.print("not checked (--no-check)")
