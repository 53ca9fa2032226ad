"""The classifier's rules: for each failure class the lines that show it, as reporters' logs
and Ray word them, with a one-line summary and what to change.

Each pattern was written from the excerpts in ``tests/data/failures`` (the rule set), never
from ``tests/data/failures/held_out``, which measures how the rules carry to logs they were
not written on (``tests/benchmarks/bench_diagnosis.py``). Lines Ray's state API gives on a
job's dead actors read ``Ray's state API: actor <class> died (<death context>[, <reason>]):
<messages>`` (``recovery.deaths``); the rules read the context and reason there as Ray's own
word on why the actor died.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from service.recovery.roots import Raised


@dataclass(frozen=True)
class Rule:
    """A class and the lines that show it (a pattern searched in the whole text, so made to
    match within a line: ``^`` is a line's start, nothing spans a newline)."""

    cls: str
    pattern: re.Pattern[str]
    summary: str
    hint: str


TRAINER_MEMORY = (
    "the trainer group: lower actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu or "
    "ppo_max_token_len_per_gpu, or turn on actor.fsdp_config.param_offload / "
    "optimizer_offload and model.enable_gradient_checkpointing"
)
ROLLOUT_MEMORY = (
    "the rollout group: lower actor_rollout_ref.rollout.gpu_memory_utilization or "
    "max_num_batched_tokens, or raise rollout.tensor_model_parallel_size"
)

# Causes: of these, the one whose first line comes earliest in the log wins (a tie goes to the
# rule listed first); a wait to be placed (``WAITS``) only when no other cause shows, since
# Ray and vLLM say so while they wait, and the wait may end before the run fails otherwise.
WAITS = ("unschedulable",)
CAUSES = [
    Rule(
        "npu_oom",
        # Torch words it "CUDA error: out of memory", older torch "cuda runtime error (2) : ...".
        re.compile(
            r"(NPU|CUDA) out of memory|OutOfMemoryError: (NPU|CUDA)"
            r"|(?i:cuda)( runtime)? error ?(\(2\))? ?: ?out of memory"
        ),
        "an accelerator ran out of memory",
        "",  # chosen by the group the line came from (classify's memory hint)
    ),
    Rule(
        "host_oom",
        re.compile(
            r"killed due to the node running low on memory|killed due to memory pressure"
            r"|RayOutOfMemoryError|Out of memory: Killed process"
            r"|exceeds the memory usage threshold|Worker exit type: NODE_OUT_OF_MEMORY"
            r"|^Ray's state API: actor \S+ died \(oom_context"
            # the kernel's OOM killer (global or a cgroup's limit), as dmesg and a container
            # runtime word it
            r"|\boom-kill:|Memory cgroup out of memory|\bOOMKilled\b",
            re.M,
        ),
        "a node ran out of host memory and Ray (or the kernel) killed a worker",
        "give the driver and workers fewer processes or less data in memory per node "
        "(data.dataloader_num_workers, rollout agent workers), or spread the run over more nodes",
    ),
    Rule(
        "device_error",
        # "CUDA error: out of memory" is an accelerator out of memory, not a fault.
        re.compile(
            r"CUDA error: (?!out of memory)|AcceleratorError\b|NPU function error"
            r"|EZ9999\b|(aicore|vector core) execution is abnormal"
        ),
        "an accelerator or one of its kernels failed (an illegal access, a device fault)",
        "retry once (a device can fault once); if it comes back, on the same node or the same "
        "step, check the driver / CANN and torch_npu versions, the attention backend "
        "(VLLM_ATTENTION_BACKEND) and the device's health (npu-smi, nvidia-smi)",
    ),
    Rule(
        "collective_timeout",
        re.compile(
            r"Watchdog caught collective operation timeout|EI000[26]\b"
            r"|Notify register times out|Getting socket times out"
            r"|HCCL.{0,80}(?i:time[sd]? ?out)|NCCL.{0,80}(?i:timeout)|client socket has timed out"
        ),
        "a collective operation (HCCL/NCCL) timed out",
        "look for an earlier error on another rank first; a rank that is only slow needs a "
        "longer HCCL_EXEC_TIMEOUT / HCCL_CONNECT_TIMEOUT (NCCL: the process group timeout)",
    ),
    Rule(
        "collective_error",
        # NCCL's warnings of a failure only: others (a plugin not found) are printed at start.
        re.compile(
            r"NCCL error|nccl(UnhandledCudaError|SystemError|InternalError|RemoteError"
            r"|InvalidUsage)\b|NCCL WARN (Net : (Call to|Connection closed)"
            r"|NET/\w+ : Got completion|Cuda failure|Call to ibv_\w+ failed)|DistBackendError"
            # the process group's TCP store could not listen (its port taken)
            r"|DistNetworkError"
            r"|HCCL function error|hccl api failed|\bEI0009\b|Transport init error"
        ),
        "a collective operation (HCCL/NCCL) failed: a peer, the network or the library",
        "check the network between the nodes (NCCL_SOCKET_IFNAME / HCCL_IF_IP, InfiniBand / "
        "RoCE links), that every node runs the same NCCL / CANN, and whether another rank "
        "crashed first (its log)",
    ),
    Rule(
        "node_lost",
        re.compile(
            r"has been marked dead because the (detector|monitor) has missed too many heartbeats"
            r"|mistakenly been marked (as )?dead|NodeDiedError|node (\S+ )?(died|was removed)"
            # Ray's word on a task or actor whose node went, with or without the exception's
            # name, and the GCS's health check that calls a node dead
            r"|node\b[^\n]{0,60}\b(is|was) dead or unavailable|Health check failed for node"
            # the GCS's word on the actors a dead node owned (gcs_actor_manager.cc, OnNodeDead)
            r"|Owner's node has crashed"
            r"|^Ray's state API: actor \S+ died \(\w+, NODE_DIED\)",
            re.I | re.M,
        ),
        "a node of the run left the cluster",
        "retry the run; if the same node keeps leaving, take it out of the cluster",
    ),
    Rule(
        "missing_path",
        re.compile(
            # not on a warning's line: vLLM on CPU warns that libnuma is missing
            r"^(?!.*Warning: ).*(?:FileNotFoundError|No such file or directory"
            r"|does not appear to have a file named|Unable to find '|HFValidationError"
            r"|is not a local folder and is not a valid model|Incorrect path_or_model_id)",
            re.M,
        ),
        "a file or directory the run needs is not there",
        "check data.train_files, data.val_files, the model path and the checkpoint dir on every "
        "node of the run (the preflight line names the node)",
    ),
    Rule(
        "import_error",
        re.compile(
            # not on a warning's line: verl warns of each optional engine it cannot import
            r"^(?!.*Warning: ).*(?:ModuleNotFoundError|ImportError|No module named)"
            r"|^Ray's state API: actor \S+ died \(runtime_env_failed_context",
            re.M,
        ),
        "a Python module or name could not be imported",
        "the worker image's packages do not match what the run needs: compare verl, vllm, "
        "vllm-ascend and torch_npu versions with the image's constraints",
    ),
    Rule(
        "config_error",
        re.compile(
            r"Could not override '|Error merging override|is not in struct|Key '[^'\n]+' not in '"
            r"|ConfigCompositionException|omegaconf\.errors\.\w+"
            # a key Hydra adds (``+key=``) that verl's config dataclass refuses at run time
            r"|\w+Config\.__init__\(\) got an unexpected keyword argument '"
        ),
        "verl's configuration refused an override",
        "fix the named key (a dry run composes the config and names the field)",
    ),
    Rule(
        "unschedulable",
        re.compile(
            r"cannot be scheduled right now|pending and cannot currently be scheduled"
            # the autoscaler's status, under "Demands:": a shape no node takes, waiting (its
            # placement groups', its tasks' and actors' alike)
            r"|pending placement groups|\d\+ pending tasks/actors"
            r"|No available node types can fulfill"
            r"|Waiting for creating a placement group|required GPUs exceeds the total number"
            r"|no nodes have the necessary resources|cannot satisfy its resource requirements"
            r"|Failed to (schedule|create) placement group|could not find a node type to satisfy"
            r"|Could not find a node with enough \w+ or other resources"
            # Ray's word for a demand no node of the cluster can ever hold
            r"|\b[Ii]nfeasible\b"
            r"|^Ray's state API: actor \S+ died \(actor_unschedulable_context",
            re.M,
        ),
        "an actor or placement group of the run could not be scheduled",
        "a group needs more accelerators on one node than any node has free: lower the "
        "group's accelerators per node (resources.*) or wait for the holder to end",
    ),
    Rule(
        "nan",
        # And a metric line of verl's whose loss is NaN (classify reads those with
        # metrics.parse); a Hugging Face trainer's log dict says so of its grad norm too.
        re.compile(
            r"returned nan values in its \w+ output|'(loss|grad_norm)': nan\b"
            r"|probability tensor contains either `inf`, `nan`"
        ),
        "training produced NaN",
        "resume from a checkpoint before the NaN with a lower learning rate or a tighter "
        "actor_rollout_ref.actor.grad_clip; check the reward for NaN/inf and the KL estimator "
        "(actor.kl_loss_type)",
    ),
]

# Effects: named only when no cause is; the first rule that matches wins. A death Ray reports
# outranks the rollout frames it surfaced in (a rollout server's sleep or wake-up calls every
# worker, so a worker's death shows there), but not the async pipeline's own actors dying.
_DIED_SUMMARY = "an actor of the run died"
_DIED_HINT = "the actor's own log holds the reason (a crash, SIGKILL, or an error before this line)"
_ASYNC_SUMMARY = "the asynchronous rollout pipeline failed"
_ASYNC_HINT = (
    "the rollouter's traceback above names the failing call; partial rollouts and the "
    "message queue stop with it"
)
EFFECTS = [
    # A task of the pipeline that failed because an actor it called died (a rollout server
    # killed under the agent loop's generate call): the death, not the pipeline's code.
    Rule(
        "actor_died",
        re.compile(r"RayTaskError\((?:ActorDiedError|RayActorError)\)"),
        _DIED_SUMMARY,
        _DIED_HINT,
    ),
    Rule(
        "async_pipeline_error",
        re.compile(
            r"ray::(AgentLoopWorker|FullyAsyncRollouter|ParameterSynchronizer|MessageQueue)\b"
            r"|EngineDeadError|Engine background task failed"
            r"|HTTPStatusError: Server error '5\d\d"
        ),
        _ASYNC_SUMMARY,
        _ASYNC_HINT,
    ),
    Rule(
        "actor_died",
        re.compile(
            r"ActorDiedError|RayActorError|The actor died unexpectedly|A worker died or was killed"
            r"|Worker unexpectedly exits|^Ray's state API: actor \S+ died\b",
            re.M,
        ),
        _DIED_SUMMARY,
        _DIED_HINT,
    ),
    Rule(
        "async_pipeline_error",
        re.compile(
            r'File "[^"\n]*(fully_async_policy|agent_loop|/rollout/)[^"\n]*"'
            r"|Rollouter.*(error|failed)"
        ),
        _ASYNC_SUMMARY,
        _ASYNC_HINT,
    ),
]

# verl's, Hydra's and its config dataclasses' start-up validation: an assertion or a refused
# value raised while the config, a worker, the trainer or the rollouter is built (in a
# dataclass's ``__post_init__``, a constructor, a ``validate``/``check`` function, or an actor's
# creation task, as Ray says), whatever Ray wrapped it in on its way to the driver.
REFUSED = Rule(
    "config_error",
    re.compile(r"(?!)"),  # found from the log's root exception (``refused``), not a pattern
    "verl refused its configuration at start-up",
    "change the named key (a dry run composes the config and names the field)",
)
_REFUSALS = {"AssertionError", "ValueError", "TypeError"}
_VALIDATING = re.compile(r"^(__post_init__|__init__|_?validate\w*|_?check\w*|__new__)$")
_CONFIG_FILE = re.compile(r"/config/|/omegaconf/|/hydra/|^<string>$")


def refused(root: Raised) -> bool:
    """Whether ``root`` is verl refusing its configuration as it starts."""
    if root.type not in _REFUSALS:
        return False
    if root.creation:
        return True
    inner = root.innermost
    return inner is not None and bool(_VALIDATING.match(inner[1]) or _CONFIG_FILE.search(inner[0]))


# A config key an error message names: a dotted path or a snake_case leaf, not a file or a call.
_KEY = re.compile(
    r"(?<![\w./-])([a-z][a-z0-9]*(?:[._][a-z0-9]+)*_[a-z0-9]+(?:\.[a-z0-9_]+)*)(?![\w/(-])"
)
MAX_KEYS = 3


def keys_named(message: str) -> list[str]:
    """The configuration keys ``message`` names, in its order, each once (at most a few)."""
    found: list[str] = []
    for key in _KEY.findall(message):
        if key not in found:
            found.append(key)
    return found[:MAX_KEYS]


# Classes whose evidence is Ray's, the kernel's or verl's own word (a memory monitor, a node
# gone, a metric line), not an exception: their lines stay first.
OWN_WORD = ("host_oom", "node_lost", "unschedulable", "nan")
# An actor's process that ended with no error of its own (a signal, a crash): Ray's words. Read
# only when no cause shows, so with no sign of memory pressure (Ray's text lists the OOM killer
# among "common causes": that is no evidence of it).
SIGNALLED = re.compile(
    r"Worker unexpectedly exits with a connection error|killed by signal|\bSIGKILL\b"
    r"|exit(ed)? (with )?code (137|-9)\b"
)
SIGNALLED_SUMMARY = (
    "an actor's process died with no error of its own and no sign of memory pressure: "
    "killed from outside the run, or a crash"
)
# On a cluster other teams share (``classify``): Ray's own record of an actor of the run whose
# process ended with no error of its own. Ray words a SIGKILL, a crash and an ``os._exit`` alike
# (its connection to the raylet closed); with no memory evidence of Ray's or the kernel's, it was
# killed from outside the run (or crashed), whatever the run's log says.
KILLED = Rule(
    "killed_outside",
    re.compile(
        r"^Ray's state API: actor \S+ died \(actor_died_error_context, WORKER_DIED\): "
        r".*Worker unexpectedly exits",
        re.M,
    ),
    "killed from outside the run: a process of the run ended by a signal (or a crash), with no "
    "memory evidence from Ray or the kernel",
    "see the audit trail (run.killed_outside) and what else ran on the cluster then: another "
    "team's job there runs as the same Unix user and can signal this run's processes; a crash "
    "shows in the actor's own log",
)


def exit_signal(code: int | None) -> int | None:
    """The signal a driver's exit code says ended it: -N from Ray (the driver itself), 128+N
    from the shell that ran it; None for an exit of its own."""
    if code is None:
        return None
    if code < 0:
        return -code
    return code - 128 if 128 < code <= 128 + 64 else None


# Effects: their summary names the root exception that set them off.
ECHOED = ("actor_died", "async_pipeline_error")

# Ray's error types that say what happened without a log.
RAY_ERRORS = {
    "JOB_SUPERVISOR_ACTOR_START_TIMEOUT": "unschedulable",
    "RUNTIME_ENV_SETUP_FAILURE": "import_error",
}

# A line that shows an error, for the evidence of a failure no rule names.
ERROR_LINE = re.compile(r"Traceback \(most recent|E(rror|xception)\b|FATAL\b|ERROR\b|[Ff]ailed\b")


def rule(cls: str) -> Rule:
    return next(r for r in [*CAUSES, *EFFECTS, KILLED] if r.cls == cls)
