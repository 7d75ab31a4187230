"""Property: every random model either verifies in tract or is refused at export with a typed error.

A bounded, derandomized run for ``make test`` (300 cases × every front end, about a minute);
``make fuzz N=10000`` runs the same property for long campaigns (tests/fuzz_campaign.py).
Cases come from the op catalogue (tests/fuzz_catalogue.py); a failure prints the case's program.
"""

from __future__ import annotations

import logging

from hypothesis import HealthCheck, Phase, given, settings

from tests.fuzz_harness import Runner
from tests.fuzz_models import Case, batches

BATCH = 25
BATCHES = 12


@settings(
    max_examples=BATCHES,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],  # no shrinking: the runner isolates the failing case
    suppress_health_check=list(HealthCheck),
)
@given(batches(BATCH, max_ops=5))
def test_random_models_verify_or_fail_typed(cases: list[Case]) -> None:
    logging.getLogger("torchlower").setLevel(logging.ERROR)  # training-mode and progress chatter
    runner = Runner()
    runner.run(cases)
    assert runner.counts["verified"] > 0
    problems = [f"{o.status} ({o.frontend}): {o.detail[:600]}\n{c.describe()}" for o, c in runner.failures]
    assert not problems, "\n\n".join(problems)
