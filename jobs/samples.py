"""Rollout samples: the trainer's ``<dir>/<step>.jsonl`` files, brought to the job's log.

verl writes one file per step into ``trainer.rollout_data_dir`` on the node where its trainer
runs (one JSON object a line: ``input``, ``output``, ``gts``, ``score``, ``step`` and the reward
function's extra fields); tiny-grpo writes the same. The service cannot see that node's disk and
the job never calls the service, so the samples travel the one way the service already reads:
the job's log. Ray's ``worker_process_setup_hook`` (``setup_worker``) starts a shipper thread in
the job's workers; on each node one of them (an ``flock`` on the directory decides) reads each
new step file, keeps a bounded part (every ``every``-th step, the first ``per_step`` lines, each
text field cut at ``FIELD_CHARS``, secret values masked) and writes it as framed lines, which
Ray forwards to the job's log with the worker's other output. A step's frames go out in one
write to the output's descriptor, after a newline, so that no other writer's line can be open
around them (``print`` writes its text and its newline apart, and another thread can write in
between). A shipped step is recorded in the directory, so a later holder of the lock goes on
where the last one stopped.

``read_sample`` is the one check of a sample both sides make: the shipper on each file line,
the service on each framed line (a job can print anything).

Never imports ``service``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from typing import IO, Any

PREFIX = "rlrun-sample "
# Where a recipe has the trainer write them, under the run's own directory.
SUBDIR = "rollout-samples"
DIR_ENV = "RLRUN_SAMPLES_DIR"
EVERY_ENV = "RLRUN_SAMPLES_EVERY"
PER_STEP_ENV = "RLRUN_SAMPLES_PER_STEP"
# Env names whose values are masked in what is shipped (the run's secrets; set by the service).
MASKED_ENV = "RLRUN_SAMPLES_MASK"
WORKER_HOOK = "jobs.samples.setup_worker"

# The text of a field is cut at this many characters, and the cut is marked (``cut``).
FIELD_CHARS = 4000
# Extra fields beyond the known ones (the reward function's): at most this many, a text value
# cut at EXTRA_CHARS.
MAX_EXTRAS = 16
EXTRA_CHARS = 256
# A file line longer than this is skipped unread (counted as ``too_long``).
MAX_LINE_BYTES = 1 << 20
MASK = "***"
KNOWN = ("input", "output", "gts", "score", "step")
# How often the shipper looks, and how long a step file must be left alone before it is read
# (verl writes one in a moment): a job ends soon after its last step.
LOOK_S = 0.25
_SHIPPED = ".rlrun-shipped"
_LOCK = ".rlrun-ship.lock"


def redact(text: str, values: list[str]) -> str:
    """``text`` with every secret value in ``values`` replaced by the mask (values of fewer than
    four characters are left: they would mask ordinary words)."""
    for value in sorted(values, key=len, reverse=True):
        if len(value) >= 4:
            text = text.replace(value, MASK)
    return text


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


def read_sample(
    raw: bytes | str, field_chars: int = FIELD_CHARS, secrets: list[str] | None = None
) -> dict[str, Any] | str:
    """The bounded sample in one line, or why it is skipped: ``too_long``, ``not_utf8``,
    ``not_json``, ``not_object``, ``bad_score`` (NaN, infinite, or not a number), ``bad_step``.

    A kept sample: ``step``, ``input``, ``output``, ``gts`` (text), ``score`` (a float),
    ``extras`` (the other fields, text cut alike), ``cut`` (the fields that were cut)."""
    if len(raw) > MAX_LINE_BYTES:
        return "too_long"
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError:
            return "not_utf8"
    try:
        obj = json.loads(raw, parse_constant=lambda c: float(c))
    except ValueError:
        return "not_json"
    if not isinstance(obj, dict):
        return "not_object"
    score = obj.get("score")
    if isinstance(score, bool) or not isinstance(score, int | float) or not math.isfinite(score):
        return "bad_score"
    step = obj.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 2**62:
        return "bad_step"
    secrets = secrets or []
    cut: list[str] = [c for c in obj.get("cut", []) if isinstance(c, str)][: MAX_EXTRAS + 3]

    def bounded(name: str, value: Any, chars: int = field_chars) -> str:
        text = redact(_text(value), secrets)
        if len(text) > chars:
            if name not in cut:
                cut.append(name)
            return text[:chars]
        return text

    nested = obj.get("extras")
    extras_in: dict[str, Any] = nested if isinstance(nested, dict) else obj
    extras: dict[str, Any] = {}
    for key, value in extras_in.items():
        if key in KNOWN or key in ("extras", "cut", "of") or len(extras) >= MAX_EXTRAS:
            continue
        name = str(key)[:64]
        if isinstance(value, bool) or value is None:
            extras[name] = value
        elif isinstance(value, int | float):
            extras[name] = float(value) if math.isfinite(value) else str(value)
        else:
            extras[name] = bounded(name, value, EXTRA_CHARS)
    sample: dict[str, Any] = {
        "step": step,
        "input": bounded("input", obj.get("input")),
        "output": bounded("output", obj.get("output")),
        "gts": bounded("gts", obj.get("gts")),
        "score": float(score),
        "extras": extras,
        "cut": cut,
    }
    if isinstance(obj.get("of"), int) and not isinstance(obj.get("of"), bool):
        sample["of"] = obj["of"]
    return sample


# Ray colours the ``(Actor pid=...)`` prefix of a forwarded line.
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")


def frame_body(line: str) -> str | None:
    """The framed text of ``line``, or None when it is not a frame: the prefix at its start,
    or after Ray's ``(Actor pid=...)`` (coloured or not)."""
    at = line.find(PREFIX)
    if at < 0:
        return None
    if at > 0 and not _COLOUR.sub("", line[:at]).rstrip().endswith(")"):
        return None
    return line[at + len(PREFIX) :].rstrip("\r\n")


