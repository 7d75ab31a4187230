"""Decode ms/token of torchlower.llm's f32 archive vs the reference's (torch-to-nnef-llm 0.24.12),
tiny and ~16 M-parameter Llama, both archives loaded in one tract and timed interleaved.

    python -m bench.llm_decode_ab WORKDIR [--rounds 9] [--burst 5]

Needs ``.venv-llmref`` as described in ``bench/llm_reference.py`` (its export commands and shim are
reused). For each size: the checkpoint is written by the reference venv's transformers 4.57, both
CLIs export it (f32, no check), then decode (S = 1) at P = 16 / 128 / 1024 and prefill of 16
and 128 tokens are timed round after round in alternation (rotating who goes first), medians, with the
load average. Single-threaded.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.llm_reference import (
    MAKE,
    REF,
    SINGLE,
    _feeds,
    _find_archive,
    _interleaved_cpu,
    _ours,
    _reference,
    _run,
)

SIZES = {  # name -> (hidden, intermediate, layers, heads, kv heads, vocab)
    "tiny": (64, 128, 2, 4, 2, 256),
    "16M": (256, 688, 4, 8, 4, 32000),
}


def _make(folder: Path, size: str) -> None:
    hidden, inter, layers, heads, kv, vocab = SIZES[size]
    script = (
        MAKE.replace("vocab_size=32000", f"vocab_size={vocab}")
        .replace("hidden_size=256", f"hidden_size={hidden}")
        .replace("intermediate_size=688", f"intermediate_size={inter}")
        .replace("num_hidden_layers=4", f"num_hidden_layers={layers}")
        .replace("num_attention_heads=8", f"num_attention_heads={heads}")
        .replace("num_key_value_heads=4", f"num_key_value_heads={kv}")
        .replace("range(32000)", f"range({vocab})")
    )
    env = dict(os.environ, **SINGLE)
    subprocess.run([str(REF / "python"), "-c", script, str(folder)], check=True, env=env)


def main(work: Path, rounds: int, burst: int) -> None:
    import tract

    from bench.exporters import tract_shim

    os.environ.update(SINGLE)
    work.mkdir(parents=True, exist_ok=True)
    shim = tract_shim(Path(tempfile.mkdtemp(prefix="shim-", dir=work)))
    nnef = tract.nnef().with_tract_extra().with_tract_transformers()
    lines = ["| model | measure | torchlower ms | reference ms | ratio | CPU ms ratio | load avg |"]
    lines.append("|---|---|---|---|---|---|---|")
    for size in SIZES:
        folder = work / f"llama-{size}"
        if not (folder / "config.json").exists():
            _make(folder, size)
        ours, ref = work / f"tl-{size}.nnef.tgz", work / f"ref-{size}"
        if not ours.exists():
            _run(_ours(folder, ours, None))
        if not ref.exists():
            _run(_reference(folder, ref, shim, None))
        models = {"torchlower": nnef.load(str(ours)), "reference": nnef.load(str(_find_archive(ref)))}
        facts = {k: [str(m.input_fact(i)) for i in range(1, m.input_count())] for k, m in models.items()}
        runs = {k: m.into_runnable() for k, m in models.items()}
        vocab = SIZES[size][5]
        for label, past, seq in (("decode P=16", 16, 1), ("decode P=128", 128, 1), ("decode P=1024", 1024, 1),
                                 ("prefill 16", 0, 16), ("prefill 128", 0, 128)):  # fmt: skip
            rng = np.random.default_rng(0)
            feeds = {k: _feeds(facts[k], past, seq, vocab, rng) for k in models}
            med, cpu = _interleaved_cpu(runs, feeds, rounds, burst)
            ratio, cpu_ratio = med["torchlower"] / med["reference"], cpu["torchlower"] / cpu["reference"]
            line = f"| {size} | {label} | {med['torchlower']:.3f} | {med['reference']:.3f} | {ratio:.3f} | "
            line += f"{cpu_ratio:.3f} | "
            lines.append(line + f"{os.getloadavg()[0]:.1f} |")
            print(lines[-1], flush=True)
    print("\n".join(lines))


if __name__ == "__main__":
    args = sys.argv[1:]
    r = int(args[args.index("--rounds") + 1]) if "--rounds" in args else 9
    b = int(args[args.index("--burst") + 1]) if "--burst" in args else 5
    main(Path(args[0]), r, b)
