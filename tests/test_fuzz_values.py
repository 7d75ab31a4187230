"""Property: random op chains with a branch / ``.item()`` / loop count inserted never verify wrongly.

Each case ends in a typed error or an artifact verified at the example and random points that
then also matches PyTorch at fresh inputs (``tests/fuzz_values.py``). A bounded, derandomized
run for ``make test``; ``make fuzz N=10000 MODE=values`` runs the long campaign.
"""

from __future__ import annotations

import logging

from hypothesis import HealthCheck, Phase, given, settings

from tests.fuzz_values import OK, ValueCase, ValueRunner, value_cases

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
