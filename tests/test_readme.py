"""Every README command that can run here, run as printed: the install command in a fresh
virtual environment of a copy of the project (pip's cache and wheel sources as the machine has
them), the service it starts, then the walkthrough and the verl plan against it in a shell
whose ``PATH`` is a fresh login shell's, so a command that works only with this test's own
environment fails here. The Python client's example (docs/guide/client.md) runs too.

Not run: the test-suite commands (they would run this test again). The one liberty taken is
the port: when 8000 is taken on this machine, every ``8000`` becomes a free port.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
CLIENT_DOC = ROOT / "docs" / "guide" / "client.md"
# Blocks that run the test suite, and verl's CPU run (its stack is 4 GB; the session's shared verl
# run, tests/verl_run.py, runs the same preset, assets command and serve).
SKIP = ("pytest", "verl-cpu", "cpu-learn")
COPY_IGNORE = shutil.ignore_patterns(
    ".git", ".venv", "site", "__pycache__", "*.db", "*.db-*", ".*_cache", "*.egg-info", "build"
)

pytestmark = [pytest.mark.slow]


def blocks(text: str, language: str) -> list[str]:
    return [m.group(1) for m in re.finditer(rf"```{language}\n(.*?)```", text, re.S)]


def fresh_path() -> str:
    """``PATH`` as a new login shell sets it (no virtual environment, nothing of this test's)."""
    home = os.environ.get("HOME", "/root")
    done = subprocess.run(
        ["env", "-i", f"HOME={home}", "bash", "-lc", 'printf %s "$PATH"'],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return done.stdout.strip() or "/usr/local/bin:/usr/bin:/bin"


def free(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) != 0


def a_port() -> int:
    if free(8000):
        return 8000
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def shell_env(port: int) -> dict[str, str]:
    """This machine's environment (pip's sources included) with a fresh shell's ``PATH`` and
    none of this test's own: no virtual environment, no project on the path, no service URL."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RLRUN_", "PYTHON", "VIRTUAL_ENV", "PYTEST", "COV_"))
    }
    # PIP_NO_COMPILE: a fresh install skips byte-compiling (ray's most of all), halving its time;
    # pip's cache and the machine's wheel sources (PIP_* as set here) are used as they are.
    env |= {"PATH": fresh_path(), "COLUMNS": "120", "PIP_NO_COMPILE": "1"}
    # As root, the tests' job user (rlrun-job-test), not one more user for each fresh copy.
    env["RLRUN_INSTANCE"] = "test"
    if port != 8000:
        env["RLRUN_URL"] = f"http://127.0.0.1:{port}"  # what the README says for another port
    return env


@contextlib.contextmanager
def serving(command: str, cwd: Path, env: dict[str, str], port: int) -> Iterator[Path]:
    """The README's first command (install, then ``rlrun serve``) running until the service
    answers; stopped with SIGTERM (the service stops its own Ray head)."""
    log = cwd / "serve.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            ["bash", "-euo", "pipefail", "-c", command],
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 420
        while True:
            assert proc.poll() is None, log.read_text()[-4000:]
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                    break
            assert time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(1)
        yield log
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def run(script: str, cwd: Path, env: dict[str, str], timeout: float = 300) -> str:
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout + done.stderr


@pytest.mark.timeout(900)  # a fresh install is most of it (about 1 min on an idle machine)
def test_every_readme_command_runs_as_written(tmp_path: Path) -> None:
    text = README.read_text()
    shell = [b for b in blocks(text, "bash") if not any(word in b for word in SKIP)]
    install, walkthrough, verl_plan = shell
    assert install.startswith("python3 -m venv .venv") and "rlrun serve" in install
    assert walkthrough.startswith(". .venv/bin/activate")
    assert "verl-fully-async" in verl_plan

    port = a_port()
    project = tmp_path / "rlrun"
    shutil.copytree(ROOT, project, ignore=COPY_IGNORE)
    env = shell_env(port)

    def as_printed(block: str) -> str:
        return block if port == 8000 else block.replace("8000", str(port))

    # Another port is what the README says: `rlrun serve --port N` and RLRUN_URL.
    serve = (
        install if port == 8000 else install.replace("rlrun serve", f"rlrun serve --port {port}")
    )
    started = time.monotonic()
    with serving(serve, project, env, port):
        ready_s = time.monotonic() - started
        out = run(as_printed(walkthrough), project, env)
        assert "CANCELLED" in out  # the run that needs all 16 NPUs waited, and was cancelled
        assert "SUCCEEDED" in out and "critic/score/mean" in out
        assert '"status":"SUCCEEDED"' in out.replace(" ", "")  # curl's JSON of the run
        # The verl plan on the default cluster: answered, saying it can never fit and why.
        plan = run(". .venv/bin/activate\n" + verl_plan, project, env, timeout=120)
        assert "never fits" in plan and "command:" in plan
        # The Python client's example, with the same fresh interpreter.
        (python,) = blocks(CLIENT_DOC.read_text(), "python")
        (project / "example.py").write_text(python)
        lines = run(".venv/bin/python example.py", project, env).splitlines()
        assert lines[-1] == "SUCCEEDED" and len(lines) > 2
    print(f"installed and serving after {ready_s:.0f} s; all in {time.monotonic() - started:.0f} s")
