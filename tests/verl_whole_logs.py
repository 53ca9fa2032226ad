"""Makes the whole-log corpus (``tests/data/failures/whole``): real verl 0.9.1 runs on this
project's CPU stack, each broken in one way a user breaks it, their whole job logs kept.

    PYTHONPATH=$PWD python -m tests.verl_whole_logs [--port 48379] [cause ...]

A local Ray head (``LocalRayCluster([2], cpus_per_node=64)``, as the slow layer's runs), the
smoke assets, then per cause one run of ``tests/verl_cpu_failures.sh`` with its overrides (or
its kill), each under the host's verl lock taken for that run alone (``flock``; a run peaks near
11 GB). Each log is the job's log as Ray's Jobs API gives it (what the service copies), its
host paths normalised, gzip-compressed beside ``manifest.json``; the manifest names its cause,
the class a verl engineer gives it and what broke it. A cause's side (rule set or held out) is
its name's hash (``failure_corpus.side_of_cause``), fixed before any rule is written for it.

Not a test: it takes a minute or two a run. The tests read what it wrote.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.failure_corpus import MANIFEST, WHOLE, side_of_cause

LOCK = "/tmp/rlrun-verl-real.lock"
SCRIPT = Path(__file__).resolve().parent / "verl_cpu_failures.sh"
# A run that has not ended by then is stopped (a rollout side that failed in a weight sync
# leaves the driver waiting): what it printed until then is its log.
DEADLINE_S = 240.0


@dataclass(frozen=True)
class Cause:
    """One way to break a run: overrides on the script's, or a kill of an actor's process once
    the log shows ``after``."""

    cls: str  # the class a verl engineer gives the log (checked against the log when made)
    made: str  # in the manifest: what broke the run
    overrides: tuple[str, ...] = ()
    kill: str = ""  # an actor class: its process is SIGKILLed once ``after`` is in the log
    after: str = "step:1 "
    env: dict[str, str] = field(default_factory=dict)  # for the script (TRAINER=v1, STEPS)
    deadline_s: float = DEADLINE_S
    full_disk: bool = False  # checkpoints on a 1 MiB tmpfs


_ENGINE = "actor_rollout_ref.rollout.checkpoint_engine"
# $A: the assets; $CK: the run's checkpoint dir; $T: a scratch dir of the run.
CAUSES: dict[str, list[Cause]] = {
    "microbatch": [
        Cause(
            "config_error",
            "trainer.n_gpus_per_node=2 (micro batches of 4 on two ranks)",
            ("trainer.n_gpus_per_node=2",),
        ),
        Cause(
            "config_error",
            "trainer.n_gpus_per_node=2 with ppo_micro_batch_size_per_gpu=3",
            ("trainer.n_gpus_per_node=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"),
        ),
    ],
    "minibatch": [
        Cause(
            "config_error",
            "actor_rollout_ref.actor.ppo_mini_batch_size=3 (rollout.n=4)",
            ("actor_rollout_ref.actor.ppo_mini_batch_size=3",),
        ),
    ],
    "modelpath": [
        Cause(
            "missing_path",
            "actor_rollout_ref.model.path=$T/no-such-model",
            ("actor_rollout_ref.model.path=$T/no-such-model",),
        ),
        Cause(
            "missing_path",
            "actor_rollout_ref.model.path=$A/data (a directory with no model)",
            ("actor_rollout_ref.model.path=$A/data",),
        ),
    ],
    "tokenizerpath": [
        Cause(
            "missing_path",
            "++actor_rollout_ref.model.tokenizer_path=$T/no-such-tokenizer",
            ("++actor_rollout_ref.model.tokenizer_path=$T/no-such-tokenizer",),
        ),
    ],
    "trainfiles": [
        Cause(
            "missing_path",
            "data.train_files=$T/no-such.parquet",
            ("data.train_files=$T/no-such.parquet",),
        ),
        Cause(
            "missing_path",
            "data.train_files=$A/data/train.json (a file never written)",
            ("data.train_files=$A/data/train.json",),
        ),
    ],
    "promptlen": [
        Cause(
            "config_error",
            "data.max_prompt_length=8 (the prompts are longer)",
            ("data.max_prompt_length=8",),
        ),
    ],
    "maxmodellen": [
        Cause(
            "config_error",
            "actor_rollout_ref.rollout.max_model_len=32 (prompt 64 + response 16)",
            ("actor_rollout_ref.rollout.max_model_len=32",),
        ),
    ],
    "responselen": [
        Cause(
            "config_error",
            "data.max_response_length=512 (rollout.max_model_len=128)",
            ("data.max_response_length=512",),
        ),
    ],
    "promptkey": [
        Cause(
            "config_error",
            "data.prompt_key=question (the data has no such column)",
            ("data.prompt_key=question",),
        ),
    ],
    "rewardpath": [
        Cause(
            "missing_path",
            "custom_reward_function.path=$T/no-such-score.py",
            ("custom_reward_function.path=$T/no-such-score.py",),
        ),
    ],
    "rewardname": [
        Cause(
            "config_error",
            "custom_reward_function.path=$T/score.py custom_reward_function.name=no_such_fn",
            ("custom_reward_function.path=$T/score.py", "custom_reward_function.name=no_such_fn"),
        ),
    ],
    "staleness": [
        Cause(
            "config_error",
            "async_training.staleness_threshold=-1",
            ("async_training.staleness_threshold=-1",),
        ),
    ],
    "syncstep": [
        Cause(
            "config_error",
            "async_training.trigger_parameter_sync_step=0",
            ("async_training.trigger_parameter_sync_step=0",),
        ),
    ],
    "requirebatches": [
        Cause(
            "config_error",
            "async_training.require_batches=0",
            ("async_training.require_batches=0",),
        ),
    ],
    "genbatch": [
        Cause("config_error", "data.gen_batch_size=4", ("data.gen_batch_size=4",)),
    ],
    "lossagg": [
        Cause(
            "config_error",
            "actor_rollout_ref.actor.loss_agg_mode=token_avg",
            ("actor_rollout_ref.actor.loss_agg_mode=token_avg",),
        ),
    ],
    "advestimator": [
        Cause("config_error", "algorithm.adv_estimator=grpoo", ("algorithm.adv_estimator=grpoo",)),
    ],
    "v1batch": [
        Cause(
            "config_error",
            "TRAINER=v1, data.train_batch_size=8 (parameter_sync_step 2 x mini batch 2)",
            ("data.train_batch_size=8",),
            env={"TRAINER": "v1", "STEPS": "2"},
        ),
    ],
    "v1sync": [
        Cause(
            "config_error",
            "TRAINER=v1, trainer.v1.sampler.max_off_policy_strategy=keep",
            ("trainer.v1.sampler.max_off_policy_strategy=keep",),
            env={"TRAINER": "v1", "STEPS": "2"},
        ),
    ],
    "tpsize": [
        Cause(
            "config_error",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=2 (one device a replica)",
            ("actor_rollout_ref.rollout.tensor_model_parallel_size=2",),
        ),
    ],
    "typokey": [
        Cause(
            "config_error",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpuu=4 (a typo, no +)",
            ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpuu=4",),
        ),
        Cause("config_error", "data.max_prompt_len=64 (a typo, no +)", ("data.max_prompt_len=64",)),
    ],
    "unknownkey": [
        Cause(
            "config_error",
            "+actor_rollout_ref.rollout.gpu_memory_util=0.5",
            ("+actor_rollout_ref.rollout.gpu_memory_util=0.5",),
        ),
    ],
    "toomanygpus": [
        Cause(
            "unschedulable",
            "trainer.n_gpus_per_node=8 (the node has 2 devices); stopped after 150 s",
            ("trainer.n_gpus_per_node=8",),
            deadline_s=150,
        ),
    ],
    "ckptmodule": [
        Cause(
            "import_error",
            f"{_ENGINE}.custom_backend_module=jobs.verl_cpu.no_such_module",
            (f"{_ENGINE}.custom_backend_module=jobs.verl_cpu.no_such_module",),
        ),
    ],
    "rolloutname": [
        Cause(
            "import_error",
            "actor_rollout_ref.rollout.name=sglang (not installed)",
            ("actor_rollout_ref.rollout.name=sglang",),
        ),
    ],
    "bf16": [
        Cause(
            "actor_died",
            "actor_rollout_ref.rollout.dtype=bfloat16 (vLLM's CPU kernels on this CPU)",
            ("actor_rollout_ref.rollout.dtype=bfloat16",),
        ),
    ],
    "nanloss": [
        Cause(
            "nan",
            "actor_rollout_ref.actor.use_kl_loss=True actor_rollout_ref.actor.kl_loss_coef=nan",
            (
                "actor_rollout_ref.actor.use_kl_loss=True",
                "actor_rollout_ref.actor.kl_loss_coef=nan",
            ),
            env={"STEPS": "3"},
        ),
    ],
    "ckptdisk": [
        Cause(
            "unknown",
            "trainer.default_local_dir on a 1 MiB tmpfs (the checkpoint disk full)",
            full_disk=True,
            env={"STEPS": "3"},
        ),
    ],
    "resumepath": [
        Cause(
            "missing_path",
            "trainer.resume_mode=resume_path trainer.resume_from_path=$T/no-such/global_step_3",
            (
                "trainer.resume_mode=resume_path",
                "trainer.resume_from_path=$T/no-such/global_step_3",
            ),
        ),
    ],
    "killrollouter": [
        Cause(
            "actor_died",
            "the FullyAsyncRollouter's process SIGKILLed after the first step line",
            kill="FullyAsyncRollouter",
            env={"STEPS": "20"},
        ),
    ],
    "killengine": [
        Cause(
            "actor_died",
            "the vLLMHttpServer's process SIGKILLed after the first step line",
            kill="vLLMHttpServer",
            env={"STEPS": "20"},
        ),
    ],
    "killtrainer": [
        Cause(
            "actor_died",
            "the FullyAsyncTrainer's process SIGKILLed after the first step line",
            kill="FullyAsyncTrainer",
            env={"STEPS": "20"},
        ),
    ],
}

# Causes an earlier round made logs of already: their new logs are numbered on from these.
FIRST = {"killengine": 2, "killtrainer": 2, "unknownkey": 2}

SCORE = (
    "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n"
)


def _expand(text: str, where: dict[str, str]) -> str:
    for name, value in where.items():
        text = text.replace(f"${name}", value)
    return text


def _own(pid: int, roots: set[int]) -> bool:
    """Whether ``pid`` descends from one of ``roots`` (this head's node processes)."""
    while pid > 1:
        if pid in roots:
            return True
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return False


def _actor_pids(actor: str, roots: set[int]) -> list[int]:
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    found = []
    for row in out.splitlines():
        pid, _, args = row.strip().partition(" ")
        if re.match(rf"ray::{actor}\b", args.strip()) and _own(int(pid), roots):
            found.append(int(pid))
    return found


def normalise(log: str, where: dict[str, str]) -> str:
    """The log with this host's paths in neutral names (the venv's, the checkout's, the run's)."""
    for path, name in sorted(where.items(), key=lambda kv: -len(kv[0])):
        log = log.replace(path, name)
    return log


def one(cause: str, n: int, spec: Cause, head: dict[str, str]) -> str:
    """Run ``spec`` once on the head (under the lock, held by the caller) and return its log."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    scratch = Path(tempfile.mkdtemp(prefix=f"wl-{cause}-"))
    scratch.chmod(0o755)
    ck = scratch / "ckpt"
    ck.mkdir()
    if spec.full_disk:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(ck)], check=True)
    (scratch / "score.py").write_text(SCORE)
    where = {"A": head["assets"], "CK": str(ck), "T": str(scratch)}
    sid = f"wl-{cause}-{n}-{int(time.time())}"
    env = os.environ | {
        "ADDRESS": head["address"],
        "TOKEN_PATH": head["token_path"],
        "ASSETS": head["assets"],
        "CKPT": str(ck),
        "SID": sid,
        "STEPS": "2",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        **spec.env,
    }
    args = [_expand(o, where) for o in spec.overrides]
    token = Path(head["token_path"]).read_text().strip()
    client = JobSubmissionClient(head["address"], headers={"Authorization": f"Bearer {token}"})
    client.list_jobs()  # the head answers this client before any job is submitted
    roots = {int(p) for p in head["pids"].split(",")}
    done = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED)
    submit = subprocess.Popen(
        ["bash", str(SCRIPT), *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    started, killed, status = time.monotonic(), False, None
    try:
        while time.monotonic() - started < spec.deadline_s:
            time.sleep(3)
            try:
                status = client.get_job_status(sid)
            except RuntimeError:  # not submitted yet
                continue
            if status in done:
                break
            if spec.kill and not killed and spec.after in client.get_job_logs(sid):
                pids = _actor_pids(spec.kill, roots)
                for pid in pids:
                    os.kill(pid, signal.SIGKILL)
                killed = bool(pids)
                print(f"  killed {spec.kill}: {pids}", flush=True)
    finally:
        # Whatever happened here, the run ends before the lock is let go.
        if status not in done:
            with contextlib.suppress(RuntimeError):
                client.stop_job(sid)
            for _ in range(60):
                time.sleep(2)
                try:
                    if client.get_job_status(sid) in done:
                        break
                except RuntimeError:
                    break
        submit.kill()
        if spec.full_disk:
            subprocess.run(["umount", "-l", str(ck)], check=False)
    time.sleep(2)
    log = client.get_job_logs(sid)
    status = client.get_job_status(sid)
    print(
        f"  {sid}: {status} after {time.monotonic() - started:.0f} s, {len(log)} chars", flush=True
    )
    return normalise(
        log,
        {
            str(scratch): "/tmp/run",
            head["assets"]: "/tmp/assets",
            str(Path(sys.prefix)): "/venv",
            str(Path(__file__).resolve().parent.parent): "/src",
        },
    )


def record(cause: str, n: int, spec: Cause, log: str) -> None:
    name = f"{cause}-{n}.log.gz"
    (WHOLE / name).write_bytes(gzip.compress(log.encode(), mtime=0))
    manifest = json.loads(MANIFEST.read_text())
    manifest["logs"] = [e for e in manifest["logs"] if e["file"] != name]
    manifest["logs"].append(
        {
            "file": name,
            "cause": cause,
            "class": spec.cls,
            "side": side_of_cause(cause),
            "made": spec.made,
            "why": "",
        }
    )
    manifest["logs"].sort(key=lambda e: e["file"])
    MANIFEST.write_text(json.dumps(manifest, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=48379)
    parser.add_argument("--one", nargs=2, metavar=("CAUSE", "N"), help=argparse.SUPPRESS)
    parser.add_argument("--head", help=argparse.SUPPRESS)
    parser.add_argument("causes", nargs="*")
    args = parser.parse_args()
    if args.one:  # a run, under the lock its parent took
        cause, n = args.one[0], int(args.one[1])
        spec = CAUSES[cause][n - FIRST.get(cause, 1)]
        record(cause, n, spec, one(cause, n, spec, json.loads(args.head)))
        return
    from service.cluster.local_ray import LocalRayCluster

    base = Path(tempfile.mkdtemp(prefix="wl-"))
    base.chmod(0o755)
    subprocess.run([sys.executable, "-m", "jobs.verl_cpu.assets", str(base / "sa")], check=True)
    cluster = LocalRayCluster([2], cpus_per_node=64, base_dir=base / "r", port=args.port,
                              dashboard_port=args.port + 20).start()  # fmt: skip
    head = {
        "address": cluster.address,
        "token_path": str(cluster.token_path),
        "assets": str(base / "sa"),
        "pids": ",".join(str(p.pid) for p in cluster._procs),
    }
    try:
        for asked in args.causes or list(CAUSES):
            cause, _, only = asked.partition(":")  # ``cause:n``: its n-th log alone
            for i, spec in enumerate(CAUSES[cause]):
                n = FIRST.get(cause, 1) + i
                if (only and n != int(only)) or (WHOLE / f"{cause}-{n}.log.gz").exists():
                    continue
                print(f"{cause}-{n}: {spec.made}", flush=True)
                subprocess.run(
                    ["flock", LOCK, sys.executable, "-m", "tests.verl_whole_logs",
                     "--one", cause, str(n), "--head", json.dumps(head)],
                    check=False,
                )  # fmt: skip
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
