"""Trust inside the cluster: the embedded nodes run as a user of their own, out of reach of the
service's environment, database and secrets; a team's secrets go only to a cluster no other
team's runs go to, unless the operator allows it, and then the plan and the run say who could
read them; a service that cannot separate its jobs refuses to start with auth on."""

from __future__ import annotations

import json
import logging
import os
import pwd
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.cluster import embedded_trust, job_python, job_user
from service.cluster.embedded_trust import StartRefused
from service.cluster.job_user import JobUser
from service.cluster.local_ray import LocalRayCluster
from service.store import audit
from service.store.db import Database
from service.store.models import Run
from service.store.tokens import create as create_token
from tests.conftest import RAY_PORT, TEST_INSTANCE, make_settings

SECRET = "vision-wandb-value-5f1e2d3c4b5a"
BODY = {"recipe": "tiny-grpo", "total_rollout_steps": 8, "batch_prompts": 4}
# The instance of the service whose jobs plant stray processes: its job user is its own.
INSTANCE = "trust"


@pytest.fixture
def secrets_dir(tmp_path: Path) -> str:
    (tmp_path / "secrets" / "teams" / "vision").mkdir(parents=True)
    (tmp_path / "secrets" / "teams" / "vision" / "wandb-key").write_text(SECRET)
    os.chmod(tmp_path / "secrets", 0o700)
    return str(tmp_path / "secrets")


def _teams(db_url: str) -> dict[str, dict[str, str]]:
    db = Database(db_url)
    with db.transaction() as s:
        tokens = {
            who: create_token(s, who, team, role)[1]  # type: ignore[arg-type]
            for who, team, role in [("ann", "vision", "member"), ("bob", "speech", "member")]
        }
    db.dispose()
    return {who: {"Authorization": f"Bearer {token}"} for who, token in tokens.items()}


def _api(db_url: str, secrets_dir: str, **overrides: Any) -> Iterator[TestClient]:
    settings = make_settings(
        db_url, "http://127.0.0.1:9", run_loops=False, auth="on", secrets_dir=secrets_dir
    )
    with TestClient(create_app(settings.model_copy(update=overrides))) as client:
        yield client


def test_a_run_naming_secrets_is_refused_on_a_cluster_other_teams_share(
    db_url: str, secrets_dir: str
) -> None:
    with_secrets = BODY | {"secrets": {"WANDB_API_KEY": "wandb-key"}}
    for api in _api(db_url, secrets_dir):
        ann = _teams(db_url)["ann"]
        refused = api.post("/runs", json=with_secrets, headers=ann)
        assert refused.status_code == 422, refused.text
        (error,) = refused.json()["errors"]
        assert error["field"] == "secrets"
        for named in ("'default'", "every team", "RLRUN_SECRETS_ON_SHARED_CLUSTER"):
            assert named in error["msg"]
        assert SECRET not in refused.text
        # The same run without secrets is accepted there.
        assert api.post("/runs", json=BODY, headers=ann).status_code == 201
    # A cluster of vision's own takes them.
    for api in _api(db_url, secrets_dir, cluster_teams=["vision"]):
        ann = _teams(db_url)["ann"]
        accepted = api.post("/runs", json=with_secrets, headers=ann)
        assert accepted.status_code == 201, accepted.text
        assert not [w for w in accepted.json()["warnings"] if "secrets" in w]


def test_on_a_shared_cluster_the_plan_and_the_page_say_other_teams_jobs_can_forge_the_record(
    db_url: str, secrets_dir: str
) -> None:
    for api in _api(db_url, secrets_dir, cluster_teams=["vision", "speech"]):
        ann = _teams(db_url)["ann"]
        plan = api.post("/runs", params={"dry_run": "true"}, json=BODY, headers=ann)
        said = [w for w in plan.json()["warnings"] if "can write its log" in w]
        assert len(said) == 1 and "the jobs of speech" in said[0], plan.json()["warnings"]
        for named in ("stop record", "class of a failure", "run directories", "own"):
            assert named in said[0]
        run = api.post("/runs", json=BODY, headers=ann).json()
        page = api.get(f"/runs/{run['id']}", headers=ann).json()
        assert [w for w in page["warnings"] if "can write its log" in w] == said
        # Kept with the run: its failure class is then held to Ray's record (recovery.classify).
        assert _launch(db_url, run["id"])["shared_on"] == ["default"]
    for api in _api(db_url, secrets_dir, cluster_teams=["vision"]):  # vision's own: nothing
        ann = _teams(db_url)["ann"]
        plan = api.post("/runs", params={"dry_run": "true"}, json=BODY, headers=ann)
        assert not [w for w in plan.json()["warnings"] if "can write its log" in w]
        run = api.post("/runs", json=BODY, headers=ann).json()
        assert _launch(db_url, run["id"])["shared_on"] == []


