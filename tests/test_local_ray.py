"""The local Ray cluster: ports, a start that fails half-way, nodes left by a killed service."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from service.cluster.local_ray import (
    RAY_WORKER_PORTS,
    LocalRayCluster,
    PortInUse,
    _is_free,
    _stop_group,
)
from tests.conftest import wait_for
from tests.service_process import ServiceProcess


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2] != "Z"


def test_stopping_a_node_ends_what_it_started_in_sessions_of_its_own(tmp_path: Path) -> None:
    # As Ray starts a job's driver: a new session, outside the node's process group.
    pid_file = tmp_path / "driver.pid"
    node = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time\n"
            "d = subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
            f"open({str(pid_file)!r}, 'w').write(str(d.pid))\n"
            "time.sleep(300)\n",
        ],
        start_new_session=True,
    )
    wait_for(lambda: pid_file.exists() and pid_file.read_text(), bool, timeout=20)
    driver = int(pid_file.read_text())
    assert os.getpgid(driver) != node.pid
    _stop_group(node, timeout_s=10)
    assert not _alive(node.pid)
    assert not _alive(driver)


def test_a_port_in_use_is_a_one_line_error_naming_it_and_nothing_starts(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        for kwargs in ({"port": port}, {"dashboard_port": port}):
            cluster = LocalRayCluster([1], base_dir=tmp_path / "ray", **kwargs)
            with pytest.raises(PortInUse) as err:
                cluster.start()
            assert str(port) in str(err.value) and "\n" not in str(err.value)
            assert not cluster._procs
    with pytest.raises(PortInUse, match="10002-19999"):
        LocalRayCluster([1], port=12000, base_dir=tmp_path / "ray").start()


def test_unset_ports_are_free_ones_outside_rays_worker_range() -> None:
    cluster = LocalRayCluster([1, 1])
    cluster.resolve_ports()
    ports = [cluster.port + o for o in (0, 1, 10, 11)] + [cluster.dashboard_port]
    assert all(p not in RAY_WORKER_PORTS and _is_free(p) for p in ports), ports
    cluster.cleanup()


class BrokenSecondNode(LocalRayCluster):
    """The head starts; the second node's ``ray start`` is given an option it refuses."""

    def _node_args(self, index: int) -> list[str]:
        return [*super()._node_args(index), *(["--no-such-option"] if index else [])]


@pytest.mark.ray
@pytest.mark.slow
def test_a_failed_start_stops_every_node_it_started(tmp_path: Path) -> None:
    cluster = BrokenSecondNode([1, 1], cpus_per_node=1, state_dir=tmp_path / "state")
    pids: list[int] = []
    original = cluster._spawn

    def spawn(args: list[str], index: int) -> None:
        original(args, index)
        pids.append(cluster._procs[-1].pid)

    cluster._spawn = spawn  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="exited"):
        cluster.start()
    assert len(pids) == 2
    assert not any(_alive(p) for p in pids)
    assert _is_free(cluster.port) and _is_free(cluster.dashboard_port)
    assert list((tmp_path / "state").glob("*.json")) == []
    cluster.cleanup()


def _record(state: Path) -> dict[str, Any]:
    files = list(state.glob("local-ray-*.json"))
    assert len(files) == 1, files
    record: dict[str, Any] = json.loads(files[0].read_text())
    return record


@pytest.mark.ray
@pytest.mark.slow
def test_nodes_left_by_a_sigkilled_service_are_cleared_by_the_next_serve(tmp_path: Path) -> None:
    state = tmp_path / "state"
    services = []
    for i in range(2):
        service = ServiceProcess(
            "sqlite:///" + str(tmp_path / "db.sqlite"), "local", tmp_path / f"s{i}.log"
        )
        service.env |= {
            "RLRUN_LOCAL_NPUS": "1",
            "RLRUN_LOCAL_CPUS_PER_NODE": "2",
            "RLRUN_LOCAL_RAY_STATE_DIR": str(state),
        }
        services.append(service)
    first, second = services
    try:
        first.start(timeout=120)
        left = _record(state)
        # The token is the nodes' user's, in their dir, when they run as a job user (as root).
        (left_token,) = [
            *state.glob("local-ray-*.token"),
            *Path(left["base_dir"]).glob("ray-token"),
        ]
        first.kill()
        assert all(_alive(g) for g in left["pgids"])  # the nodes outlive the killed service
        started = time.monotonic()
        second.start(timeout=120)
        print(f"next serve up (clearing the left nodes) in {time.monotonic() - started:.1f}s")
        assert not any(_alive(g) for g in left["pgids"])
        assert not Path(left["base_dir"]).exists() and not left_token.exists()
        own = _record(state)
        assert own["owner_pid"] == second.proc.pid  # type: ignore[union-attr]
    finally:
        second.stop()
        first.stop()
    wait_for(lambda: list(state.glob("local-ray-*")), lambda files: files == [], timeout=30)
    assert not any(_alive(g) for g in own["pgids"])