def parse_frame(line: str) -> dict[str, Any] | str | None:
    """A framed line of the job log (Ray's ``(Actor pid=...)`` prefix allowed): its sample,
    a skip report ``{"skipped": {reason: n}, "step": s}``, or why it is skipped; None when the
    line is not a frame."""
    body = frame_body(line)
    if body is None:
        return None
    if body.startswith('{"skipped"'):
        try:
            report = json.loads(body)
        except ValueError:
            return "not_json"
        skipped = report.get("skipped") if isinstance(report, dict) else None
        if isinstance(skipped, dict) and all(
            isinstance(k, str) and isinstance(v, int) and 0 <= v < 2**31 for k, v in skipped.items()
        ):
            return {"skipped": {k[:32]: v for k, v in skipped.items()}}
        return "not_json"
    return read_sample(body)


# The shipper (runs in the job's workers, on the trainer's node among others).


def frames(lines: Iterator[bytes], step: int, per_step: int, secrets: list[str]) -> Iterator[str]:
    """The framed lines for one step file: its first ``per_step`` good samples (each with
    ``of``, how many good ones the file held), then one skip report if any line was bad."""
    kept: list[dict[str, Any]] = []
    good = 0
    skipped: dict[str, int] = {}
    for raw in lines:
        got = read_sample(raw, secrets=secrets)
        if isinstance(got, str):
            skipped[got] = skipped.get(got, 0) + 1
            continue
        good += 1
        if len(kept) < per_step:
            got["step"] = step
            kept.append(got)
    for sample in kept:
        sample["of"] = good
        yield PREFIX + json.dumps(sample, ensure_ascii=False, separators=(",", ":"))
    if skipped:
        yield PREFIX + json.dumps({"skipped": skipped, "step": step}, separators=(",", ":"))


def file_lines(f: IO[bytes], limit: int = MAX_LINE_BYTES) -> Iterator[bytes]:
    """The lines of ``f``; one longer than ``limit`` comes back as ``limit + 1`` bytes and its
    rest is passed over unread into memory."""
    while True:
        line = f.readline(limit + 1)
        if not line:
            return
        if len(line) > limit and not line.endswith(b"\n"):
            while (more := f.readline(limit)) and not more.endswith(b"\n"):
                pass
        yield line.rstrip(b"\r\n") if len(line) <= limit else line


def wanted(step: int, every: int) -> bool:
    return step == 1 or (every > 0 and step % every == 0)


def _pending(directory: str) -> list[tuple[int, str]]:
    """The step files in ``directory`` not shipped (nor passed over) yet, by step."""
    try:
        with open(os.path.join(directory, _SHIPPED)) as f:
            done = {int(s) for s in f.read().split()}
    except (OSError, ValueError):
        done = set()
    steps: list[tuple[int, str]] = []
    with contextlib.suppress(OSError):
        for name in os.listdir(directory):
            stem, dot, ext = name.partition(".")
            if dot and ext == "jsonl" and stem.isdigit() and int(stem) not in done:
                steps.append((int(stem), os.path.join(directory, name)))
    return sorted(steps)


def ship_once(
    directory: str, every: int, per_step: int, secrets: list[str], out: IO[str], settle_s: float
) -> int:
    """Ship each step file not shipped yet (and older than ``settle_s``, so verl has finished
    writing it); returns how many were shipped."""
    done_path = os.path.join(directory, _SHIPPED)
    shipped = 0
    now = time.time()
    for step, path in _pending(directory):
        try:
            if now - os.path.getmtime(path) < settle_s:
                continue
            if wanted(step, every):
                with open(path, "rb") as f:
                    emit(out, list(frames(file_lines(f), step, per_step, secrets)))
                shipped += 1
        except OSError:
            continue
        with open(done_path, "a") as f:
            f.write(f"{step}\n")
    return shipped