def _launch(db_url: str, run_id: str) -> dict[str, Any]:
    db = Database(db_url)
    with db.read() as s:
        run = s.get(Run, run_id)
        assert run is not None
        launch = dict(run.launch)
    db.dispose()
    return launch


def test_the_operator_s_allowance_names_who_could_read_them_in_the_plan_and_on_the_run(
    db_url: str, secrets_dir: str
) -> None:
    with_secrets = BODY | {"secrets": {"WANDB_API_KEY": "wandb-key"}}
    for api in _api(db_url, secrets_dir, cluster_teams=["vision", "speech"]):
        ann = _teams(db_url)["ann"]
        refused = api.post("/runs", json=with_secrets, headers=ann)
        assert refused.status_code == 422 and "takes speech" in refused.text
    for api in _api(db_url, secrets_dir, secrets_on_shared_cluster=True):
        ann = _teams(db_url)["ann"]
        plan = api.post("/runs", params={"dry_run": "true"}, json=with_secrets, headers=ann)
        assert plan.status_code == 200, plan.text
        said = [w for w in plan.json()["warnings"] if "secrets" in w]
        assert said and "every team" in said[0] and "'default'" in said[0]
        run = api.post("/runs", json=with_secrets, headers=ann).json()
        page = api.get(f"/runs/{run['id']}", headers=ann).json()
        assert [w for w in page["warnings"] if "secrets" in w] == said


