"""Processes of a job user in no live node's tree: found and ended (``cluster/strays``), as the
embedded cluster does at its start, its stop and each round; a job's own detached child is kept
while the job its environment names is live, and another service's node is never touched."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from service.cluster import job_user, strays
from tests.conftest import TEST_INSTANCE

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="running as the job user needs root")

# A setsid, double-forked child (its parent init once the middle shell exits): its pid.
DETACH = "setsid sh -c 'sleep 3609 >/dev/null 2>&1 & echo $!'"


def _detached(user: job_user.JobUser, env: dict[str, str] | None = None) -> int:
    done = subprocess.run(
        ["/bin/sh", "-c", DETACH],
        user=user.uid,
        group=user.gid,
        extra_groups=[],
        env=env or {},
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
    )
    return int(done.stdout.split()[-1])


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def test_a_detached_process_of_the_job_user_is_found_unless_its_job_is_live() -> None:
    user = job_user.resolve(None, job_user.default_name(TEST_INSTANCE))
    assert user is not None
    config = {"metadata": {"job_submission_id": "raysubmit_live"}}
    orphan = _detached(user)
    owned = _detached(user, {"RAY_JOB_CONFIG_JSON_ENV_VAR": json.dumps(config)})
    # A node of another service (a live process of another user started it) is not ours.
    as_user = f"setpriv --reuid={user.uid} --regid={user.gid} --clear-groups sleep 3608"
    theirs = subprocess.Popen(["/bin/sh", "-c", f"{as_user}; true"], start_new_session=True)
    time.sleep(0.3)
    [node] = [
        int(p) for p in Path(f"/proc/{theirs.pid}/task/{theirs.pid}/children").read_text().split()
    ]
    try:
        found = {s.pid: s for s in strays.find(user.uid, roots=[], live={"raysubmit_live"})}
        assert orphan in found and found[orphan].job is None
        assert found[orphan].command == "sleep 3609"
        assert owned not in found and node not in found  # its job lives; another's
        # Its job over, the owned child is a stray too, naming the job.
        over = {s.pid: s for s in strays.find(user.uid, roots=[], live=())}
        assert over[owned].job == "raysubmit_live"
        assert "of job raysubmit_live as" in over[owned].said(user.name)
        ended = strays.end([found[orphan], over[owned]])
        assert {s.pid for s in ended} == {orphan, owned}
        deadline = time.monotonic() + 10
        while (_alive(orphan) or _alive(owned)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(orphan) and not _alive(owned)
    finally:
        os.killpg(theirs.pid, 9)
        theirs.wait()
        for pid in (orphan, owned):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