def emit(out: IO[str], lines: list[str]) -> None:
    """Write ``lines`` to ``out`` each whole and on a line of its own: a newline first (it ends
    a line another writer left open; else it is an empty line), then all of them in one write
    to the descriptor, outside ``out``'s buffer. ``out`` without a descriptor: written to it."""
    text = "\n" + "".join(line + "\n" for line in lines)
    try:
        fd = out.fileno()
    except (OSError, ValueError):  # io.UnsupportedOperation is both
        out.write(text)
        out.flush()
        return
    data = text.encode()
    while data:
        data = data[os.write(fd, data) :]


def wait_shipped(directory: str, timeout_s: float = 10.0) -> bool:
    """Wait (at most ``timeout_s``) until every step file in ``directory`` was shipped or
    passed over: a job that ends right after its last step calls it before it exits, so that
    step is in its log. Whether all were."""
    deadline = time.monotonic() + timeout_s
    while _pending(directory):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def ship_left(environ: Mapping[str, str], wait_s: float = 2.0) -> int:
    """Ship the step files the workers' shippers left: the last step's, when the job ended
    before they looked again. For the launcher's watcher, once verl has exited (its workers go
    with it); under the shippers' lock, waited for ``wait_s`` at most (a shipper still alive
    keeps it, and ships them itself). Returns how many steps were shipped."""
    found = settings(environ)
    if found is None:
        return 0
    directory, every, per_step, secrets = found
    deadline = time.monotonic() + wait_s
    while (lock := _take_lock(directory)) is None:
        if time.monotonic() > deadline:
            return 0
        time.sleep(0.05)
    with lock:
        return ship_once(directory, every, per_step, secrets, sys.stdout, settle_s=0.0)


def _take_lock(directory: str) -> IO[str] | None:
    """The shippers' lock on ``directory``, held while the file stays open; None when another
    holds it or it cannot be opened."""
    import fcntl

    try:
        handle = open(os.path.join(directory, _LOCK), "a")  # noqa: SIM115 - the lock's life
    except OSError:
        return None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return None
    return handle


def _ship_forever(directory: str, every: int, per_step: int, secrets: list[str]) -> None:
    lock = None
    while lock is None:
        with contextlib.suppress(OSError):
            os.makedirs(directory, exist_ok=True)
        if (lock := _take_lock(directory)) is None:
            time.sleep(5.0)
    with lock:  # held for the worker's life: the open file is the lock
        while True:
            with contextlib.suppress(Exception):  # shipping never takes the worker down
                ship_once(directory, every, per_step, secrets, sys.stdout, settle_s=LOOK_S)
            time.sleep(LOOK_S)


def env(directory: str, every: int, per_step: int, masked: Mapping[str, str]) -> dict[str, str]:
    """The job's variables that start the shipper (``masked``: env names whose values the
    shipper masks)."""
    return {
        DIR_ENV: directory,
        EVERY_ENV: str(every),
        PER_STEP_ENV: str(per_step),
        MASKED_ENV: ",".join(sorted(masked)),
    }


def settings(environ: Mapping[str, str]) -> tuple[str, int, int, list[str]] | None:
    directory = environ.get(DIR_ENV)
    if not directory:
        return None
    try:
        every = max(1, int(environ.get(EVERY_ENV, "1")))
        per_step = max(1, int(environ.get(PER_STEP_ENV, "64")))
    except ValueError:
        return None
    names = [n for n in environ.get(MASKED_ENV, "").split(",") if n]
    return directory, every, per_step, [environ[n] for n in names if environ.get(n)]


def hook(runtime_env: dict[str, Any]) -> None:
    """Set the shipper's ``worker_process_setup_hook`` in a runtime env whose run keeps samples
    (it redeems a grant first, so it stands in for the grant's own hook): the service's
    submission and the exported script send the same."""
    if DIR_ENV in runtime_env.get("env_vars", {}):
        runtime_env["worker_process_setup_hook"] = WORKER_HOOK


def setup_worker() -> None:
    """Ray's ``worker_process_setup_hook``: the grant's values first (``jobs.grant``), then a
    shipper thread when the run keeps samples."""
    from jobs import grant

    grant.setup_worker()
    found = settings(os.environ)
    if found is not None:
        threading.Thread(
            target=_ship_forever, args=found, name="rlrun-samples", daemon=True
        ).start()