def test_without_root_or_a_job_user_auth_on_refuses_an_embedded_cluster(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    monkeypatch.setattr(job_user.os, "geteuid", lambda: 1000)
    settings = make_settings(f"sqlite:///{tmp_path}/db.sqlite", "local", auth="on")
    with pytest.raises(StartRefused) as refused:
        embedded_trust.prepare(settings)
    assert "RLRUN_LOCAL_SINGLE_TENANT=true" in str(refused.value)
    assert "\n" not in str(refused.value)
    # A job user named, but no root to start the nodes as it: refused too, whatever auth says.
    with pytest.raises(job_user.JobUserError, match="RLRUN_LOCAL_JOB_USER=nobody"):
        embedded_trust.prepare(settings.model_copy(update={"auth": "off"}), named="nobody")
    # The operator accepts a single-tenant cluster: said plainly at start.
    single = settings.model_copy(update={"local_single_tenant": True})
    with caplog.at_level(logging.WARNING):
        assert embedded_trust.prepare(single).jobs_act_as_service
    assert "can act as the service" in caplog.text
    # Auth off: every caller is an admin already; nothing to refuse.
    assert embedded_trust.prepare(settings.model_copy(update={"auth": "off"})).user is None


def test_a_job_users_name_is_the_services_own(tmp_path: Path) -> None:
    def named(url: str, instance: str | None = None) -> str:
        return make_settings(url, "local", instance=instance).instance_name

    one, two = named(f"sqlite:///{tmp_path}/a.sqlite"), named(f"sqlite:///{tmp_path}/b.sqlite")
    assert one != two and len(one) == 8
    # Replicas of one service (one database, however spelled, whatever password) share it.
    assert named(f"sqlite:///{tmp_path}/x/../a.sqlite") == one
    pg = "postgresql+psycopg://rlrun:{}@db.example/rlrun"
    assert named(pg.format("s3cret")) == named(pg.format("rotated"))
    assert named(f"sqlite:///{tmp_path}/a.sqlite", instance="prod") == "prod"
    assert job_user.default_name(one) == f"rlrun-job-{one}"
    assert job_user.default_name(one, "vision") == f"rlrun-job-{one}-vision"
    long = job_user.default_name(one, "a-cluster-name-far-too-long-for-a-user")
    assert len(long) <= 32 and long.startswith(f"rlrun-job-{one}-")


@pytest.mark.skipif(os.geteuid() != 0, reason="the job user is made and used as root only")
def test_two_services_on_one_host_never_share_a_job_user(tmp_path: Path) -> None:
    services = [
        make_settings(f"sqlite:///{tmp_path}/{name}.sqlite", "local", instance=None)
        for name in ("a", "b")
    ]
    users = []
    try:
        for settings in services:
            user = embedded_trust.prepare(settings).user
            assert user is not None
            users.append(user)
        assert users[0].name != users[1].name and users[0].uid != users[1].uid
        assert users[0].name == f"rlrun-job-{services[0].instance_name}"
    finally:
        for user in users:
            subprocess.run(["userdel", user.name], check=False, capture_output=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="the job user is made and used as root only")
def test_verl_dirs_the_job_user_cannot_use_are_named_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    private = tmp_path / "data"  # under pytest's private temp dir
    private.mkdir()
    settings = make_settings(f"sqlite:///{tmp_path}/db.sqlite", "local", verl_data_dir=str(private))
    with caplog.at_level(logging.WARNING):
        trust = embedded_trust.prepare(settings)
    assert trust.user is not None and trust.user.name == job_user.default_name(TEST_INSTANCE)
    assert f"cannot read {private}" in caplog.text
    assert stat.S_IMODE((tmp_path / "db.sqlite").stat().st_mode) == 0o600


@pytest.mark.skipif(os.geteuid() != 0, reason="the job user is made and used as root only")
def test_a_checkpoint_root_that_exists_keeps_its_owner_and_mode_and_a_missing_one_is_given(
    caplog: pytest.LogCaptureFixture,
) -> None:
    top = Path(tempfile.mkdtemp())  # in the system temp dir, which anyone may search
    top.chmod(0o755)
    shared = top / "checkpoints"  # a root the operator made, shared with others: not the jobs'
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    missing = top / "runs" / "tiny-grpo"
    settings = make_settings(
        f"sqlite:///{top}/db.sqlite", "local", verl_checkpoint_root=str(shared)
    )
    try:
        with caplog.at_level(logging.WARNING):
            trust = embedded_trust.prepare(settings, [shared, missing])
        assert trust.user is not None
        kept = shared.stat()
        assert (kept.st_uid, kept.st_gid, stat.S_IMODE(kept.st_mode)) == (0, 0, 0o755)
        assert f"{trust.user.name}, which cannot write {shared}" in caplog.text
        given = missing.stat()  # the service's own, made for its runs: the jobs' user's
        assert (given.st_uid, stat.S_IMODE(given.st_mode)) == (trust.user.uid, 0o700)
        # A start again finds both as they were left: neither is taken over now.
        shared.chmod(0o750)
        embedded_trust.prepare(settings, [shared, missing])
        assert stat.S_IMODE(shared.stat().st_mode) == 0o750 and shared.stat().st_uid == 0
        assert missing.stat().st_uid == trust.user.uid
    finally:
        shutil.rmtree(top)


def test_get_cluster_says_when_jobs_can_act_as_the_service(db_url: str, secrets_dir: str) -> None:
    for api in _api(db_url, secrets_dir, auth="off"):
        services = api.app.state.services  # type: ignore[attr-defined]
        assert api.get("/cluster").json()["jobs_act_as_service"] is False  # a remote cluster
        services.clusters.primary.local = LocalRayCluster([1])  # an embedded one, as the service
        seen = api.get("/cluster").json()
        assert seen["jobs_act_as_service"] is True and seen["job_user"] is None


def test_the_job_user_s_reach_follows_modes_and_links() -> None:
    nobody = pwd.getpwnam("nobody")
    user = JobUser("nobody", nobody.pw_uid, nobody.pw_gid)
    tmp_path = Path(tempfile.mkdtemp())  # in the system temp dir, which anyone may search
    os.chmod(tmp_path, 0o755)
    private = tmp_path / "private"
    (private / "inner").mkdir(parents=True)
    (private / "inner" / "file").write_text("x")
    private.chmod(0o700)
    assert user.blocker(private / "inner" / "file") == private
    link = tmp_path / "link"
    link.symlink_to(private / "inner")
    assert user.blocker(link / "file") == private  # a link's target is checked
    private.chmod(0o711)  # searchable, not listable
    assert user.blocker(private / "inner" / "file") is None
    assert user.blocker(private) == private
    shutil.rmtree(tmp_path)


# Run as a Ray job on the embedded cluster, as any job's code could: every read of the review.
def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] not in "ZX"
    except OSError:
        return False


