"""Records which test proved which rule in tract (see ``torchlower/coverage.py``).

- Always: every export whose tract check passed reports its rule keys; a rule counts as
  proven by a test only when that whole test passed.
- ``TORCHLOWER_RECORD_COVERAGE=1``: write the record ``torchlower/rules/ops_coverage.json`` (run the
  whole suite: a key no test of this run proved is dropped).
- ``TORCHLOWER_RECORD_COVERAGE=merge``: add the proofs of keys the committed record lacks (for a
  targeted run; recorded proofs stay as they are).
- ``TORCHLOWER_VERIFY_COVERAGE=1`` (``make test``): fail the run when a rule the committed
  record claims as proven was not proven by a passing test in this run.
Works under pytest-xdist: workers send their findings to the controller.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import pytest

from torchlower.rules import coverage

_current: set[str] = set()
_proofs: dict[str, str] = {}


def _observe(keys: Sequence[str]) -> None:
    _current.update(keys)


coverage.subscribe(_observe)


def _add(proofs: dict[str, str]) -> None:
    for key, test in proofs.items():
        if key not in _proofs or test < _proofs[key]:  # deterministic whatever the order
            _proofs[key] = test


def pytest_runtest_setup(item: pytest.Item) -> None:
    _current.clear()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.passed:
        _add(dict.fromkeys(_current, item.nodeid))


def pytest_testnodedown(node, error) -> None:  # type: ignore[no-untyped-def]
    _add(json.loads(node.workeroutput.get("rule_proofs", "{}")))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: hand over to the controller
        workeroutput["rule_proofs"] = json.dumps(_proofs)
        return
    mode = os.environ.get("TORCHLOWER_RECORD_COVERAGE")
    if mode in ("1", "merge"):
        proofs = {**_proofs, **coverage.proofs()} if mode == "merge" else _proofs
        record = {"proofs": dict(sorted(proofs.items()))}
        coverage.RECORD.write_text(json.dumps(record, indent=1) + "\n")
    if os.environ.get("TORCHLOWER_VERIFY_COVERAGE") == "1":
        lost = sorted(set(coverage.proofs()) - set(_proofs))
        if lost:
            reporter = session.config.pluginmanager.get_plugin("terminalreporter")
            message = (
                f"{len(lost)} rule(s) listed as proven in torchlower/rules/ops_coverage.json were not proven"
                f" by a passing test in this run: {', '.join(lost[:20])}. Fix the tests or run"
                " `make ops-doc`."
            )
            if reporter is not None:
                reporter.write_line(message, red=True)
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
