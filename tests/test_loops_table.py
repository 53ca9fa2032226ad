"""The loops of one replica come from one table: each runs where the deployment needs it, and a
part that finishes what another loop acts on wakes that loop."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from service.cluster.registry import Clusters
from service.loops.table import Wakes, build_loops
from service.metrics.broker import Broker
from service.store.db import Database
from service.team_secrets import SecretStore
from tests.conftest import make_settings
from tests.fake_ray import FakeRay

ALWAYS = {"notifier", "submitter", "reconciler", "watchdog", "follower", "unmanaged"}


def test_one_remote_cluster_runs_the_loops_every_replica_needs(
    db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = make_settings(db.url, "http://head:8265")
    loops, follower = build_loops(
        settings, db, Clusters.lift(FakeRay()), SecretStore(str(tmp_path)), Broker(db, 1.0)
    )
    # No round over clusters (one has nowhere else to send its runs), no embedded head's strays,
    # no drain watch where Ray cannot say a node drains.
    assert set(loops) == ALWAYS
    assert loops["follower"].tick == follower.tick
    assert loops["submitter"].interval_s == settings.submit_interval_s
    woken: list[str] = []
    for name, loop in loops.items():
        monkeypatch.setattr(loop, "wake", functools.partial(woken.append, name))
    follower.on_end()
    follower.on_checkpoint()
    assert woken == ["submitter", "reconciler"]


def test_a_wake_of_a_loop_not_run_does_nothing() -> None:
    wakes = Wakes()
    wakes("drains")()  # bound before the loops exist, and no such loop: no error
    assert wakes.loops == {}
