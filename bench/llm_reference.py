"""torchlower.llm against the reference LLM exporter (torch-to-nnef-llm 0.24.12), side by side.

``python -m bench.llm_reference WORKDIR [--repeats N] [--big]`` (dev venv; needs ``.venv-llmref`` with
``torch==2.13.0``, ``transformers>=4.57,<4.58``, ``torch-to-nnef-llm==0.24.12``, ``tract``:
the reference crashes with transformers 5). One run, interleaved, single-threaded:

1. a Llama checkpoint of ~16 M parameters (hidden 256, 4 layers, vocab 32000) written by the
   reference venv's transformers 4.57, so both exporters read the same files;
2. export wall time of each CLI in a fresh process (imports included), f32 and Q4_0:
   ``torchlower llm export DIR -o X --no-check [--compress q4_0]`` and
   ``t2n_export_llm_to_tract -d DIR -e X -nv [-c min_max_q4_0]`` (shim tract binary printing
   ``tract 0.23.8``: nothing downloaded), median of ``--repeats``; wall and CPU seconds (CPU:
   user + system of that process, what a loaded machine changes least), and the same for each
   process's imports alone (torch, transformers' Llama code, the exporter): the floor both
   exporters pay before any work;
3. both f32 archives loaded in the same tract (Python package), decode ms/token at P = 128 and
   P = 1024 (S = 1, explicit cache tensors), prefill of 128 tokens (P = 0), medians, the two
   archives taking turns (15 rounds of 5 runs each).
Prints a markdown table with ``os.getloadavg()``.

``--big``: instead, the ≥ 1 GB Llama of ``bench/llm_bigmem.py`` (288 M parameters, 1.15 GB f32),
export wall time and peak RSS (``wait4``) of both CLIs, f32 and Q4_0 (``main_big``).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

T = TypeVar("T")  # what one measurement of a CLI run gives (seconds, or seconds and peak RSS)

ROOT = Path(__file__).resolve().parents[1]
REF = ROOT / ".venv-llmref" / "bin"
SINGLE = {"RAYON_NUM_THREADS": "1", "TRACT_FLASH_SDPA_ST": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
MAKE = """
import sys, torch, transformers
torch.manual_seed(0)
c = transformers.LlamaConfig(vocab_size=32000, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
    num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=2048, tie_word_embeddings=False)
