"""Multimodal export: ``torchlower llm export`` against torch-to-nnef-llm 0.24.12's
``t2n_export_multimodal_to_tract`` on the one VLM family both handle (issue 31).

``python -m bench.llm_vlm_reference WORKDIR [--repeats N] [--big]`` (dev venv with
``PYTHONPATH=tests/subprocess_site:.``, as ``make bench-llm``; needs ``.venv-llmref``).

The reference's multimodal handlers (``torch_to_nnef_llm/models/handlers/``) cover Gemma 3/4,
Idefics3 / SmolVLM, Mistral 3, Qwen2.5-VL, Qwen3-VL, Qwen3.5-VL and Voxtral; torchlower's cover
LLaVA, Idefics3 / SmolVLM, Qwen2-VL and Qwen2-Audio: Idefics3 is the overlap. Both write a vision
graph (tower + pixel-shuffle connector, one full tile), a decoder taking the image rows and a
manifest; torchlower also writes the token table as its own graph.

1. an ``Idefics3ForConditionalGeneration`` with random weights (SigLIP-like tower 256 wide, 4 layers,
   128-pixel tiles of 16-pixel patches → 16 rows after the pixel shuffle; Llama text model 256 wide,
   4 layers, vocab 32000: 23 M parameters, 92 MB f32), written by the dev venv's transformers 5;
   the reference venv's transformers 4.57 loads it with no missing or unexpected weight (checked);
2. both CLIs in fresh processes, interleaved (who goes first alternates), single-threaded,
   no verification (``--no-check`` / ``-nv``): wall seconds, CPU seconds and peak RSS (``wait4``);
   the same for each process's imports alone (torch, transformers' Idefics3, the exporter).

``--big``: a 9× larger model (text 1024 wide, 8 layers; tower 768 wide, 6 layers: 206 M parameters,
825 MB f32). Last runs: ``results-issue31-vlm.md``.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.exporters import tract_shim
from bench.llm_reference import REF, ROOT, SINGLE

# (vision, text) config fields; names every transformers from 4.57 to 5.x accepts
CONFIGS = {
    "small": (
        {"hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 4},
        {"hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4, "num_attention_heads": 8},
    ),
    "big": (
        {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 6, "num_attention_heads": 12},
        {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 8, "num_attention_heads": 16},
    ),
}

MAKE = """
import json, sys, torch, transformers
vision, text = json.loads(sys.argv[2])
torch.manual_seed(0)
config = transformers.Idefics3Config(
    vision_config=transformers.Idefics3VisionConfig(image_size=128, patch_size=16, **vision),
    text_config=transformers.LlamaConfig(vocab_size=32000, max_position_embeddings=2048,
        num_key_value_heads=text["num_attention_heads"] // 2, tie_word_embeddings=False, **text),
    scale_factor=2, image_token_id=31999)
transformers.Idefics3ForConditionalGeneration(config).eval().save_pretrained(sys.argv[1])
from tokenizers import Tokenizer, models, pre_tokenizers
tok = Tokenizer(models.WordLevel(vocab={f"w{i}": i for i in range(32000)}, unk_token="w0"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0", bos_token="w1",
    eos_token="w2").save_pretrained(sys.argv[1])
"""

# transformers 5 names the tokenizer class "TokenizersBackend", which 4.57 does not know
TOKENIZER_CLASS = "PreTrainedTokenizerFast"

# the reference venv's transformers 4.57 must load every checkpoint tensor and initialize none
LOAD_CHECK = """
import sys, transformers
_, info = transformers.Idefics3ForConditionalGeneration.from_pretrained(sys.argv[1], output_loading_info=True)
bad = {k: v for k, v in info.items() if v}
assert not bad, bad
"""

IDEFICS3 = "import torch, transformers; transformers.Idefics3ForConditionalGeneration; "
IMPORTS = {
    "torchlower": IDEFICS3 + "import torchlower.llm.exporter",
    "reference": IDEFICS3 + "import torch_to_nnef_llm.multimodal_exporter",
}


def _env(name: str) -> dict[str, str]:
    """Ours runs with the dev venv's PYTHONPATH (the repo, the torchvision bypass); the
    reference's venv needs neither."""
    env = dict(os.environ, **SINGLE)
    if name == "reference":
        env.pop("PYTHONPATH", None)
    return env


def _run_rss(name: str, cmd: list[str]) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds (user + system) and peak RSS bytes of one fresh process (``wait4``)."""
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=_env(name), stdout=subprocess.DEVNULL, stderr=err, cwd=ROOT)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - t0
        if (code := os.waitstatus_to_exitcode(status)) != 0:
            err.seek(0)
            raise RuntimeError(f"{cmd[0]} failed ({code}): {err.read()[-2000:].decode()}")
    return seconds, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024


def _commands(folder: Path, work: Path, shim: Path) -> dict[str, list[str]]:
    ours = [sys.executable, "-m", "torchlower", "llm", "export", str(folder), "-o", str(work / "tl")]
    reference = [str(REF / "t2n_export_multimodal_to_tract"), "-d", str(folder), "-e", str(work / "ref")]
    return {
        "torchlower": [*ours, "--no-check", "-q"],
        "reference": [*reference, "-nv", "-iaed", "--tract-specific-path", str(shim)],
    }


def _make(folder: Path, size: str) -> None:
    """The checkpoint, written by the dev venv, then loaded by the reference venv."""
    if not (folder / "config.json").exists():
        subprocess.run(
            [sys.executable, "-c", MAKE, str(folder), json.dumps(CONFIGS[size])],
            check=True,
            env=_env("torchlower"),
            cwd=ROOT,
        )
        tok = folder / "tokenizer_config.json"
        tok.write_text(json.dumps(json.loads(tok.read_text()) | {"tokenizer_class": TOKENIZER_CLASS}))
    subprocess.run([str(REF / "python"), "-c", LOAD_CHECK, str(folder)], check=True, env=_env("reference"))


def _interleaved(cmds: dict[str, list[str]], repeats: int) -> dict[str, list[tuple[float, float, int]]]:
    rows: dict[str, list[tuple[float, float, int]]] = {k: [] for k in cmds}
    for i in range(repeats):
        for name in list(cmds) if i % 2 == 0 else list(cmds)[::-1]:
            rows[name].append(_run_rss(name, cmds[name]))
            print(name, rows[name][-1], os.getloadavg(), flush=True)
    return rows


# what the table shows of each (wall s, CPU s, peak RSS bytes) row: label, index, scale, format
MEASURES = (("wall s", 0, 1, "{:.2f}"), ("CPU s", 1, 1, "{:.2f}"), ("peak RSS MB", 2, 1e-6, "{:,.0f}"))


def _bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*.nnef.tgz"))


def main(work: Path, repeats: int, size: str) -> None:
    os.environ.update(SINGLE)
    work.mkdir(parents=True, exist_ok=True)
    folder = work / f"idefics3-{size}"
    _make(folder, size)
    checkpoint = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    shim = tract_shim(Path(tempfile.mkdtemp(prefix="shim-", dir=work)))
    python = {"torchlower": sys.executable, "reference": str(REF / "python")}
    load0 = os.getloadavg()
    exports = _interleaved(_commands(folder, work, shim), repeats)
    floor = _interleaved({k: [python[k], "-c", IMPORTS[k]] for k in python}, repeats)
    lines = [
        f"Idefics3 `{size}`: checkpoint {checkpoint:,} bytes (f32 safetensors); repeats {repeats} (medians);"
        f" load average before {tuple(round(x, 2) for x in load0)}, after"
        f" {tuple(round(x, 2) for x in os.getloadavg())}",
        "",
        "| measure | torchlower | reference | ratio |",
        "|---|---|---|---|",
    ]
    for what, rows in (("export (CLI, fresh process)", exports), ("imports alone", floor)):
        for label, k, scale, fmt in MEASURES:
            a, b = (statistics.median(r[k] for r in rows[n]) * scale for n in ("torchlower", "reference"))
            lines.append(f"| {what} {label} | {fmt.format(a)} | {fmt.format(b)} | {a / b:.2f} |")
    for label, k, scale in (("wall s", 0, 1), ("CPU s", 1, 1), ("peak RSS MB", 2, 1e-6)):
        a, b = (
            (statistics.median(r[k] for r in exports[n]) - statistics.median(r[k] for r in floor[n])) * scale
            for n in ("torchlower", "reference")
        )
        what = "export peak RSS minus imports' peak MB" if k == 2 else f"export minus imports {label}"
        lines.append(f"| {what} | {a:,.2f} | {b:,.2f} | {a / b:.2f} |")
    a, b = _bytes(work / "tl"), _bytes(work / "ref")
    lines.append(f"| archives bytes (all graphs) | {a:,} | {b:,} | {a / b:.2f} |")
    print("\n".join(lines))


if __name__ == "__main__":
    n = int(sys.argv[sys.argv.index("--repeats") + 1]) if "--repeats" in sys.argv else 3
    main(Path(sys.argv[1]), n, "big" if "--big" in sys.argv else "small")
