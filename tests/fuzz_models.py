"""Random small models from the op catalogue: ``cases()`` draws one, ``BatchModel`` runs many at once.

A ``Case`` is a DAG: a list of events, each either a fresh input or an op applied to earlier
values (plus constant weights). Its outputs are the values nothing consumed. Many cases are
packed into one ``BatchModel`` so one export and one tract run cover them all.
Independent of torchlower.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from hypothesis import assume
from hypothesis import strategies as st
from torch import nn

from tests.fuzz_catalogue import BY_NAME, KINDS, MAX_NUMEL, OPS, Draw, Spec


@dataclass(frozen=True)
class Node:
    op: str
    inputs: tuple[int, ...]
    weights: tuple[int, ...]
    params: dict[str, Any]


@dataclass
class Case:
    """Events in creation order: ``None`` binds the next input, a ``Node`` computes a value."""

    events: list[Node | None] = field(default_factory=list)
    inputs: list[torch.Tensor] = field(default_factory=list)
    weights: list[torch.Tensor] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)

    def describe(self) -> str:
        """A readable program, enough to write a regression test by hand."""
        lines, n_in = [], 0
        for i, ev in enumerate(self.events):
            if ev is None:
                t = self.inputs[n_in]
                lines.append(f"v{i} = input {tuple(t.shape)} {t.dtype}")
                n_in += 1
            else:
                args = ", ".join(
                    [f"v{j}" for j in ev.inputs] + [f"w{k}{tuple(self.weights[k].shape)}" for k in ev.weights]
                )
                params = ", ".join(f"{k}={v!r}" for k, v in ev.params.items())
                lines.append(f"v{i} = {ev.op}({args}{', ' if params and args else ''}{params})")
        lines.append(f"outputs: {', '.join(f'v{i}' for i in self.outputs)}")
        return "\n".join(lines)


def run_case(case: Case, xs: tuple[torch.Tensor, ...], weights: list[torch.Tensor]) -> list[torch.Tensor]:
    env: list[torch.Tensor] = []
    it = iter(xs)
    for ev in case.events:
        if ev is None:
            env.append(next(it))
        else:
            op = BY_NAME[ev.op]
            env.append(op.fn(*(env[i] for i in ev.inputs), *(weights[k] for k in ev.weights), **ev.params))
    return [env[i] for i in case.outputs]


class CaseModule(nn.Module):
    """One case; weights are buffers so every front end sees them as constants."""

    def __init__(self, case: Case) -> None:
        super().__init__()
        self.case = case
        for k, w in enumerate(case.weights):
            self.register_buffer(f"w{k}", w.clone())

    def forward(self, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        weights = [getattr(self, f"w{k}") for k in range(len(self.case.weights))]
        return tuple(run_case(self.case, xs, weights))


class BatchModel(nn.Module):
    """Several cases side by side: takes their inputs in order, returns all their outputs.

    ``forward`` has one named parameter per input (FX cannot trace ``*args``), so each arity
    gets its own subclass: build with ``BatchModel.of(cases)``.
    """

    _classes: ClassVar[dict[int, type[BatchModel]]] = {}

    def __init__(self, cases: list[Case]) -> None:
        super().__init__()
        self.parts = nn.ModuleList(CaseModule(c) for c in cases)
        self.arity = [len(c.inputs) for c in cases]

    @classmethod
    def of(cls, cases: list[Case]) -> BatchModel:
        n = sum(len(c.inputs) for c in cases)
        if n not in cls._classes:
            names = ", ".join(f"x{i}" for i in range(n))
            scope: dict[str, Any] = {}
            exec(f"def forward(self, {names}):\n    return self.run(({names},))", scope)
            cls._classes[n] = type(f"BatchModel{n}", (cls,), {"forward": scope["forward"]})
        return cls._classes[n](cases)

    def run(self, xs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        outs: list[torch.Tensor] = []
        start = 0
        for part, n in zip(self.parts, self.arity, strict=True):
            outs.extend(part(*xs[start : start + n]))
            start += n
        return tuple(outs)


def batch_inputs(cases: list[Case]) -> tuple[torch.Tensor, ...]:
    return tuple(t for c in cases for t in c.inputs)


def output_owner(cases: list[Case]) -> list[int]:
    """For each output of the batch model, the index of its case."""
    return [i for i, c in enumerate(cases) for _ in c.outputs]


# ---- drawing ---------------------------------------------------------------------------------
def make_input(d: Draw, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(d(st.integers(0, 2**20)))
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) < 0.5
    if dtype == torch.int64:
        return torch.randint(-5, 6, shape, generator=g)
    if d(st.booleans()):  # halves: ties for rounding, clamping and comparisons
        return torch.randint(-8, 9, shape, generator=g).float() / 2
    return torch.randn(shape, generator=g) * d(st.sampled_from([1.0, 3.0]))


SHAPES = st.lists(st.integers(1, 5), min_size=0, max_size=4).map(tuple)
DTYPES = st.sampled_from([torch.float32] * 6 + [torch.int64] * 2 + [torch.bool])


@st.composite
def cases(draw: Draw, max_ops: int = 4) -> Case:
    """One random DAG of 1..max_ops catalogue ops on fresh inputs, valid in PyTorch."""
    case = Case()
    values: list[torch.Tensor] = []
    specs: list[Spec] = []
    used: set[int] = set()

    def new_input(shape: tuple[int, ...], dtype: torch.dtype) -> int:
        t = make_input(draw, shape, dtype)
        case.events.append(None)
        case.inputs.append(t)
        values.append(t)
        specs.append(Spec(tuple(t.shape), t.dtype, True))
        return len(values) - 1

    new_input(draw(SHAPES), draw(DTYPES))
    for _ in range(draw(st.integers(1, max_ops))):
        # NaN and inf are checked where they are produced, not fed on: tract's max/min, relu,
        # clamp, sigmoid… drop NaN where torch propagates it (docs/reliability.md, "Fuzzing")
        clean = [i for i, s in enumerate(specs) if not s.nan]
        src = clean[-1] if draw(st.integers(0, 2)) else draw(st.sampled_from(clean))
        x = specs[src]
        fits = [
            op
            for op in OPS
            if x.kind in op.kinds and x.rank >= op.min_rank and (x.exact or not op.discontinuous)
        ]
        op = draw(st.sampled_from(fits))
        args = op.args(draw, x)
        if args is None:
            continue
        operands = [src]
        for shape, dtype in args.others:
            same = [i for i, s in enumerate(specs) if s.shape == shape and s.dtype == dtype and i != src]
            fine = same and (specs[same[-1]].exact or not op.discontinuous) and not specs[same[-1]].nan
            reuse = fine and draw(st.booleans())
            operands.append(same[-1] if reuse else new_input(shape, dtype))
        try:
            out = op.fn(*(values[i] for i in operands), *args.weights, **args.params)
        except (RuntimeError, ValueError, TypeError, IndexError, ZeroDivisionError):
            continue  # not a valid PyTorch call: PyTorch itself refuses it
        if not isinstance(out, torch.Tensor) or out.dtype not in KINDS or not 0 < out.numel() <= MAX_NUMEL:
            continue
        first = len(case.weights)
        case.weights.extend(args.weights)
        case.events.append(
            Node(op.name, tuple(operands), tuple(range(first, len(case.weights))), args.params)
        )
        used.update(operands)
        exact = op.exact and all(specs[i].exact for i in operands)
        values.append(out)
        nan = bool(out.dtype == torch.float32 and not out.isfinite().all())
        specs.append(Spec(tuple(out.shape), out.dtype, exact, nan))
    nodes = [i for i, ev in enumerate(case.events) if ev is not None]
    assume(nodes)
    case.outputs = [i for i in nodes if i not in used]
    return case


@st.composite
def batches(draw: Draw, size: int, max_ops: int = 4) -> list[Case]:
    return [draw(cases(max_ops)) for _ in range(size)]
