"""Failure classes from real logs: every excerpt of the rule set in tests/data/failures (each
from a public report, named in its header) through the classifier. The held-out excerpts it
was not written on are ``tests/test_diagnosis.py``'s."""

from __future__ import annotations

from collections import Counter

import pytest

from service.recovery.classify import FAILURE_CLASSES, classify
from tests.failure_corpus import RULE_SET, Excerpt, load, score

CORPUS = load(RULE_SET)


def test_the_rule_set_is_large_and_wide_enough() -> None:
    classes = Counter(e.cls for e in CORPUS)
    assert sum(classes.values()) >= 60
    assert len(classes) >= 12
    assert set(classes) <= set(FAILURE_CLASSES)


def test_the_rule_set_is_classified_right_and_never_wrongly_when_unsure() -> None:
    result = score(CORPUS)
    print(f"\n{result.right.total()}/{result.total} right; misses: {result.misses}")
    assert result.share(result.right) >= 0.9
    assert not result.wrong  # a class the service is not sure of is "unknown", never another


@pytest.mark.parametrize("excerpt", CORPUS, ids=lambda e: e.path.stem)
def test_each_excerpt_has_its_class_and_its_decisive_lines(excerpt: Excerpt) -> None:
    failure = classify(excerpt.body, offset=1000)
    assert failure.cls == excerpt.cls
    assert failure.evidence and failure.summary and failure.hint
    for evidence in failure.evidence:
        # Offsets point into the kept log: the line is there.
        assert evidence.offset is not None
        assert excerpt.body[evidence.offset - 1000 :].startswith(evidence.line[:50])


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


def test_the_tasks_cancelled_after_a_failure_are_not_its_cause() -> None:
    # verl's task runner cancels the rollouter's work once the trainer dies; each cancelled
    # task reports the rollout code it was in (tests/data/failures/actor_died-11.log).
    p = "\x1b[36m(FullyAsyncRollouter pid=9)\x1b[0m "
    died = (
        "\x1b[36m(FullyAsyncTaskRunner pid=7)\x1b[0m [ASYNC MAIN] Component failed with error: "
        "The actor died unexpectedly before finishing this task.\n"
    )
    cancelled = (
        f"{p}Task sample_0_8 failed with exception: ray::AgentLoopWorker.generate_sequences() "
        "(pid=14, ip=127.0.0.1)\n"
        f"{p}    raise CancelledError()\n"
        f"{p}concurrent.futures._base.CancelledError\n"
        f"{p}\n"
        f"{p}During handling of the above exception, another exception occurred:\n"
        f"{p}ray::AgentLoopWorker.generate_sequences() (pid=14, ip=127.0.0.1)\n"
        f"{p}ray.exceptions.TaskCancelledError: Task: TaskID(24) was cancelled.\n"
    )
    failure = classify(died + cancelled)
    assert failure.cls == "actor_died", failure
    assert not any("AgentLoopWorker" in e.line for e in failure.evidence)
    # A cancellation said on one line, with no traceback before it.
    alone = f"{p}ray.exceptions.RayTaskError(TaskCancelledError): ray::AgentLoopWorker.run()\n"
    assert classify(died + alone).cls == "actor_died"
    # A report is the same code failing, not cancelled: the rollout pipeline failed.
    failed = cancelled.replace("TaskCancelledError", "RuntimeError").replace("Cancelled", "Timeout")
    assert classify(died + failed).cls == "async_pipeline_error"
    # A cancel that led to a real error: that error's part of the chain still counts.
    chained = cancelled.replace(
        "ray.exceptions.TaskCancelledError: Task: TaskID(24) was cancelled.",
        "ray.exceptions.RayTaskError(EngineDeadError): ray::AgentLoopWorker.generate()",
    )
    assert classify(died + chained).cls == "async_pipeline_error"
