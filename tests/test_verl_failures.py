"""Real verl failures, produced by this project's verl CPU runs (``tests/verl_cpu_failures.sh``,
the overrides or the kill in each excerpt's header; the trainer SIGKILLed under the service by
``tests/test_verl_resume_real.py``, the rollout server under ``tests/verl_run.py``'s service),
named from the log the service keeps: the
job log copied in the follower's way (chunks, the kept tail of ``log_keep_chars``) and read back
as a failed run's failure is settled."""

from __future__ import annotations

import pytest

from service.metrics import logcopy
from service.recovery import explain
from service.settings.signals import MetricsSettings
from service.store.db import Database
from service.store.models import Run
from service.store.status import RunStatus
from tests.factories import add_run
from tests.failure_corpus import RULE_SET, Excerpt, load

MADE_HERE = {"tests/verl_cpu_failures.sh", "tests/test_verl_resume_real.py", "tests/verl_run.py"}
RUNS = [e for e in load(RULE_SET) if e.source in MADE_HERE]
# A chunk as the follower stores it (a read of Ray's tail stream).
CHUNK = 64 * 1024


def test_each_way_users_see_verl_fail_was_produced_for_real() -> None:
    assert {e.cls for e in RUNS} >= {"missing_path", "config_error", "host_oom", "actor_died"}


@pytest.mark.parametrize("excerpt", RUNS, ids=[e.path.stem for e in RUNS])
def test_a_real_verl_failure_is_named_from_the_log_the_service_kept(
    db: Database, excerpt: Excerpt
) -> None:
    run_id = add_run(db, status=RunStatus.FAILED)
    keep = MetricsSettings().log_keep_chars
    with db.transaction() as s:
        for start in range(0, len(excerpt.body), CHUNK):
            logcopy.append(s, run_id, start, excerpt.body[start : start + CHUNK], keep)
        run = s.get(Run, run_id)
        assert run is not None
        failure = explain.failure_of(s, run)
    assert failure is not None and failure.cls == excerpt.cls, failure
    # The evidence is the run's own lines, not the warnings every verl CPU run prints.
    assert not any("Warning: " in e.line for e in failure.evidence), failure.evidence