def _audited(db_url: str) -> list[tuple[str, int, str]]:
    """The ``process.ended`` rows, oldest first: (action, the pid its target names, user)."""
    db = Database(db_url)
    with db.read() as s:
        rows = [
            (r.action, int(r.target.split("process ", 1)[1].split()[0]), r.user)
            for r in reversed(audit.page(s, 500))
            if r.action == "process.ended"
        ]
    db.dispose()
    return rows


HOSTILE = r"""
import glob, json, os, sys
service_pid, database, secrets_dir, secret = sys.argv[1:5]

def attempt(read):
    try:
        return read()
    except OSError as exc:
        return type(exc).__name__

found = []
for proc in glob.glob("/proc/[0-9]*"):
    try:
        if b"REACH" in open(f"{proc}/cmdline", "rb").read():
            continue  # this job itself, whose command holds what it looks for
    except OSError:
        pass
    for part in ("environ", "cmdline"):
        try:
            data = open(f"{proc}/{part}", "rb").read()
        except OSError:
            continue
        for needle in (b"RLRUN_DATABASE_URL", b"RLRUN_SECRET", secret.encode()):
            if needle in data:
                found.append(f"{proc}/{part}: {needle.decode()}")
print("REACH" "ED=" + json.dumps({
    "uid": os.getuid(),
    "service_environ": attempt(lambda: len(open(f"/proc/{service_pid}/environ").read())),
    "service_mem": attempt(lambda: len(open(f"/proc/{service_pid}/mem", "rb").read(1))),
    "database": attempt(lambda: len(open(database, "rb").read())),
    "secrets_dir": attempt(lambda: os.listdir(secrets_dir)),
    "found": found,
}), flush=True)
"""


