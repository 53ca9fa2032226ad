"""Failure classes from real logs: every excerpt in tests/data/failures (each from a public
report, named in its header) through the classifier."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from service.recovery.classify import FAILURE_CLASSES, classify

CORPUS = sorted((Path(__file__).parent / "data" / "failures").glob("*.log"))


def _excerpt(path: Path) -> tuple[str, str]:
    """(expected class, the log lines) of a corpus file; its header says both."""
    header = [line for line in path.read_text().splitlines() if line.startswith("# ")]
    meta = dict(line[2:].split(": ", 1) for line in header if ": " in line[2:])
    assert meta["source"].startswith("https://github.com/"), path.name
    body = "".join(
        line for line in path.read_text().splitlines(keepends=True) if not line.startswith("# ")
    )
    return meta["class"], body


def test_the_corpus_is_large_and_wide_enough() -> None:
    classes = Counter(_excerpt(path)[0] for path in CORPUS)
    assert sum(classes.values()) >= 25
    assert len(classes) >= 10
    assert set(classes) <= set(FAILURE_CLASSES)


def test_the_corpus_is_classified_right_and_never_wrongly_when_unsure() -> None:
    right, wrong = 0, []
    for path in CORPUS:
        expected, body = _excerpt(path)
        got = classify(body).cls
        if got == expected:
            right += 1
        elif got != "unknown":
            wrong.append(f"{path.name}: {got}")
    print(f"\n{right}/{len(CORPUS)} right; wrong: {wrong}")
    assert right >= 0.9 * len(CORPUS)
    assert not wrong  # a class the service is not sure of is "unknown", never another


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.stem)
def test_each_excerpt_has_its_class_and_its_decisive_lines(path: Path) -> None:
    expected, body = _excerpt(path)
    failure = classify(body, offset=1000)
    assert failure.cls == expected
    assert failure.evidence and failure.summary and failure.hint
    for evidence in failure.evidence:
        # Offsets point into the kept log: the line is there.
        assert evidence.offset is not None
        assert body[evidence.offset - 1000 :].startswith(evidence.line[:50])


def test_a_cause_outranks_the_actor_deaths_it_causes() -> None:
    log = (
        "(WorkerDict pid=1) RuntimeError: NPU out of memory. Tried to allocate 2.00 GiB\n"
        "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\n"
    )
    assert classify(log).cls == "npu_oom"
    assert classify(log.splitlines(keepends=True)[1]).cls == "actor_died"


def test_the_hint_names_the_memory_of_the_group_that_ran_out() -> None:
    rollout = classify("(vLLMHttpServer pid=7) torch.OutOfMemoryError: NPU out of memory.\n")
    trainer = classify("(DetachActorWorker pid=8) RuntimeError: NPU out of memory.\n")
    assert "gpu_memory_utilization" in rollout.hint and "micro_batch" not in rollout.hint
    assert "micro_batch" in trainer.hint


def test_without_a_log_ray_s_word_decides_and_nothing_is_a_guess() -> None:
    assert classify("", ray_error_type="JOB_SUPERVISOR_ACTOR_START_TIMEOUT").cls == "unschedulable"
    ray_says = classify("", ray_message="... FileNotFoundError: /data/x.parquet")
    assert ray_says.cls == "missing_path" and ray_says.evidence[0].offset is None
    assert classify("step:3 - critic/score/mean:0.5\nall done\n").cls == "unknown"


def test_the_autoscaler_s_word_on_another_job_s_demand_is_no_cause_of_this_run_s_failure() -> None:
    # Ray prints its autoscaler's events into every driver's log, whichever job's demand they
    # are about: this run's actor died, another job waits for a resource no node has.
    log = (
        "\x1b[33m(autoscaler +12s)\x1b[0m Tip: use `ray status` to view detailed cluster status.\n"
        "(autoscaler +12s) Warning: The following resource request cannot be scheduled right "
        "now: {'other_team': 1.0}.\n"
        "\x1b[33m(autoscaler +12s)\x1b[0m Error: No available node types can fulfill resource "
        "request {'other_team': 1.0}. Add suitable node types to this cluster.\n"
        "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\n"
    )
    failure = classify(log)
    assert failure.cls == "actor_died", failure
    assert "other_team" not in str(failure)
    # The run's own driver's word that its actor cannot be scheduled still counts.
    own = "WARNING worker.py:1 -- The actor or task with ID ff cannot be scheduled right now.\n"
    assert classify(own + log).cls == "unschedulable"
