"""Property: random op chains with a branch / ``.item()`` / loop count inserted never verify wrongly.

Each case ends in a typed error or an artifact verified at the example and random points that
then also matches PyTorch at fresh inputs (``tests/fuzz_values.py``). A bounded, derandomized
run for ``make test``; ``make fuzz N=10000 MODE=values`` runs the long campaign.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch
from hypothesis import HealthCheck, Phase, given, settings

import torchlower
from tests.fuzz_models import Case, Node
from tests.fuzz_values import OK, ValueCase, ValueModel, ValueRunner, judge, value_cases

CASES = 12


@settings(
    max_examples=CASES,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
@given(value_cases(max_ops=3))
def test_value_dependent_models_are_refused_or_verified(case: ValueCase) -> None:
    logging.getLogger("torchlower").setLevel(logging.ERROR)
    runner = ValueRunner()
    outcomes = runner.run(case)
    assert all(o.status in OK for o in outcomes), "\n".join(
        f"{o.status} ({o.frontend}): {o.detail[:600]}\n{case.describe()}"
        for o in outcomes
        if o.status not in OK
    )


def test_judge_allows_float32_noise_only_where_torch_itself_has_it() -> None:
    """The fuzz judge: float64 noise widens the tolerance of an ill-conditioned output only."""
    exact = np.array([1.0e7, 1.0], dtype=np.float64)
    torch32 = np.array([1.1e7, 1.0], dtype=np.float32)  # tan near pi/2: float32 is 1e6 off
    assert judge(0, torch32, exact, np.array([1.0e7, 1.0], dtype=np.float32))[0] == "noise"
    assert judge(0, torch32, exact, np.array([1.3e7, 1.0], dtype=np.float32))[0] == "noise"
    # far beyond torch's own error: wrong, even though the output is ill-conditioned
    assert judge(0, torch32, exact, np.array([9.0e7, 1.0], dtype=np.float32))[0] == "silent"
    # a well-conditioned output (torch float32 == float64) gets no allowance at all
    calm = np.array([2.0, 1.0], dtype=np.float32)
    assert judge(0, calm, calm.astype(np.float64), np.array([2.01, 1.0], dtype=np.float32))[0] == "silent"
    assert judge(0, calm, None, np.array([2.01, 1.0], dtype=np.float32))[0] == "silent"
    assert judge(0, calm, None, np.array([2.0001, 1.0], dtype=np.float32))[0] == "verified"
    assert judge(0, calm, None, np.ones(3, dtype=np.float32))[0] == "silent"  # shape
    # clamp(log(-1), 0): NaN in torch, 0 in tract (tract's min/max drop NaN): counted apart...
    nan = np.array([np.nan, 1.0], dtype=np.float32)
    assert judge(0, nan, nan.astype(np.float64), np.array([0.0, 1.0], dtype=np.float32))[0] == "nan"
    # ...but not when a finite element is wrong too, nor a number where torch is finite
    assert judge(0, nan, None, np.array([0.0, 1.5], dtype=np.float32))[0] == "silent"
    assert judge(0, calm, None, np.array([np.nan, 1.0], dtype=np.float32))[0] == "silent"


def test_judge_finds_an_artifact_that_is_wrong_at_fresh_inputs(tmp_path: Path) -> None:
    """End to end: an artifact of exp(x) · 2 judged against a model computing exp(x) · 3 is wrong."""
    x = torch.linspace(0.5, 2.0, 6).reshape(2, 3)
    case = Case(events=[None, Node("exp", (0,), (), {})], inputs=[x], outputs=[1])
    vc = ValueCase(case, "weight_item", 0.0)
    right, wrong = ValueModel.of(vc).eval(), ValueModel.of(vc).eval()
    wrong.scale.fill_(1.5)  # the weight the construct reads: sum 3 instead of 2
    path = torchlower.export(right, (x,), tmp_path / "m.nnef", frontend="fx").path
    runner = ValueRunner(("fx",))
    assert runner._fresh(right, (x,), path, "fx").status == "verified"
    outcome = runner._fresh(wrong, (x,), path, "fx")
    assert outcome.status == "silent", outcome
    assert outcome.detail.startswith("output 0: max abs")


def test_a_nan_through_clamp_now_verifies(tmp_path: Path) -> None:
    """clamp(log10(x), x) at negative fresh inputs: torch NaN, and tract NaN too since the clamp
    family keeps NaN (rules/nan.py; tract's min/max dropped it and the runner said ``nan``; the
    judge's ``nan`` class itself is tested above)."""
    x = torch.tensor(2.5)
    events = [None, Node("log10", (0,), (), {}), Node("clamp_tensor", (1, 0), (), {})]
    vc = ValueCase(Case(events=events, inputs=[x], outputs=[2]), "size_int", 1e6)
    model = ValueModel.of(vc).eval()
    path = torchlower.export(model, (x,), tmp_path / "m.nnef", frontend="jit").path
    outcome = ValueRunner(("jit",))._fresh(model, (x,), path, "jit")
    assert outcome.status == "verified", outcome