# Run as another team's Ray job: a forged line in a run's log (its path given), then its trainer
# killed, as the same Unix user.
FORGE_AND_KILL = r"""
import glob, os, signal, sys, time
with open(sys.argv[1], "a") as log:
    log.write("(TinyGrpoTrainer pid=1) torch.OutOfMemoryError: NPU out of memory. Tried to "
              "allocate 2.00 GiB\n")
time.sleep(3)  # the follower reads the line first
killed = []
for proc in glob.glob("/proc/[0-9]*"):
    try:
        if open(f"{proc}/cmdline", "rb").read().startswith(b"ray::TinyGrpoTrainer"):
            os.kill(int(proc[6:]), signal.SIGKILL)
            killed.append(int(proc[6:]))
    except OSError:
        pass
print("KILL" "ED=" + str(killed), flush=True)
"""


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="starting the nodes as another user needs root")
def test_a_job_on_the_embedded_cluster_reaches_nothing_of_the_service(
    tmp_path: Path, secrets_dir: str
) -> None:
    """The embedded default with auth on and two teams: vision's secrets are refused on the
    shared cluster (with the reason), and a job of speech's, submitted straight to Ray with the
    node's token, reads none of the service's environment, memory, database or secrets."""
    import httpx

    from tests.conftest import wait_for, wait_status
    from tests.live import ServerThread, free_port

    database = tmp_path / "db.sqlite"
    db_url = f"sqlite:///{database}"
    port = free_port()
    settings = make_settings(
        db_url,
        "local",
        auth="on",
        # A job user of its own: the stray processes it plants are no other service's to end,
        # and other services' are not its own (every test service else is rlrun-job-test).
        instance=INSTANCE,
        secrets_dir=secrets_dir,
        public_url=f"http://127.0.0.1:{port}",
        local_npus=[4],
        local_cpus_per_node=4,
        local_ray_port=RAY_PORT + 2200,
        local_dashboard_port=RAY_PORT + 2300,
        local_ray_state_dir=str(tmp_path / "state"),
    )
    with ServerThread(create_app(settings), port=port) as url:
        people = _teams(db_url)
        with httpx.Client(base_url=url, timeout=30, headers=people["ann"]) as api:
            cluster = api.get("/cluster").json()
            assert cluster["job_user"] == job_user.default_name(INSTANCE)
            assert not cluster["jobs_act_as_service"]
            with_secrets = BODY | {"secrets": {"WANDB_API_KEY": "wandb-key"}}
            refused = api.post("/runs", json=with_secrets)
            assert refused.status_code == 422 and "every team" in refused.text
            run = api.post("/runs", json=BODY | {"save_every": 1}).json()
            done = wait_status(api, run["id"], {"SUCCEEDED", "FAILED"}, timeout=180)
            logs = api.get(f"/runs/{run['id']}/logs").text
            assert done["status"] == "SUCCEEDED", logs
        head = f"http://127.0.0.1:{RAY_PORT + 2300}"
        record = next(tmp_path.glob("state/local-ray-*.json"))
        base_dir = Path(json.loads(record.read_text())["base_dir"])
        headers = {"Authorization": f"Bearer {(base_dir / 'ray-token').read_text()}"}
        argv = ["python3", "-c", HOSTILE, str(os.getpid()), str(database), secrets_dir, SECRET]
        submitted = httpx.post(
            f"{head}/api/jobs/", json={"entrypoint": shlex.join(argv)}, headers=headers
        ).json()["submission_id"]
        logs = wait_for(
            lambda: httpx.get(f"{head}/api/jobs/{submitted}/logs", headers=headers).json()["logs"],
            lambda text: "REACHED=" in text,
            timeout=120,
        )

        def leave_a_child(then: str) -> int:
            """A job that leaves a setsid, double-forked child (out of Ray's tree), then
            ``then``: the child's pid."""
            entry = f"setsid sh -c 'sleep 3607 & echo STRAY=$!'; {then}"
            job = httpx.post(f"{head}/api/jobs/", json={"entrypoint": entry}, headers=headers)
            job_id = job.json()["submission_id"]
            said = wait_for(
                lambda: httpx.get(f"{head}/api/jobs/{job_id}/logs", headers=headers).json(),
                lambda answer: re.search(r"STRAY=\d", answer["logs"]) is not None,
                timeout=60,
            )["logs"]
            return int(re.findall(r"STRAY=(\d+)", said)[-1])

        # A job that ends: its child is ended within a round or two, and audited.
        gone = leave_a_child("true")
        wait_for(lambda: _alive(gone), lambda alive: not alive, timeout=60)
        # A job that lives: its child is its own until the end, then the cluster's stop ends it.
        kept = leave_a_child("sleep 600")
        time.sleep(2)  # several rounds
        assert _alive(kept)
    assert not _alive(kept)
    ended = [r for r in _audited(db_url) if r[0] == "process.ended"]
    # (A stop may end more: what Ray's own watcher of a driver was running, a `sleep 1`.)
    assert [pid for _, pid, _ in ended if pid in (gone, kept)] == [gone, kept], ended
    assert all(user == "ray-cluster" for _, _, user in ended)
    seen = json.loads(logs.rsplit("REACHED=", 1)[1].splitlines()[0])
    assert seen["uid"] == pwd.getpwnam(job_user.default_name(INSTANCE)).pw_uid
    assert seen["service_environ"] == "PermissionError"
    assert seen["service_mem"] == "PermissionError"
    assert seen["database"] == "PermissionError"
    assert seen["secrets_dir"] == "PermissionError"
    assert seen["found"] == []


