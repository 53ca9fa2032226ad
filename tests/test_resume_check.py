"""An attempt that resumes is checked after the fact: verl's own words on where it started
(the checkpoint its trainer loaded, its parameter version, its rollouter's data position) and
its first synced version, against the checkpoint the launcher said it resumes from. A restart
from 0 or an offset is an event and the run's health ``resume_mismatch`` within one sync, with
both numbers; a correct resume is not flagged."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from service.loops.follower import Follower
from service.metrics.health import HealthRules
from service.metrics.log_readers import WholeLogReader
from service.metrics.parse import parse_line
from service.metrics.resumed import mismatch
from service.store.db import Database
from service.store.models import RunEvent
from service.store.status import RunStatus
from tests.factories import add_run, read_run
from tests.failure_corpus import RULE_SET
from tests.fake_ray import FakeRay
from tests.verl_resume_check import assert_resumed_where_said

CK = "/data/checkpoints/r1"
ANNOUNCE = 'rlrun resume: {{"step": {step}, "path": "' + CK + '/global_step_{step}"}}\n'
# verl 0.9.1's fully async trainer resuming from global_step_3, as its actors print it.
TRAINER, ROLLOUTER = "(FullyAsyncTrainer pid=71) ", "(FullyAsyncRollouter pid=72) "
LOADED = (
    f"{TRAINER}[FullyAsyncTrainer] Load from checkpoint folder: {CK}/global_step_{{w}}\n"
    f"{TRAINER}[FullyAsyncTrainer] Setting global step to {{g}}, current_param_version to {{w}}\n"
    f"{ROLLOUTER}[FullyAsyncRollouter] Loaded dataloader state from "
    f"{CK}/global_step_{{d}}/data.pt\n"
)
STEP = (
    "(FullyAsyncTaskRunner pid=70) step:{n} - fully_async/count/current_param_version:{v}"
    " - training/global_step:{n}\n"
)


def _lines(text: str) -> list:  # type: ignore[type-arg]
    return [m for line in text.splitlines() if (m := parse_line(line)) is not None]


def test_a_correct_resume_is_not_flagged() -> None:
    text = LOADED.format(w=3, g=4, d=3) + STEP.format(n=4, v=3) + STEP.format(n=5, v=4)
    assert mismatch(3, text, _lines(text)) is None


@pytest.mark.parametrize(
    ("text", "said"),
    [
        # resume_mode=disable, or a tracker verl could not read: no word of a checkpoint, and
        # the first synced version is 0
        (STEP.format(n=1, v=0), "its first synced parameter version is 0 (restarted from 0)"),
        (LOADED.format(w=1, g=2, d=1), "loaded the checkpoint of step 1 (an offset of -2)"),
        (
            LOADED.format(w=3, g=4, d=2),
            "rollouter loaded its data position of step 2 (an offset of -1)",
        ),
        (
            "(FullyAsyncRollouter pid=72) [FullyAsyncRollouter] Training from scratch "
            "(no checkpoint found)\n",
            "read its data from the start",
        ),
        (
            f"{TRAINER}[FullyAsyncTrainer] _fit_update_weights, timing_s/param_sync: 7.41 seconds "
            "self.current_param_version: 0\n",
            "synced the rollout's weights at version 0 (restarted from 0)",
        ),
    ],
    ids=["restart-from-0", "older-checkpoint", "data-offset", "data-from-scratch", "first-sync"],
)
def test_a_restart_or_an_offset_names_both_numbers(text: str, said: str) -> None:
    reason = mismatch(3, text, _lines(text))
    assert reason is not None and said in reason, reason
    assert reason.startswith("resumed from checkpoint step 3, but ")


def test_an_attempt_from_scratch_has_nothing_to_check() -> None:
    assert mismatch(0, STEP.format(n=1, v=0), _lines(STEP.format(n=1, v=0))) is None


def _follow(db: Database, parts: list[str]) -> tuple[str, str | None, list[str]]:
    run_id, ray = add_run(db, "r1", RunStatus.RUNNING), FakeRay()
    follower = Follower(db, ray, "one", 30, 10_000, HealthRules(), reader=WholeLogReader(ray))
    ray.log[run_id] = ""
    for part in parts:
        ray.log[run_id] += part
        follower.tick()
    run, _ = read_run(db, run_id)
    with db.transaction() as s:
        events = list(s.scalars(select(RunEvent.reason).where(RunEvent.run_id == run_id)))
    return run.health, run.health_reason, events


def test_the_follower_flags_a_resumed_attempt_that_restarted_within_one_sync(
    db: Database,
) -> None:
    # The launcher said step 2; verl was told resume_mode=disable: its first step line says 0.
    health, reason, events = _follow(
        db, [ANNOUNCE.format(step=2), STEP.format(n=1, v=0), STEP.format(n=2, v=1)]
    )
    assert health == "resume_mismatch", (health, reason)
    assert reason == (
        "resumed from checkpoint step 2, but its first synced parameter version is 0 "
        "(restarted from 0)"
    )
    assert [e for e in events if e.startswith("health resume_mismatch")] == [
        f"health resume_mismatch: {reason}"
    ]


def test_the_follower_leaves_a_correct_resume_alone(db: Database) -> None:
    health, _, events = _follow(
        db,
        [
            ANNOUNCE.format(step=3) + LOADED.format(w=3, g=4, d=3),
            STEP.format(n=4, v=3),
            STEP.format(n=5, v=4),
        ],
    )
    assert health == "ok"
    assert not [e for e in events if "resume_mismatch" in e]


def _body(name: str) -> str:
    text = (RULE_SET / name).read_text()
    return "".join(line for line in text.splitlines(keepends=True) if not line.startswith("# "))


@pytest.mark.parametrize("name", ["actor_died-11.log", "actor_died-12.log"])
def test_a_real_verl_start_from_step_0_under_a_resume_is_flagged_and_named(
    db: Database, name: str
) -> None:
    # Real verl 0.9.1 job logs of attempts that started from scratch (the service's own runs):
    # what verl prints under resume_mode=disable or with its checkpoints gone. Said to resume
    # from step 2 (the launcher's line first), the first weight sync gives it away.
    health, reason, _ = _follow(db, [ANNOUNCE.format(step=2), _body(name)])
    assert (health, reason) == (
        "resume_mismatch",
        "resumed from checkpoint step 2, but verl's trainer synced the rollout's weights at "
        "version 0 (restarted from 0)",
    )
    with pytest.raises(AssertionError, match="restarted from 0"):
        assert_resumed_where_said(_body(name), 2)
