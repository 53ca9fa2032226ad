"""A local Ray cluster with virtual NPUs, started and stopped by the handle that owns it.

Each node is one ``ray start --block`` process in its own session and temp dir; stopping the
handle stops exactly those nodes (``ray stop`` would kill every Ray process on the host).
A worker node can be killed alone, as a node the cluster loses (``stop_node``), and started
again in its place (``start_node``).
Ports stay outside 10002-19999, which Ray reserves for its workers; unset, free ones are chosen
at start, and a port given but in use is a one-line ``PortInUse`` error before anything starts.

The nodes start clean and closed. Their environment is an allow-list (``INHERITED_ENV`` and
the Ray settings this module sets), so no job inherits the service's database URL, tokens or
secrets. Every process binds 127.0.0.1 only. Ray's token authentication is on, with a token made
per handle (each start of the service) and kept in a file of mode 0600 (``token_path``) while
the nodes run; the nodes get its path, never its value, and the service's client sends it
(``token``).

With a ``user`` (``job_user``: as root, never the service's own user), the nodes, and so every
job, run as that user, from a working and temp dir of theirs (``base_dir``, given to it), with
a Python it can run (``job_python``); the token file is then theirs too (every job can read it:
Ray's token is the whole cluster's). The service's files, environment and memory are then out of
any job's reach.

With a ``state_dir``, the handle records its nodes' process groups there while they run. A
process that dies without stopping them (SIGKILL) leaves that record behind, and the next handle
started with the same ``state_dir`` kills those groups (only processes still running in that
node's temp dir) before it starts its own.

With a ``user``, no process of that user outlives its job (``strays``): at the start (before the
nodes start) and at the stop (after they are gone) every process of the user is ended, and while
the nodes run ``end_strays`` ends those in no node's tree and of no live job (a ``setsid``,
double-forked child of a job that ended). What was ended is kept in ``ended`` until the caller
records it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

import httpx

from service.cluster import strays
from service.cluster.job_python import JobPython
from service.cluster.job_user import JobUser

log = logging.getLogger(__name__)
RAY_WORKER_PORTS = range(10002, 20000)
# How long a process is found in no live job before a round ends it (``end_strays``).
STRAY_GRACE_S = 2.0
# Every node (its ``ray start``) a handle of this process started and has not stopped.
_NODES: set[subprocess.Popen[bytes]] = set()

# What the nodes' processes (and so every job's driver and workers) take from the environment
# that starts them; anything else (RLRUN_*, secrets, credentials of any tool) stays behind.
INHERITED_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR")

# Ray turns 127.0.0.1 into the host's address ("ray start --node-ip-address", "--address")
# unless in its loopback mode (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0). With a loopback node
# address, every component binds loopback. In that mode `ray start --address` refuses to join
# a second node, a guard meant for macOS and Windows: this starter lifts that one check for the
# `ray start` process only (its children, which resolve addresses, keep the loopback mode).
_JOIN = (
    "import sys, types\n"
    "import ray._private.ray_constants as constants\n"
    "import ray.scripts.scripts as scripts\n"
    "joinable = {**vars(constants), 'ENABLE_RAY_CLUSTER': True}\n"
    "scripts.ray_constants = types.SimpleNamespace(**joinable)\n"
    "sys.argv[0] = 'ray'\n"
    "scripts.main()\n"
)


# Ray's command line, as the ``ray`` script runs it (the script's own interpreter line may name
# one the job user cannot run).
_START = "import sys\nimport ray.scripts.scripts as scripts\nsys.argv[0] = 'ray'\nscripts.main()\n"


class PortInUse(RuntimeError):
    """A port the local cluster was told to use is taken."""


class LocalRayCluster:
    def __init__(
        self,
        npus_per_node: list[int],
        cpus_per_node: int = 16,
        base_dir: str | Path | None = None,
        port: int | None = None,
        dashboard_port: int | None = None,
        state_dir: str | Path | None = None,
        custom_resources: list[dict[str, float]] | None = None,
        user: JobUser | None = None,
        python: JobPython | None = None,
    ) -> None:
        self.user = user
        self.python = python or JobPython(Path(sys.executable).parent)
        self.npus_per_node = npus_per_node
        # More resources per node (e.g. a node group's, see scheduling.node_groups).
        self.custom_resources = custom_resources or [{} for _ in npus_per_node]
        self.cpus_per_node = cpus_per_node
        # Ray's socket paths must stay short; a temp dir under /tmp keeps them so.
        self._owns_dir = base_dir is None
        self.base_dir = Path(base_dir) if base_dir else Path(tempfile.mkdtemp(prefix="rlrun-ray-"))
        self._want_port, self._want_dashboard = port, dashboard_port
        self.port = port or 0
        self.dashboard_port = dashboard_port or 0
        self.state_dir = Path(state_dir) if state_dir else None
        self._procs: list[subprocess.Popen[bytes]] = []
        self._stopped: set[int] = set()  # worker nodes stopped alone (``stop_node``)
        self._starts: dict[int, int] = {}  # how often each node was started
        # Ray's auth token, made once per handle (each start of the service makes its own):
        # a head restarted by the same handle takes the same token, and its clients keep working.
        self.token = secrets.token_hex(32)
        # Processes of the job user ended (at start, at stop, or as strays), not yet recorded.
        self.ended: list[strays.Stray] = []
        # Found by confirming calls, since when (on the monotonic clock).
        self._suspects: dict[tuple[int, str], float] = {}

    def end_strays(self, live: Collection[str], confirm: bool = False) -> list[strays.Stray]:
        """End the job user's processes in no live node's tree and of no job in ``live``
        (submission ids); kept in ``ended`` too. With ``confirm`` (a round while jobs come and
        go), only those found so for ``STRAY_GRACE_S`` already: a job started after ``live``
        was read is in it next time, and Ray's own watcher of an ended job's driver (a shell
        that outlives its supervisor by a second at most) ends by itself. None without a job
        user (the nodes then run as the service's own user, whose processes are not the
        cluster's to end)."""
        if self.user is None:
            return []
        # Every live node this process started, of any handle (two may share a user).
        roots = [p.pid for p in _NODES if p.poll() is None]
        found = strays.find(self.user.uid, roots, live)
        due = found
        if confirm:
            now = time.monotonic()
            seen = {(s.pid, s.started): self._suspects.get((s.pid, s.started), now) for s in found}
            self._suspects = seen
            due = [s for s in found if now - seen[(s.pid, s.started)] >= STRAY_GRACE_S]
        ended = strays.end(due)
        self.ended.extend(ended)
        return ended

    def take_ended(self) -> list[strays.Stray]:
        """What was ended and not yet taken (to be recorded), once."""
        taken, self.ended = self.ended, []
        return taken

    @property
    def token_path(self) -> Path:
        """The file holding ``token`` (mode 0600): the job user's, in the base dir, if there is
        one; else in the state dir, else in the base dir."""
        if self._record_path is not None and self.user is None:
            return self._record_path.with_suffix(".token")
        return self.base_dir / "ray-token"

    @property
    def running(self) -> bool:
        """Whether this handle has nodes started and not stopped (``stop``)."""
        return bool(self._procs)

    @property
    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    @property
    def address(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    @property
    def gcs_address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _node_args(self, index: int) -> list[str]:
        # A node started again gets a temp dir of its own, clear of its last run's sockets.
        again = self._starts.get(index, 0)
        temp_dir = (self.base_dir / (f"node{index}" + (f".{again}" if again else ""))).resolve()
        temp_dir.mkdir(parents=True, exist_ok=True)
        if self.user is not None:
            self.user.own(temp_dir)
        return [
            "--block",
            "--node-ip-address=127.0.0.1",
            f"--temp-dir={temp_dir}",
            f"--num-cpus={self.cpus_per_node}",
            f"--resources={json.dumps(self._resources(index))}",
            f"--dashboard-agent-listen-port={self.port + 10 + index}",
            f"--object-store-memory={256 * 1024 * 1024}",
            "--disable-usage-stats",
        ]

    def _resources(self, index: int) -> dict[str, float]:
        extra = self.custom_resources[index] if index < len(self.custom_resources) else {}
        return {"NPU": self.npus_per_node[index], **extra}

    def node_env(self) -> dict[str, str]:
        """The whole environment of a node's ``ray start``, inherited by all its processes."""
        env = {name: os.environ[name] for name in INHERITED_ENV if name in os.environ}
        # Job drivers inherit this PATH, so `python3` in an entrypoint is this environment's.
        env["PATH"] = f"{self.python.bin_dir}{os.pathsep}{env.get('PATH', os.defpath)}"
        if self.python.library_path:
            env["LD_LIBRARY_PATH"] = self.python.library_path
        if self.user is not None:
            env |= {"USER": self.user.name, "LOGNAME": self.user.name, "HOME": str(self.home)}
        return env | {
            "RAY_DEDUP_LOGS": "0",
            # Per-node usage in /api/cluster_status (what admission reads) refreshes at this
            # period (Ray's default: 5 s); a freed node is then seen within about a second.
            "AUTOSCALER_UPDATE_INTERVAL_S": "1",
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # loopback addresses stay loopback
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(self.token_path),
        }

    @property
    def home(self) -> Path:
        """The job user's home while the nodes run (its caches: pip's, Hugging Face's...)."""
        return (self.base_dir / "home").resolve()

    def _write_token(self) -> None:
        """Put the token where the nodes read it and only their user can."""
        path = self.token_path
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        path.unlink(missing_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.token)
        if self.user is not None:
            self.user.own(path, 0o600)

    def _give_dirs(self) -> None:
        """The nodes' working dir, temp dirs and home: the job user's."""
        if self.user is None:
            return
        self.user.own(self.base_dir)
        self.home.mkdir(exist_ok=True)
        self.user.own(self.home)

    def _spawn(self, args: list[str], index: int) -> None:
        python = str(self.python.executable)
        # Unbuffered: `ray start` leaves by os._exit when a node process dies, and its reason
        # must reach the log.
        argv = [python, "-u", "-c", _START if index == 0 else _JOIN, "start", *args]
        self._starts[index] = self._starts.get(index, 0) + 1
        log = open(self.base_dir / f"node{index}.log", "ab")  # noqa: SIM115 - owned by the child
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.node_env(),
            start_new_session=True,
            # Started elsewhere, Ray's dashboard fails; as the job user, from its own dir.
            cwd=self.base_dir if self.user is not None else None,
            **self._as_user(),
        )
        log.close()
        _NODES.add(proc)
        if index < len(self._procs):
            self._procs[index] = proc
        else:
            self._procs.append(proc)
        self._record()

    def _as_user(self) -> dict[str, Any]:
        if self.user is None:
            return {}
        return {"user": self.user.uid, "group": self.user.gid, "extra_groups": []}

    @property
    def _record_path(self) -> Path | None:
        if self.state_dir is None:
            return None
        return self.state_dir / f"local-ray-{os.getpid()}-{id(self):x}.json"

    def _record(self) -> None:
        """Write down this handle's running nodes, for whoever starts after a hard kill."""
        path = self._record_path
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        record = {
            "owner_pid": os.getpid(),
            "owner_started": _started(os.getpid()),
            "base_dir": str(self.base_dir.resolve()),
            "owns_dir": self._owns_dir,
            "pgids": [p.pid for p in self._procs],  # each `ray start` leads its own group
        }
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record))
        tmp.replace(path)

    def _offsets(self) -> list[int]:
        """Ports the nodes bind next to ``port``: GCS, Ray client server, each node's agent."""
        return [0, 1, *(10 + i for i in range(len(self.npus_per_node)))]

    @staticmethod
    def _wait_free(ports: list[int], timeout_s: float) -> None:
        """Wait (at most ``timeout_s``) for ``ports`` to be free again: a node's agent can hold
        its port a moment after its processes were killed (on a loaded host), and a node started
        again on that port dies."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not all(_is_free(p) for p in ports):
            time.sleep(0.1)

    def resolve_ports(self) -> None:
        """Check the ports given, choose free ones for those not given."""
        if self._want_port:
            for offset in self._offsets():
                _check_free(self._want_port + offset, "Ray head (GCS, client and agent ports)")
        else:
            self.port = _free_block(self._offsets())
        if self._want_dashboard:
            _check_free(self._want_dashboard, "Ray dashboard")
        else:
            self.dashboard_port = _free_block([0])

    def start(self, timeout_s: float = 90.0) -> LocalRayCluster:
        if self.state_dir is not None:
            clear_orphans(self.state_dir)
        self.end_strays(())  # no node of this handle yet: no job of its is live
        self.resolve_ports()
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self._give_dirs()
        self._write_token()
        head = [
            "--head",
            f"--port={self.port}",
            f"--ray-client-server-port={self.port + 1}",
            "--include-dashboard=true",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={self.dashboard_port}",
        ]
        try:
            self._spawn([*head, *self._node_args(0)], 0)
            self._wait_dashboard(timeout_s)
            for index in range(1, len(self.npus_per_node)):
                self._spawn([f"--address={self.gcs_address}", *self._node_args(index)], index)
            self._wait_nodes(timeout_s)
        except BaseException:
            # A node that did start must not outlive the failed start, holding its ports.
            self.stop()
            raise
        return self

    def _wait_dashboard(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        # One client for the wait: a new one costs tens of ms of CPU, taken from the nodes.
        with httpx.Client(headers=self.auth_headers, timeout=2) as http:
            while time.monotonic() < deadline:
                self._check_alive()
                try:
                    if http.get(f"{self.address}/api/version").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
        raise TimeoutError(f"Ray dashboard did not come up at {self.address}; see {self.base_dir}")

    def _usage(self, http: httpx.Client) -> dict[str, Any]:
        """The head's resources by node id, as its autoscaler last reported them."""
        status = http.get(f"{self.address}/api/cluster_status").json()
        usage: dict[str, Any] = status["data"]["clusterStatus"]["loadMetricsReport"]["usageByNode"]
        return usage

    def _wait_nodes(self, timeout_s: float, known: Collection[str] = ()) -> None:
        """Wait until every node reports its NPUs to the head, and (``known``: the node ids
        reported before a node was started again) the new one is among them."""
        want = sum(self.npus_per_node)
        deadline = time.monotonic() + timeout_s
        with httpx.Client(headers=self.auth_headers, timeout=5) as http:
            while time.monotonic() < deadline:
                self._check_alive()
                try:
                    usage = self._usage(http)
                    have = sum(r.get("NPU", [0, 0])[1] for r in usage.values())
                    fresh = not known or bool(set(usage) - set(known))
                    if len(usage) == len(self.npus_per_node) and have == want and fresh:
                        return
                except (httpx.HTTPError, KeyError, TypeError, ValueError):
                    pass
                time.sleep(0.5)
        raise TimeoutError(f"Ray nodes did not all join; see {self.base_dir}")

    def stop_node(self, index: int, timeout_s: float = 30.0) -> None:
        """Kill worker node ``index`` alone, as a node the cluster loses: its raylet and workers
        die at once, with no drain (which SIGTERM would start), and the head finds it dead by
        its missed health checks; the head and the other nodes run on. ``start_node`` brings one
        back in its place."""
        if index == 0:
            raise ValueError("the head node stops with the cluster only (stop)")
        _stop_group(self._procs[index], timeout_s, drain=False)
        self._stopped.add(index)
        self._wait_free([self.port + 10 + index], timeout_s)

    def start_node(self, index: int, timeout_s: float = 90.0) -> None:
        """Start worker node ``index`` again after ``stop_node``; returns once it has joined."""
        if index not in self._stopped:
            raise ValueError(f"node {index} is not stopped")
        with httpx.Client(headers=self.auth_headers, timeout=5) as http:
            known = self._usage(http)
        self._spawn([f"--address={self.gcs_address}", *self._node_args(index)], index)
        self._stopped.discard(index)
        self._wait_nodes(timeout_s, known)

    def _check_alive(self) -> None:
        for index, proc in enumerate(self._procs):
            if index not in self._stopped and proc.poll() is not None:
                last = _last_line(self.base_dir / f"node{index}.log")
                raise RuntimeError(
                    f"ray start exited with {proc.returncode} ({last}); see {self.base_dir}"
                )

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the nodes this handle started, workers first, then the head."""
        held = bool(self._procs)
        for proc in reversed(self._procs):
            _stop_group(proc, timeout_s)
        self._procs.clear()
        if held:  # so that a start on the same ports may follow
            self._wait_free(
                [*(self.port + o for o in self._offsets()), self.dashboard_port], timeout_s
            )
        self._stopped.clear()
        if held:  # and no process of the job user outlives the nodes
            self.end_strays(())
        self.token_path.unlink(missing_ok=True)
        if self._record_path is not None:
            self._record_path.unlink(missing_ok=True)

    def cleanup(self) -> None:
        """Stop, and remove the temp dir if this handle made it."""
        self.stop()
        if self._owns_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)


def _stop_group(proc: subprocess.Popen[bytes], timeout_s: float, drain: bool = True) -> None:
    pgid = proc.pid  # each node's `ray start` leads its own session, even after it exited
    # A job's driver runs in a session of its own (Ray starts it so), outside the node's group:
    # the node's descendants are taken now, while they are still its descendants.
    descendants = _descendants(proc.pid)
    if proc.poll() is None and not drain:
        proc.kill()
        proc.wait()
    if proc.poll() is None:
        # SIGTERM to the blocking `ray start` makes it drain and tear down its node's processes.
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    _NODES.discard(proc)
    # Anything left in the node's session (raylet, workers) goes too, and has gone (its ports
    # are free) before this returns.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    for pid, started in descendants:
        if _started(pid) == started:  # the same process, not a new one with its pid
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and (
        _group(pgid, "") or any(_alive(pid, started) for pid, started in descendants)
    ):
        time.sleep(0.1)


def _last_line(path: Path) -> str:
    """The last line a node wrote to its log (why its ``ray start`` exited)."""
    with contextlib.suppress(OSError):
        lines = path.read_text(errors="replace").strip().splitlines()
        return lines[-1][-300:] if lines else "no output"
    return "no log"


def _descendants(pid: int) -> list[tuple[int, str]]:
    """Every live descendant of ``pid``, with its start time (to tell it from a reused pid)."""
    children: dict[str, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))):
            children.setdefault(fields[1], []).append(int(entry.name))
    found: list[tuple[int, str]] = []
    todo = list(children.get(str(pid), []))
    while todo:
        child = todo.pop()
        if (started := _started(child)) is not None:
            found.append((child, started))
        todo.extend(children.get(str(child), []))
    return found


def _alive(pid: int, started: str) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z" and fields[19] == started


def _check_free(port: int, what: str) -> None:
    if port in RAY_WORKER_PORTS:
        raise PortInUse(f"{what}: port {port} is in 10002-19999, which Ray keeps for its workers")
    if not _is_free(port):
        raise PortInUse(f"{what}: port {port} on 127.0.0.1 is already in use; choose another")


def _is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Like the servers that will bind it: a port in TIME_WAIT is free, a listener is not.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))  # only probing: nothing listens
        except OSError:
            return False
    return True


def _free_block(offsets: list[int]) -> int:
    """A base port from the system's free ones such that every ``base + offset`` is free."""
    for _ in range(200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            base: int = sock.getsockname()[1]
        ports = [base + o for o in offsets]
        if all(p < 65536 and p not in RAY_WORKER_PORTS and _is_free(p) for p in ports):
            return base
    raise PortInUse("no block of free ports found for the local Ray cluster")


def _stat(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` fields after the command name (state is [0], pgid [2])."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def _started(pid: int) -> str | None:
    fields = _stat(pid)
    return fields[19] if fields else None


def _group(pgid: int, marker: str) -> bool:
    """Whether a live process of group ``pgid`` has ``marker`` (a node dir) in its command."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat(int(entry.name))
        if not fields or fields[2] != str(pgid) or fields[0] == "Z":
            continue
        with contextlib.suppress(OSError):
            if marker.encode() in (entry / "cmdline").read_bytes():
                return True
    return False


def clear_orphans(state_dir: Path) -> None:
    """Stop the nodes recorded by handles whose process died without stopping them."""
    for path in sorted(state_dir.glob("local-ray-*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        owner = int(record["owner_pid"])
        if _started(owner) == record["owner_started"]:
            continue  # its owner still runs: those nodes are in use
        base_dir = str(record["base_dir"])
        groups = [g for g in record["pgids"] if _group(int(g), base_dir)]
        for pgid in groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(pgid), signal.SIGKILL)
        deadline = time.monotonic() + 15
        while any(_group(int(g), "") for g in groups) and time.monotonic() < deadline:
            time.sleep(0.2)
        if groups:
            log.warning(
                "stopped local Ray nodes left by process %s (process groups %s)", owner, groups
            )
        if record.get("owns_dir"):
            shutil.rmtree(base_dir, ignore_errors=True)
        path.with_suffix(".token").unlink(missing_ok=True)
        path.unlink(missing_ok=True)
