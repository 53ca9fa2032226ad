"""On a cluster other teams share, a run's failure class comes from what Ray and the kernel record
or says it is the log's claim: a job of another team that writes one "NPU out of memory" line
into a run's log and then kills its trainer gets "killed from outside the run", not ``npu_oom``
(which no policy retries). The kernel's own log is read for an OOM kill of the dead processes."""

from __future__ import annotations

from pathlib import Path

from service.recovery import kernel
from service.recovery.classify import classify

FORGED = "(TaskRunner pid=7) torch.OutOfMemoryError: NPU out of memory. Tried to allocate 2 GiB\n"
DIED = (
    "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\n"
    "\tclass_name: TaskRunner\n"
)
# Ray's record of the trainer killed (SIGKILL), as ``recovery.deaths`` words it.
KILLED = (
    "Ray's state API: actor TaskRunner died (actor_died_error_context, WORKER_DIED): The actor "
    "is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit "
    "detail: Worker unexpectedly exits with a connection error code 2. End of file. Some common "
    "causes include: (1) the process was killed by the OOM killer due to high memory usage"
)
OOM_KILL = "the kernel: Out of memory: Killed process 4242 (python3) total-vm:9000000kB, UID:999"
MONITOR = (
    "Ray's state API: actor TaskRunner died (oom_context): Task was killed due to the node "
    "running low on memory."
)


def test_a_kill_after_a_forged_oom_line_reads_killed_from_outside_on_a_shared_cluster() -> None:
    log = "step:3 - a:1\n" + FORGED + DIED
    # On a team's own cluster the log is the team's own word: the OOM it says stands.
    assert classify(log, 100, ray_state=KILLED).cls == "npu_oom"
    shared = classify(log, 100, ray_state=KILLED, exit_code=1, shared=True)
    assert shared.cls == "killed_outside", shared
    assert shared.summary.startswith("killed from outside the run")
    assert "the log's claim" in shared.summary and "(npu_oom)" in shared.summary
    # Evidence is Ray's record only (no offset): no line of the log decides it.
    assert [e.offset for e in shared.evidence] == [None]
    assert "WORKER_DIED" in shared.evidence[0].line
    assert "run.killed_outside" in shared.hint


def test_memory_evidence_of_ray_or_the_kernel_is_host_oom_whatever_the_log_says() -> None:
    log = FORGED + DIED
    for word in (f"{OOM_KILL}\n{KILLED}", f"{MONITOR}\n{KILLED}"):
        found = classify(log, ray_state=word, shared=True)
        assert found.cls == "host_oom", (word, found)
        assert "the log's claim" in found.summary and "(npu_oom)" in found.summary
        assert all(e.offset is None for e in found.evidence)
    # A kernel's line in the log is the log's word there: not evidence.
    in_log = "[ 812.1] Out of memory: Killed process 4242 (python3)\n" + DIED
    assert classify(in_log, ray_state=KILLED, shared=True).cls == "killed_outside"


def test_a_driver_ended_by_a_signal_is_killed_from_outside_and_its_log_s_class_a_claim() -> None:
    for code in (-9, 137):
        found = classify(FORGED, exit_code=code, shared=True)
        assert found.cls == "killed_outside", code
        assert found.evidence[0].line == f"Ray: the job's driver exited with code {code}"
    # An exit of the job's own: the log's class, said to be its claim.
    claimed = classify(FORGED, exit_code=1, shared=True)
    assert claimed.cls == "npu_oom"
    assert claimed.summary.endswith("(the log's claim: other teams' jobs on this cluster can "
                                    "write that log)")  # fmt: skip
    # Ray's job message quotes the log's tail: that part is the log's word, not Ray's.
    message = "Job entrypoint command failed with exit code 1, last available logs:\n" + FORGED
    quoted = classify("", ray_message=message, exit_code=1, shared=True)
    assert quoted.cls == "npu_oom" and "the log's claim" in quoted.summary
    # What Ray says alone, on a shared cluster, is no claim.
    setup = classify("", ray_error_type="RUNTIME_ENV_SETUP_FAILURE", shared=True)
    assert setup.cls == "import_error" and "claim" not in setup.summary


def test_the_kernel_s_oom_kills_of_the_dead_processes_are_read_from_its_log(
    tmp_path: Path,
) -> None:
    records = tmp_path / "kmsg"
    records.write_text(
        "6,100,5000,-;eth0: link up\n"
        "3,101,6000,-;Out of memory: Killed process 4242 (python3) total-vm:9000000kB\n"
        " SUBSYSTEM=memory\n"
        "3,102,6001,-;oom-kill:constraint=CONSTRAINT_NONE,task=python3,pid=4243,uid=999\n"
        "3,103,6002,-;Out of memory: Killed process 5000 (other) total-vm:1kB\n"
    )
    assert kernel.oom_kills({4242, 4243}, records) == [
        "the kernel: Out of memory: Killed process 4242 (python3) total-vm:9000000kB",
        "the kernel: oom-kill:constraint=CONSTRAINT_NONE,task=python3,pid=4243,uid=999",
    ]
    assert kernel.oom_kills({1}, records) == []
    assert kernel.oom_kills({4242}, tmp_path / "none") == []  # no log to read: no evidence
    assert classify(FORGED, ray_state=kernel.oom_kills({4242}, records)[0], shared=True).cls == (
        "host_oom"
    )
