"""Per-node profile of LLM archives side by side: tract's ``profile_json``, minimum per node.

    python -m bench.llm_profile NAME=ARCHIVE [NAME=ARCHIVE ...] [--past 128] [--seq 1] [--repeats 15]
                                [--nodes SUBSTRING|all]

Loads every archive in one tract (single-threaded), feeds each the same shapes (``input_ids``
[1, seq], caches [1, kv, past, head_dim] of random values) and profiles them in alternation,
``--repeats`` times. Prints, per archive, the sum over nodes of each node's *minimum* time and
that sum by op; ``--nodes`` lists the nodes (in plan order) whose name contains the substring.

Why minima: on this shared machine one ``profile_json`` of a decode step swings by 2x with the
load (the LM head node alone read 1.36-3.6 ms in one afternoon), so a single profile of each
archive is no ratio; the per-node minimum over interleaved repeats is stable to a few percent.
Node sums run a few percent above a plain ``run`` (profiling overhead): compare them with each
other, and wall times with ``bench/llm_decode_ab.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.llm_reference import SINGLE, _feeds


def profile(
    paths: dict[str, str], past: int, seq: int, repeats: int
) -> dict[str, list[tuple[str, str, float]]]:
    """Per archive: (node name, op name, minimum µs) in plan order."""
    import tract

    nnef = tract.nnef().with_tract_extra().with_tract_transformers()
    runs, feeds = {}, {}
    for name, path in paths.items():
        model = nnef.load(path)
        facts = [str(model.input_fact(i)) for i in range(1, model.input_count())]
        vocab = int(str(model.output_fact(0)).split(",")[-2])
        runs[name] = model.into_runnable()
        feeds[name] = _feeds(facts, past, seq, vocab, np.random.default_rng(0))
        runs[name].run(feeds[name])
    times: dict[str, dict[str, float]] = {k: defaultdict(lambda: float("inf")) for k in runs}
    plans: dict[str, list[tuple[str, str]]] = {}
    for _ in range(repeats):
        for name, runnable in runs.items():
            nodes = json.loads(runnable.profile_json(feeds[name]))["nodes"]
            plans.setdefault(name, [(n.get("node_name", "?"), n.get("op_name", "?")) for n in nodes])
            for n in nodes:
                key = n.get("node_name", "?")
                times[name][key] = min(times[name][key], float(n.get("secs_per_iter", 0.0)) * 1e6)
    return {k: [(node, op, times[k][node]) for node, op in plan] for k, plan in plans.items()}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("archives", nargs="+", help="NAME=PATH (archive or extracted folder)")
    p.add_argument("--past", type=int, default=128)
    p.add_argument("--seq", type=int, default=1)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--nodes", default=None)
    a = p.parse_args(argv)
    os.environ.update(SINGLE)
    paths = dict(item.split("=", 1) for item in a.archives)
    result = profile(paths, a.past, a.seq, a.repeats)
    print(
        f"P={a.past} S={a.seq}, minimum of {a.repeats} interleaved profiles; load average {os.getloadavg()}"
    )
    for name, nodes in result.items():
        by_op: dict[str, float] = defaultdict(float)
        for _, op, us in nodes:
            by_op[op] += us
        print(f"== {name}: {sum(us for _, _, us in nodes):.1f} µs over {len(nodes)} nodes")
        print("   " + ", ".join(f"{op} {us:.1f}" for op, us in sorted(by_op.items(), key=lambda x: -x[1])))
        for node, op, us in nodes:
            if a.nodes is not None and (a.nodes == "all" or a.nodes in node):
                print(f"   {us:9.1f} {op:20s} {node}")


if __name__ == "__main__":
    main()
