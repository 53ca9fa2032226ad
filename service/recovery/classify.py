"""Why a run failed, read from its log and Ray's word on the job: a class, a one-line summary,
the decisive lines with their offsets in the kept log, and a hint of what to change.

A log usually holds a cause and then its echoes (an actor that ran out of memory, then "the
actor died"), so the classes come in two tiers: causes (out of memory, a collective timing out,
a lost node, a missing file or module, a bad override, a shape that cannot be scheduled), of
which the earliest in the log wins, and effects (the async pipeline failing, an actor dying),
named only when no cause is found. A log with neither is ``unknown``, never a guess.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import get_args

from service.metrics.ansi import strip_ansi
from service.retry_policy import RetryClass

# The classes a run's failure can have (``RetryClass``), and ``cancelled``.
FAILURE_CLASSES: tuple[str, ...] = (*get_args(RetryClass), "cancelled")
MAX_EVIDENCE = 3
MAX_LINE = 300


@dataclass(frozen=True)
class Evidence:
    offset: int | None  # of the line's first character in the kept log (None: Ray's message)
    line: str


@dataclass(frozen=True)
class Failure:
    cls: str
    summary: str
    hint: str
    evidence: list[Evidence] = field(default_factory=list)


@dataclass(frozen=True)
class _Rule:
    cls: str
    pattern: re.Pattern[str]
    summary: str
    hint: str


_TRAINER_MEMORY = (
    "the trainer group: lower actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu or "
    "ppo_max_token_len_per_gpu, or turn on actor.fsdp_config.param_offload / "
    "optimizer_offload and model.enable_gradient_checkpointing"
)
_ROLLOUT_MEMORY = (
    "the rollout group: lower actor_rollout_ref.rollout.gpu_memory_utilization or "
    "max_num_batched_tokens, or raise rollout.tensor_model_parallel_size"
)
# A line Ray's autoscaler prints into every driver's log (any job's demand that no node fits):
# never evidence of what happened to this run. Jobs are started with these events off
# (``loops.submitter``); a log from before then, or a job that turned them on, may hold them.
_CLUSTER_WIDE = "(autoscaler +"
# Ray's prefix of a rollout server's or engine's line, or a frame in rollout code.
_ROLLOUT_LINE = re.compile(r"vllm|sglang|rollout|Rollouter", re.I)

_CAUSES = [
    _Rule(
        "npu_oom",
        re.compile(r"(NPU|CUDA) out of memory|OutOfMemoryError: (NPU|CUDA)"),
        "an accelerator ran out of memory",
        "",  # chosen by the group the line came from: see _memory_hint
    ),
    _Rule(
        "host_oom",
        re.compile(
            r"killed due to the node running low on memory|killed due to memory pressure"
            r"|RayOutOfMemoryError|Out of memory: Killed process"
        ),
        "a node ran out of host memory and Ray (or the kernel) killed a worker",
        "give the driver and workers fewer processes or less data in memory per node "
        "(data.dataloader_num_workers, rollout agent workers), or spread the run over more nodes",
    ),
    _Rule(
        "collective_timeout",
        re.compile(
            r"Watchdog caught collective operation timeout|\bEI000[26]\b"
            r"|Notify register times out|Getting socket times out|HCCL.{0,80}time[sd]? ?out"
            r"|NCCL.{0,80}timeout",
            re.I,
        ),
        "a collective operation (HCCL/NCCL) timed out",
        "look for an earlier error on another rank first; a rank that is only slow needs a "
        "longer HCCL_EXEC_TIMEOUT / HCCL_CONNECT_TIMEOUT (NCCL: the process group timeout)",
    ),
    _Rule(
        "node_lost",
        re.compile(
            r"has been marked dead because the (detector|monitor) has missed too many heartbeats"
            r"|mistakenly been marked (as )?dead|NodeDiedError|node (\S+ )?(died|was removed)",
            re.I,
        ),
        "a node of the run left the cluster",
        "retry the run; if the same node keeps leaving, take it out of the cluster",
    ),
    _Rule(
        "missing_path",
        re.compile(
            r"FileNotFoundError|No such file or directory|does not appear to have a file named"
            r"|Unable to find '"
        ),
        "a file or directory the run needs is not there",
        "check data.train_files, data.val_files, the model path and the checkpoint dir on every "
        "node of the run (the preflight line names the node)",
    ),
    _Rule(
        "import_error",
        re.compile(r"ModuleNotFoundError|ImportError|No module named"),
        "a Python module or name could not be imported",
        "the worker image's packages do not match what the run needs: compare verl, vllm, "
        "vllm-ascend and torch_npu versions with the image's constraints",
    ),
    _Rule(
        "config_error",
        re.compile(
            r"Could not override '|Error merging override|is not in struct|Key '[^']+' not in '"
            r"|ConfigCompositionException|omegaconf\.errors\.\w+"
        ),
        "verl's configuration refused an override",
        "fix the named key (a dry run composes the config and names the field)",
    ),
    _Rule(
        "unschedulable",
        re.compile(
            r"cannot be scheduled right now|pending and cannot currently be scheduled"
            r"|pending placement groups|No available node types can fulfill",
        ),
        "an actor or placement group of the run could not be scheduled",
        "a group needs more accelerators on one node than any node has free: lower the "
        "group's accelerators per node (resources.*) or wait for the holder to end",
    ),
]
_EFFECTS = [
    _Rule(
        "async_pipeline_error",
        re.compile(
            r'File "[^"]*(fully_async_policy|agent_loop|/rollout/)[^"]*"|Rollouter.*(error|failed)'
        ),
        "the asynchronous rollout pipeline failed",
        "the rollouter's traceback above names the failing call; partial rollouts and the "
        "message queue stop with it",
    ),
    _Rule(
        "actor_died",
        re.compile(
            r"ActorDiedError|RayActorError|The actor died unexpectedly|A worker died or was killed"
            r"|Worker unexpectedly exits|^Ray's state API: actor \S+ died:"
        ),
        "an actor of the run died",
        "the actor's own log holds the reason (a crash, SIGKILL, or an error before this line)",
    ),
]
# Ray's error types that say what happened without a log.
_RAY_ERRORS = {
    "JOB_SUPERVISOR_ACTOR_START_TIMEOUT": "unschedulable",
    "RUNTIME_ENV_SETUP_FAILURE": "import_error",
}


def classify(
    log: str,
    offset: int = 0,
    ray_error_type: str | None = None,
    ray_message: str = "",
    ray_state: str = "",
) -> Failure:
    """The failure that ``log`` (starting at ``offset`` in the kept log), Ray's state API's
    lines on the job (``recovery.deaths``: a cause there outranks an effect in the log) and
    Ray's error type and message show."""
    found = (
        _first_cause(log, offset)
        or _first_cause(ray_state, None)
        or _effect(log, offset)
        or _effect(ray_state, None)
    )
    if found is None and ray_message:
        found = _first_cause(ray_message, None) or _effect(ray_message, None)
    if found is None and ray_error_type in _RAY_ERRORS:
        rule = _rule(_RAY_ERRORS[ray_error_type])
        return Failure(rule.cls, f"{rule.summary} (Ray: {ray_error_type})", rule.hint)
    if found is None:
        return Failure("unknown", "no known cause in the log", "read the log's last lines")
    rule, evidence = found
    hint = _memory_hint(evidence) if rule.cls == "npu_oom" else rule.hint
    return Failure(rule.cls, rule.summary, hint, evidence)


