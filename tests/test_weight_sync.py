"""Each weight sync proven by its digests: the trainer's line for a version and a rollout's line
of what its model loaded (``jobs.weight_digest``), paired by the follower as a real log gives
them (in either order, over several reads). A sync the rollout did not take reads unhealthy by
the next sync, naming the version and both digests; a proven run stays ok."""

from __future__ import annotations

import hashlib

import pytest
import torch

from jobs import weight_digest
from service.loops.follower import Follower
from service.metrics.health import HealthRules
from service.metrics.log_readers import WholeLogReader
from service.metrics.parse import WeightDigest, parse_weights
from service.recipes.base import Launch
from service.scheduling.shape import Group, ResourceShape
from service.store.db import Database
from service.store.status import RunStatus
from tests.factories import add_run, read_run
from tests.fake_ray import FakeRay

ENGINE = "actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=jobs.verl_cpu.weights"
TRAINER = "(WorkerDict pid=7, ip=10.0.0.1) "
ROLLOUT = "(vLLMHttpServer pid=9, ip=10.0.0.1) "


def _digest(n: int) -> str:
    return hashlib.sha256(str(n).encode()).hexdigest()


def _trainer(version: int, digest: str) -> str:
    line = weight_digest.line({"side": "trainer", "version": version, "digest": digest})
    return f"{TRAINER}{line}\n"


def _rollout(digest: str, read_back: tuple[int, int] = (9, 9)) -> str:
    record = {"side": "rollout", "digest": digest, "read_back": list(read_back)}
    return f"{ROLLOUT}{weight_digest.line(record)}\n"


def _synced(version: int) -> str:
    return (
        "(FullyAsyncTrainer pid=5, ip=10.0.0.1) [FullyAsyncTrainer] _fit_update_weights, "
        f"timing_s/param_sync: 0.1 seconds self.current_param_version: {version}\n"
    )


def _follow(
    db: Database, *reads: str, engine: bool = True, run_id: str = "r1"
) -> tuple[str, list[str], dict[str, object]]:
    """The run's health, events and weight-sync state after the follower read ``reads`` one
    tick each."""
    argv = ["python3", "-m", "verl", *([ENGINE] if engine else [])]
    one = ResourceShape(groups=(Group("trainer", 1, 1.0), Group("rollout", 1, 1.0)))
    launch = Launch(argv=argv, runtime_env={}, shape=one).as_dict()
    run_id, ray = add_run(db, run_id, RunStatus.RUNNING, launch=launch), FakeRay()
    follower = Follower(db, ray, "one", 30, 10_000, HealthRules(), reader=WholeLogReader(ray))
    ray.log[run_id] = ""
    for text in reads:
        ray.log[run_id] += text
        follower.tick()
    run, events = read_run(db, run_id)
    return f"{run.health}: {run.health_reason}", events, dict(run.weight_syncs or {})


def test_digests_of_the_same_weights_agree_whatever_their_order_and_differ_on_one_value() -> None:
    weights = {"a.weight": torch.arange(6.0).reshape(2, 3), "b.bias": torch.ones(3)}
    forward, backward = weight_digest.Digest(), weight_digest.Digest()
    forward.add_all(weights.items())
    backward.add_all(reversed(list(weights.items())))
    assert forward.hexdigest() == backward.hexdigest() and forward.tensors == 2
    changed = weight_digest.Digest()
    changed.add_all({**weights, "b.bias": torch.tensor([1.0, 1.0, 1.0 + 1e-6])}.items())
    assert changed.hexdigest() != forward.hexdigest()
    reshaped = weight_digest.Digest()
    reshaped.add_all({**weights, "a.weight": torch.arange(6.0).reshape(3, 2)}.items())
    assert reshaped.hexdigest() != forward.hexdigest()


def test_the_parser_reads_both_sides_and_refuses_what_is_not_a_digest_line() -> None:
    d = _digest(1)
    assert parse_weights(_trainer(3, d)) == WeightDigest("trainer", d, version=3)
    assert parse_weights(_rollout(d, (4, 5))) == WeightDigest("rollout", d, read_back=(4, 5))
    for bad in (
        _trainer(3, "abc"),
        _trainer(-1, d),
        _rollout(d, (1,)),  # type: ignore[arg-type]
        f"{TRAINER}rlrun weights: {{not json\n",
        f'{TRAINER}rlrun weights: {{"side": "judge", "digest": "{d}"}}\n',
        f"{TRAINER}step:1 - a:1\n",
    ):
        assert parse_weights(bad) is None, bad


def test_a_run_whose_every_sync_is_proven_stays_healthy_whatever_order_the_sides_come_in(
    db: Database,
) -> None:
    health, events, state = _follow(
        db,
        _trainer(0, _digest(0)) + _rollout(_digest(0)) + _synced(0),
        _rollout(_digest(1)),  # the rollout's line before the trainer's
        _trainer(1, _digest(1)) + _synced(1),
        _trainer(2, _digest(2)) + _rollout(_digest(2)) + _rollout(_digest(2)) + _synced(2),
        _trainer(3, _digest(3)) + _synced(3) + _rollout(_digest(3)),
    )
    assert health == "ok: None", (health, events)
    assert state["proven"] == 4 and state["last_version"] == 3, state
    assert state["last_digest"] == _digest(3) and not state["pending"], state
    assert not [e for e in events if "weight sync" in e]


def test_a_rollout_that_kept_its_old_weights_is_flagged_at_the_next_sync_naming_both_digests(
    db: Database,
) -> None:
    stale = _digest(0)
    health, events, _ = _follow(
        db,
        _trainer(0, stale) + _rollout(stale) + _synced(0),
        _trainer(1, _digest(1)) + _rollout(stale) + _synced(1),
        _trainer(2, _digest(2)) + _rollout(stale) + _synced(2),
    )
    assert health.startswith("weights_unsynced: version 1's weights"), health
    assert _digest(1)[:12] in health and f"version 0's ({stale[:12]})" in health, health
    assert "by version 2's sync" in health
    assert [e for e in events if e.startswith("weight sync not proven: version 1's")], events


def test_a_rollout_whose_model_reads_back_other_values_is_flagged_at_once(db: Database) -> None:
    health, _, _ = _follow(db, _trainer(0, _digest(0)) + _rollout(_digest(0), (7, 9)))
    assert health.startswith("weights_unsynced: the rollout's model holds other weights"), health
    assert "7 of 9 parameters read back equal" in health


def test_a_digesting_launch_whose_trainer_says_no_digest_is_flagged_and_another_is_not(
    db: Database,
) -> None:
    health, _, _ = _follow(db, _synced(0) + _synced(1), _synced(2))
    assert health.startswith("weights_unsynced: no weight digest from the trainer by version 2")
    other = _follow(db, _synced(0) + _synced(1), _synced(2), engine=False, run_id="r2")
    assert other[0] == "ok: None"


@pytest.mark.parametrize("steps", [1, 3])
def test_a_problem_holds_for_the_attempt_whatever_comes_after(db: Database, steps: int) -> None:
    stale = _digest(0)
    reads = [_trainer(0, stale) + _rollout(stale), _trainer(1, _digest(1)) + _rollout(stale)]
    reads += [_trainer(v, _digest(v)) + _rollout(_digest(v)) for v in range(2, 2 + steps)]
    health, events, _ = _follow(db, *reads)
    assert health.startswith("weights_unsynced: version 1's weights"), health
    assert len([e for e in events if e.startswith("weight sync not proven")]) == 1, events