@pytest.mark.skipif(os.geteuid() != 0, reason="running Python as the job user needs root")
def test_a_linked_python_gives_the_job_user_the_headers_a_compiling_job_needs() -> None:
    # vLLM's CPU engine compiles with torch's inductor, which includes Python.h from
    # sysconfig's include dir: a linked interpreter without it failed every verl CPU run.
    user = job_user.resolve(None, job_user.default_name(TEST_INSTANCE))
    assert user is not None
    base = Path(sys.base_prefix) / "include"
    if not (base.is_dir() and user.blocker(base) is not None):
        pytest.skip("the base interpreter's headers are reachable as they are: nothing is linked")
    top = Path(tempfile.mkdtemp())  # in the system temp dir, which anyone may search
    os.chmod(top, 0o755)
    root = top / "rlrun-python"
    python = job_python.for_user(user, root=root)
    ask = "import sysconfig, pathlib; print(pathlib.Path(sysconfig.get_paths()['include']))"
    env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": python.library_path or ""}
    include = subprocess.run(
        [str(python.executable), "-c", ask],
        user=user.uid,
        group=user.gid,
        extra_groups=[],
        env=env,
        cwd="/",
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert Path(include).is_relative_to(root)
    assert user.blocker(Path(include) / "Python.h") is None
    shutil.rmtree(top)


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="starting the nodes as another user needs root")
def test_a_run_killed_by_another_team_s_job_after_a_forged_oom_line_is_killed_outside(
    tmp_path: Path, secrets_dir: str
) -> None:
    """The embedded default with auth on, every team on it: a job of speech's, submitted straight
    to Ray, appends "NPU out of memory" to a run of vision's log and kills its trainer. The run
    fails ``killed_outside`` (Ray recorded its trainer's end, with no memory evidence), the log's
    claim named, and an audit row says so: not ``npu_oom``, which no policy retries."""
    import httpx

    from tests.conftest import wait_for, wait_status
    from tests.live import ServerThread, free_port

    db_url = f"sqlite:///{tmp_path}/db.sqlite"
    port = free_port()
    settings = make_settings(
        db_url,
        "local",
        auth="on",
        secrets_dir=secrets_dir,
        public_url=f"http://127.0.0.1:{port}",
        local_npus=[4],
        local_cpus_per_node=4,
        local_ray_port=RAY_PORT + 2400,
        local_dashboard_port=RAY_PORT + 2500,
        local_ray_state_dir=str(tmp_path / "state"),
    )
    with ServerThread(create_app(settings), port=port) as url:
        people = _teams(db_url)
        head = f"http://127.0.0.1:{RAY_PORT + 2500}"
        record = next(tmp_path.glob("state/local-ray-*.json"))
        base_dir = Path(json.loads(record.read_text())["base_dir"])
        headers = {"Authorization": f"Bearer {(base_dir / 'ray-token').read_text()}"}
        with httpx.Client(base_url=url, timeout=30, headers=people["ann"]) as api:
            long = BODY | {"total_rollout_steps": 40_000, "train_seconds": 0.2}
            victim = api.post("/runs", json=long).json()["id"]
            wait_for(
                lambda: api.get(f"/runs/{victim}").json(),
                lambda r: (r["progress"] or {}).get("step") or r["status"] == "FAILED",
                timeout=120,
            )
            driver_log = next(base_dir.rglob(f"job-driver-{victim}.log"))
            argv = ["python3", "-c", FORGE_AND_KILL, str(driver_log)]
            forger = httpx.post(
                f"{head}/api/jobs/", json={"entrypoint": shlex.join(argv)}, headers=headers
            ).json()["submission_id"]
            wait_status(api, victim, {"FAILED", "SUCCEEDED"}, timeout=120)
            killed = wait_for(
                lambda: api.get(f"/runs/{victim}").json(), lambda r: r["failure"], timeout=90
            )
            forged = httpx.get(f"{head}/api/jobs/{forger}/logs", headers=headers).json()["logs"]
            text = api.get(f"/runs/{victim}/logs").text
    assert "KILLED=[" in forged and "KILLED=[]" not in forged, forged
    assert "NPU out of memory" in text  # the forged line is in the run's record of its log
    assert killed["failure"]["class"] == "killed_outside", killed["failure"]
    assert "(npu_oom)" in killed["failure"]["summary"]
    assert all(e["offset"] is None for e in killed["failure"]["evidence"])
    db = Database(db_url)
    with db.read() as s:
        outside = [(r.action, r.user) for r in audit.page(s, 500) if r.run_id == victim]
    db.dispose()
    assert ("run.killed_outside", "ray-cluster") in outside, outside