def _first_cause(text: str, offset: int | None) -> tuple[_Rule, list[Evidence]] | None:
    """The cause whose first line comes earliest in ``text``."""
    best: tuple[int, _Rule, list[Evidence]] | None = None
    for rule in _CAUSES:
        at, evidence = _matches(rule, text, offset)
        if evidence and (best is None or at < best[0]):
            best = (at, rule, evidence)
    return None if best is None else (best[1], best[2])


def _effect(text: str, offset: int | None) -> tuple[_Rule, list[Evidence]] | None:
    for rule in _EFFECTS:
        _, evidence = _matches(rule, text, offset)
        if evidence:
            return rule, evidence
    return None


def _matches(rule: _Rule, text: str, offset: int | None) -> tuple[int, list[Evidence]]:
    """Where in ``text`` the first line ``rule`` matches is, and the first few such lines
    (their offsets in the kept log: ``offset`` plus their place in ``text``)."""
    out: list[Evidence] = []
    at, first = 0, -1
    for line in text.splitlines(keepends=True):
        if rule.pattern.search(line) and not strip_ansi(line).startswith(_CLUSTER_WIDE):
            first = at if first < 0 else first
            out.append(Evidence(None if offset is None else offset + at, line.rstrip()[:MAX_LINE]))
            if len(out) == MAX_EVIDENCE:
                break
        at += len(line)
    return first, out


def _memory_hint(evidence: list[Evidence]) -> str:
    if any(_ROLLOUT_LINE.search(e.line) for e in evidence):
        return f"give {_ROLLOUT_MEMORY}"
    return f"give the group that ran out more room; for {_TRAINER_MEMORY}; for {_ROLLOUT_MEMORY}"


def _rule(cls: str) -> _Rule:
    return next(r for r in _CAUSES + _EFFECTS if r.cls == cls)


def of_class(cls: str, summary: str, evidence: list[Evidence]) -> Failure:
    """A failure of ``cls`` found from another source than the log (Ray's state API), with the
    class's hint."""
    return Failure(cls, summary, _rule(cls).hint, evidence)
