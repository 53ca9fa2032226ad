"""The checkpoints the service recorded for the session's real verl run (``tests/verl_run.py``)
are verl's own: one ``checkpoint`` event per complete ``global_step_<N>`` the run's attempts
wrote, the tracker's step the newest, read from the job log alone (the launcher's watcher)."""

from __future__ import annotations

import pytest

from jobs import resume as saves
from jobs.verl_launch import resume
from tests.verl_run import VerlRun

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.timeout(2400)]


def test_the_checkpoint_events_are_verls_tracker_and_complete_step_dirs(
    verl_run: VerlRun,
) -> None:
    run = verl_run.http.get(f"/runs/{verl_run.run_id}").json()
    events = [(e["attempt"], e["step"]) for e in run["events"] if e["kind"] == "checkpoint"]
    tree = verl_run.checkpoints
    on_disk = sorted(
        int(m.group(1))
        for p in tree.iterdir()
        if (m := saves.STEP_DIR.fullmatch(p.name)) and resume.complete(p)
    )
    tracker = int((tree / resume.TRACKER).read_text().strip())
    # Each attempt says the saves it made, in order; together they are the complete dirs.
    for attempt in {a for a, _ in events}:
        steps = [s for a, s in events if a == attempt]
        assert steps == sorted(set(steps)), events
    assert sorted({s for _, s in events}) == on_disk, (events, on_disk)
    assert run["checkpoint"]["step"] == tracker == on_disk[-1]
