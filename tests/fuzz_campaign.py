"""``make fuzz N=10000``: a long fuzzing campaign; prints cases run, verified, typed errors, mismatches.

Every generated case is run through every front end; a "case run" is one (case, front end).
Failures (mismatch, tract refusing an exported graph, raw exceptions) are printed with the case's
program so each can become a regression test. Exit status 1 if there was any.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import warnings

from hypothesis import HealthCheck, Phase, given, settings

from tests.fuzz_harness import Runner
from tests.fuzz_models import batches


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", type=int, default=10000, help="number of generated cases")
    parser.add_argument("--batch", type=int, default=25, help="cases per exported model")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-ops", type=int, default=5)
    parser.add_argument(
        "--mode",
        choices=["ops", "values", "special"],
        default="ops",
        help="ops: random op chains; values: op chains with a branch / .item() / loop count inserted;"
        " special: op chains fed NaN, ±inf, ±0, extreme normals and denormals (tests/fuzz_special.py)",
    )
    parser.add_argument("--frontends", default="jit,fx,export", help="values mode: front ends to run")
    opts = parser.parse_args(argv)
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    if opts.mode == "values":
        return values_campaign(opts.n, opts.seed, opts.max_ops, tuple(opts.frontends.split(",")))
    if opts.mode == "special":
        return special_campaign(opts.n, opts.seed, opts.batch, opts.max_ops, tuple(opts.frontends.split(",")))
    runner = Runner()
    started = time.monotonic()
    batches_needed = -(-opts.n // opts.batch)

    @settings(
        max_examples=batches_needed,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(batches(opts.batch, opts.max_ops))
    def campaign(cases: list) -> None:
        runner.run(cases)
        done = sum(runner.counts.values()) // len(runner.frontends)
        if done % (opts.batch * 10) == 0:
            print(f"  {done} cases, {dict(runner.counts)} ({time.monotonic() - started:.0f} s)", flush=True)

    campaign._hypothesis_internal_use_seed = opts.seed  # reproducible campaigns
    campaign()
    print(report(runner, time.monotonic() - started))
    return 1 if runner.failures else 0


def report(runner: Runner, seconds: float) -> str:
    runs = sum(runner.counts.values())
    lines = [
        f"cases: {runs // len(runner.frontends)} generated, {runs} case runs over "
        f"{', '.join(runner.frontends)} in {seconds:.0f} s",
        f"verified: {runner.counts['verified']}",
        f"typed errors: {runner.counts['typed']} "
        + ", ".join(f"{k} {v}" for k, v in runner.typed.most_common()),
        f"mismatches: {runner.counts['mismatch']}; tract refused an exported graph: "
        f"{runner.counts['tract']}; raw exceptions: {runner.counts['raw']}",
        "per front end: "
        + "; ".join(
            f"{fe}: "
            + ", ".join(
                f"{s} {runner.per_frontend[(fe, s)]}"
                for s in ("verified", "typed", "mismatch", "tract", "raw")
                if runner.per_frontend[(fe, s)]
            )
            for fe in runner.frontends
        ),
    ]
    for outcome, case in runner.failures:
        lines += ["", f"--- {outcome.status} ({outcome.frontend}): {outcome.detail[:800]}", case.describe()]
    return "\n".join(lines)


def values_campaign(n: int, seed: int, max_ops: int, frontends: tuple[str, ...]) -> int:
    """``--mode values``: every case must end typed or verified, never verified-but-wrong."""
    from tests.fuzz_values import OK, ValueRunner, value_cases

    runner = ValueRunner(frontends)
    started = time.monotonic()

    @settings(
        max_examples=n,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(value_cases(max_ops))
    def campaign(case: object) -> None:
        for outcome in runner.run(case):  # type: ignore[arg-type]
            if outcome.status not in OK:  # as it happens: a long run may be stopped early
                print(f"  !! {outcome.status} ({outcome.frontend}): {outcome.detail[:300]}", flush=True)
        done = sum(runner.counts.values()) // len(runner.frontends)
        if done % 250 == 0:
            print(f"  {done} cases, {dict(runner.counts)} ({time.monotonic() - started:.0f} s)", flush=True)

    campaign._hypothesis_internal_use_seed = seed  # type: ignore[attr-defined]
    try:
        campaign()
    except KeyboardInterrupt:  # `kill -INT`: stop early and report the cases run so far
        print("interrupted: the figures below are for the cases run until then", flush=True)
    runs = sum(runner.counts.values())
    lines = [
        f"value-dependence cases: {runs // len(runner.frontends)} generated, {runs} case runs over"
        f" {', '.join(runner.frontends)} in {time.monotonic() - started:.0f} s (seed {seed})",
        "outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(runner.counts.items())),
        f"silent wrong (verified, then wrong at fresh inputs): {runner.counts['silent']};"
        f" raw exceptions: {runner.counts['raw']}",
        "typed errors: " + ", ".join(f"{k} {v}" for k, v in runner.typed.most_common()),
        "by construct: "
        + "; ".join(
            f"{kind}: " + ", ".join(f"{s} {c}" for (k, s), c in sorted(runner.by_kind.items()) if k == kind)
            for kind in sorted({k for k, _ in runner.by_kind})
        ),
    ]
    for outcome, case in runner.failures:
        lines += ["", f"--- {outcome.status} ({outcome.frontend}): {outcome.detail[:800]}", case.describe()]
    for outcome, case in runner.noted[:40]:  # to triage by hand: check refusals, noise-only passes
        lines += ["", f"--- note: {outcome.status} ({outcome.frontend}): {outcome.detail[:800]}"]
        lines.append(case.describe())
    print("\n".join(lines))
    return 1 if runner.failures else 0


def special_campaign(n: int, seed: int, batch: int, max_ops: int, frontends: tuple[str, ...]) -> int:
    """``--mode special``: every case verified position by position, typed, or refused by
    ``check="special"``; never ``silent``."""
    from tests.fuzz_special import OK, SpecialRunner, special_batches

    runner = SpecialRunner(frontends)
    started = time.monotonic()

    @settings(
        max_examples=-(-n // batch),
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(special_batches(batch, max_ops))
    def campaign(cases: list) -> None:
        for outcome in runner.run(cases):
            if outcome.status not in OK:  # with the program: a long run may be stopped early
                print(f"  !! {outcome.status} ({outcome.frontend}): {outcome.detail[:300]}", flush=True)
                print(cases[outcome.case].describe()[:3000], flush=True)
        done = sum(runner.counts.values()) // len(runner.frontends)
        if done % (batch * 10) == 0:
            print(f"  {done} cases, {dict(runner.counts)} ({time.monotonic() - started:.0f} s)", flush=True)

    campaign._hypothesis_internal_use_seed = seed  # type: ignore[attr-defined]
    try:
        campaign()
    except KeyboardInterrupt:
        print("interrupted: the figures below are for the cases run until then", flush=True)
    runs = sum(runner.counts.values())
    statuses = ("verified", "typed", "check", "noise", "silent", "torch", "tract", "raw")
    lines = [
        f"special-values cases: {runs // len(frontends)} generated, {runs} case runs over"
        f" {', '.join(frontends)} in {time.monotonic() - started:.0f} s (seed {seed})",
        "| | " + " | ".join(frontends) + " | total |",
        *(
            f"| {s} | "
            + " | ".join(str(runner.per_frontend[(fe, s)]) for fe in frontends)
            + f" | {runner.counts[s]} |"
            for s in statuses
        ),
        "typed errors: " + ", ".join(f"{k} {v}" for k, v in runner.typed.most_common()),
    ]
    for outcome, case in runner.failures:
        lines += ["", f"--- {outcome.status} ({outcome.frontend}): {outcome.detail[:800]}", case.describe()]
    for outcome, case in runner.refused[:30]:
        lines += ["", f"--- {outcome.status} ({outcome.frontend}): {outcome.detail[:500]}"]
        lines.append(case.describe())
    print("\n".join(lines))
    return 1 if runner.failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