transformers.LlamaForCausalLM(c).eval().save_pretrained(sys.argv[1])
from tokenizers import Tokenizer, models, pre_tokenizers
tok = Tokenizer(models.WordLevel(vocab={f"w{i}": i for i in range(32000)}, unk_token="w0"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
fast = transformers.PreTrainedTokenizerFast(
    tokenizer_object=tok, unk_token="w0", bos_token="w1", eos_token="w2")
fast.save_pretrained(sys.argv[1])
"""


BIG = """
import sys, json, torch, transformers
torch.manual_seed(0)
c = transformers.LlamaConfig(**json.loads(sys.argv[2]))
transformers.LlamaForCausalLM(c).eval().save_pretrained(sys.argv[1])
""" + MAKE[MAKE.index("from tokenizers") :]  # the reference needs a tokenizer.json


# what each exporter's process imports before it can trace a Llama: torch, transformers' Llama
# code and the exporter itself (the reference's env has no PYTHONPATH: ours points at the repo)
LLAMA = "import torch, transformers; transformers.LlamaForCausalLM; "
IMPORTS = {
    "torchlower": LLAMA + "import torchlower.llm.exporter",
    "reference": LLAMA + "import torch_to_nnef_llm.cli",
}


def _run(cmd: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds (user + system: what a loaded machine changes least)."""
    seconds, _, cpu = _run_rss(cmd)
    return seconds, cpu


def _run_rss(cmd: list[str]) -> tuple[float, int, float]:
    """Wall seconds, peak RSS (bytes) and CPU seconds of a fresh process (that process alone: ``wait4``)."""
    env = dict(os.environ, **SINGLE)
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err, cwd=ROOT)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            raise RuntimeError(f"{cmd[0]} failed ({proc.returncode}): {err.read()[-2000:].decode()}")
    return seconds, usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime


def _ours(folder: Path, out: Path, compress: str | None) -> list[str]:
    extra = ["--compress", compress] if compress else []
    return [
        sys.executable,
        "-m",
        "torchlower",
        "llm",
        "export",
        str(folder),
        "-o",
        str(out),
        "--no-check",
        "-q",
        *extra,
    ]


def _reference(folder: Path, out: Path, shim: Path, compress: str | None) -> list[str]:
    extra = ["-c", "min_max_q4_0"] if compress else []
    return [
        str(REF / "t2n_export_llm_to_tract"),
        "-d",
        str(folder),
        "-e",
        str(out),
        "-nv",
        "-iaed",
        "--tract-specific-path",
        str(shim),
        *extra,
    ]


def _feeds(facts: list[str], past: int, seq: int, vocab: int, rng: np.random.Generator) -> list[np.ndarray]:
    kv = []
    for fact in facts:
        dims = [int(d) if d.isdigit() else past for d in fact.split(",")[:-1]]
        kv.append(rng.standard_normal(dims).astype(np.float32))
    return [rng.integers(0, vocab, (1, seq)).astype(np.int64), *kv]


def _interleaved_cpu(
    runs: dict[str, Any], feeds: dict[str, list[np.ndarray]], rounds: int, burst: int
) -> tuple[dict[str, float], dict[str, float]]:
    """Median wall ms and median thread-CPU ms per run, the archives taking turns (rotating who
    goes first) in bursts. Timed one after the other instead, byte-identical archives differed
    by up to 1.37x on this host (its memory bandwidth swings); single-threaded tract runs on the
    calling thread, so under load the CPU time leaves out preemption (not cache contention)."""
    times: dict[str, list[float]] = {k: [] for k in runs}
    cpu: dict[str, list[float]] = {k: [] for k in runs}
    order = list(runs)
    for k, r in runs.items():
        r.run(feeds[k])
    for i in range(rounds):
        for k in order[i % len(order) :] + order[: i % len(order)]:
            for _ in range(burst):
                c0, t0 = time.thread_time(), time.perf_counter()
                runs[k].run(feeds[k])
                times[k].append((time.perf_counter() - t0) * 1000)
                cpu[k].append((time.thread_time() - c0) * 1000)
    return (
        {k: statistics.median(v) for k, v in times.items()},
        {k: statistics.median(v) for k, v in cpu.items()},
    )


def _decode_times(archives: dict[str, Path], rounds: int) -> dict[str, dict[str, float]]:
    """Decode at P = 128 / 1024 and prefill of 128 tokens, ms, interleaved: label -> name -> ms."""
    import tract

    nnef = tract.nnef().with_tract_extra().with_tract_transformers()
    models = {k: nnef.load(str(a)) for k, a in archives.items()}
    facts = {k: [str(m.input_fact(i)) for i in range(1, m.input_count())] for k, m in models.items()}
    runs = {k: m.into_runnable() for k, m in models.items()}
    out: dict[str, dict[str, float]] = {}
    for label, past, seq in (("decode P=128", 128, 1), ("decode P=1024", 1024, 1), ("prefill 128", 0, 128)):
        rng = np.random.default_rng(0)
        feeds = {k: _feeds(facts[k], past, seq, 32000, rng) for k in models}
        out[label] = _interleaved_cpu(runs, feeds, rounds, 5)[0]
    return out


def _find_archive(folder: Path) -> Path:
    found = sorted(folder.rglob("*.nnef.tgz"))
    if not found:
        raise RuntimeError(f"no .nnef.tgz under {folder}")
    return found[0]


def _interleaved_exports(
    folder: Path, work: Path, repeats: int, measure: Callable[[list[str]], T], verbose: bool = False
) -> dict[str, list[T]]:
    """``measure`` of both CLIs' f32 and Q4_0 exports of ``folder``, ``repeats`` times, alternating
    who goes first; keyed ``"{f32|q4_0} {torchlower|reference}"``."""
    from bench.exporters import tract_shim

    shim = tract_shim(Path(tempfile.mkdtemp(prefix="shim-", dir=work)))
    rows: dict[str, list[T]] = {}
    for i in range(repeats):
        for compress in (None, "q4_0"):
            tag = compress or "f32"
            pairs = [
                ("torchlower", _ours(folder, work / f"tl-{tag}.nnef.tgz", compress)),
                ("reference", _reference(folder, work / f"ref-{tag}", shim, compress)),
            ]
            for name, cmd in pairs if i % 2 == 0 else pairs[::-1]:
                rows.setdefault(f"{tag} {name}", []).append(measure(cmd))
                if verbose:
                    print(name, tag, rows[f"{tag} {name}"][-1], os.getloadavg(), flush=True)
    return rows


def main(work: Path, repeats: int) -> None:
    os.environ.update(SINGLE)
    work.mkdir(parents=True, exist_ok=True)
    folder = work / "llama16m"
    if not (folder / "config.json").exists():
        subprocess.run(
            [str(REF / "python"), "-c", MAKE, str(folder)], check=True, env=dict(os.environ, **SINGLE)
        )
    rows = _interleaved_exports(folder, work, repeats, _run)
    floor = _import_floor(repeats)
    lines = [
        f"load average before timing decode: {os.getloadavg()}",
        "",
        "| measure | torchlower | reference | ratio |",
        "|---|---|---|---|",
    ]
    for tag in ("f32", "q4_0"):
        for label, k in (("wall s", 0), ("CPU s", 1)):
            ours = statistics.median(r[k] for r in rows[f"{tag} torchlower"])
            ref = statistics.median(r[k] for r in rows[f"{tag} reference"])
            lines.append(
                f"| export {tag} {label} (CLI, fresh process) | {ours:.2f} | {ref:.2f} | {ours / ref:.2f} |"
            )
    for label, k in (("wall s", 0), ("CPU s", 1)):
        ours, ref = (statistics.median(r[k] for r in floor[name]) for name in ("torchlower", "reference"))
        lines.append(
            f"| imports alone {label} (torch, transformers' Llama, the exporter) "
            f"| {ours:.2f} | {ref:.2f} | {ours / ref:.2f} |"
        )
    timed = _decode_times(
        {"torchlower": work / "tl-f32.nnef.tgz", "reference": _find_archive(work / "ref-f32")}, 15
    )
    for label, ms in timed.items():
        ours, ref = ms["torchlower"], ms["reference"]
        lines.append(f"| {label} ms (interleaved) | {ours:.2f} | {ref:.2f} | {ours / ref:.3f} |")
    sizes = [(work / "tl-f32.nnef.tgz").stat().st_size, _find_archive(work / "ref-f32").stat().st_size]
    lines.append(f"| f32 archive bytes | {sizes[0]:,} | {sizes[1]:,} | {sizes[0] / sizes[1]:.2f} |")
    q4 = [(work / "tl-q4_0.nnef.tgz").stat().st_size, _find_archive(work / "ref-q4_0").stat().st_size]
    lines.append(f"| q4_0 archive bytes | {q4[0]:,} | {q4[1]:,} | {q4[0] / q4[1]:.2f} |")
    lines.append(f"\nload average at the end: {os.getloadavg()}")
    print("\n".join(lines))


def _import_floor(repeats: int) -> dict[str, list[tuple[float, float]]]:
    """What each CLI's process pays before any work: its imports in a fresh interpreter, interleaved."""
    python = {"torchlower": sys.executable, "reference": str(REF / "python")}
    rows: dict[str, list[tuple[float, float]]] = {}
    for i in range(repeats):
        for name in ("torchlower", "reference") if i % 2 == 0 else ("reference", "torchlower"):
            rows.setdefault(name, []).append(_run([python[name], "-c", IMPORTS[name]]))
    return rows


def main_big(work: Path, repeats: int) -> None:
    """The ≥ 1 GB checkpoint of ``bench/llm_bigmem.py``: export wall time and peak RSS of both
    CLIs (fresh processes, interleaved, no check), f32 and Q4_0; import time is amortized here."""
    import json

    from bench.llm_bigmem import CONFIG

    os.environ.update(SINGLE)
    work.mkdir(parents=True, exist_ok=True)
    folder = work / "llama288m"
    if not (folder / "tokenizer.json").exists():
        subprocess.run([str(REF / "python"), "-c", BIG, str(folder), json.dumps(CONFIG)], check=True)
    checkpoint = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    rows = _interleaved_exports(folder, work, repeats, _run_rss, verbose=True)
    sizes = {}
    for tag in ("f32", "q4_0"):
        sizes[f"{tag} torchlower"] = (work / f"tl-{tag}.nnef.tgz").stat().st_size
        sizes[f"{tag} reference"] = _find_archive(work / f"ref-{tag}").stat().st_size
    lines = [
        f"checkpoint {checkpoint:,} bytes (f32 safetensors); repeats {repeats}; load average at the end:"
        f" {os.getloadavg()}",
        "",
        "| measure | torchlower | reference | ratio |",
        "|---|---|---|---|",
    ]
    for tag in ("f32", "q4_0"):
        ours, ref = rows[f"{tag} torchlower"], rows[f"{tag} reference"]
        for label, k, scale, fmt in (
            ("wall s", 0, 1, "{:.1f}"),
            ("CPU s", 2, 1, "{:.1f}"),
            ("peak RSS MB", 1, 1e-6, "{:,.0f}"),
        ):
            a, b = statistics.median(r[k] for r in ours) * scale, statistics.median(r[k] for r in ref) * scale
            lines.append(f"| export {tag} {label} | {fmt.format(a)} | {fmt.format(b)} | {a / b:.2f} |")
        a, b = sizes[f"{tag} torchlower"], sizes[f"{tag} reference"]
        lines.append(f"| {tag} archive bytes | {a:,} | {b:,} | {a / b:.2f} |")
    print("\n".join(lines))


if __name__ == "__main__":
    n = int(sys.argv[sys.argv.index("--repeats") + 1]) if "--repeats" in sys.argv else 3
    (main_big if "--big" in sys.argv else main)(Path(sys.argv[1]), n)
