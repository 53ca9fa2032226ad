"""``GET /runs/{id}/script``: a bash script that submits a stored run's job by hand.

Built from the run's stored launch (any recipe): the same argv, runtime env, entrypoint
resources and submission id (the run id) that the service sends to Ray. The service also ships
the ``jobs`` package with every job (runtime env ``py_modules``); the script adds the directory
of the ``jobs`` package installed where it runs, found with Python, not a fixed path. A run's own
files are written to ``run-files/`` of a fresh temporary directory that ``ray job submit``
uploads as the working directory, as the service ships them.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse

from jobs import samples as job_samples
from service.api.auth import Viewer, visible_run
from service.api.deps import ServicesDep
from service.loops.submitter import CLUSTER_EVENTS_OFF
from service.recipes.base import RUN_FILES_DIR
from service.team_secrets import MASK, masked_runtime_env

router = APIRouter(prefix="/runs", tags=["runs"])

ADD_JOBS_MODULE = (
    "import json, os, sys, tempfile, jobs; env = json.loads(sys.argv[1]); "
    "env.setdefault('py_modules', []).append(os.path.dirname(jobs.__file__)); "
    "files = json.loads(sys.argv[2]); d = tempfile.mkdtemp(prefix='rlrun-files-'); "
    f"os.mkdir(os.path.join(d, {RUN_FILES_DIR!r})); "
    f"[open(os.path.join(d, {RUN_FILES_DIR!r}, n), 'w', encoding='utf-8').write(t) "
    "for n, t in files.items()]; "
    "env.update({'working_dir': d} if files else {}); "
    "env.setdefault('env_vars', {}).update({n: os.environ[n] for n in sys.argv[3:]}); "
    "print(json.dumps(env))"
)


@router.get(
    "/{run_id}/script",
    response_class=PlainTextResponse,
    responses={200: {"content": {"text/x-shellscript": {}}}},
)
def run_script(services: ServicesDep, principal: Viewer, run_id: str) -> PlainTextResponse:
    """A bash script that submits this run's job with ``ray job submit``; secrets and values
    that look like keys are read from the operator's environment, never written in it."""
    with services.db.read() as session:
        run = visible_run(session, principal, run_id)
        script = render_script(run.id, run.name, run.launch, run.cluster)
    return PlainTextResponse(script, media_type="text/x-shellscript")


def render_script(
    run_id: str,
    name: str,
    launch: dict[str, Any],
    cluster: str | None = None,
) -> str:
    """The script; ``cluster``: the one the run was admitted on, named for the operator (its
    address is theirs to give: hosts are for admins to see)."""
    q = shlex.quote
    runtime_env = masked_runtime_env(launch["runtime_env"])
    # As the submitter sends it: the same env vars, Ray's scheduler events off included.
    runtime_env["env_vars"] = {**runtime_env.get("env_vars", {}), **CLUSTER_EVENTS_OFF}
    masked = [k for k, v in runtime_env.get("env_vars", {}).items() if v == MASK]
    from_env = sorted({*masked, *launch.get("secrets", {})})
    for var in from_env:
        runtime_env.get("env_vars", {}).pop(var, None)
    job_samples.hook(runtime_env)  # as the submitter sets it
    submit = [
        "ray job submit",
        '--address "$RAY_ADDRESS"',
        f"--submission-id {q(run_id)}",
        '--runtime-env-json "$RUNTIME_ENV_JSON"',
        f"--metadata-json {q(json.dumps({'rlrun_run_id': run_id}))}",
    ]
    if launch.get("entrypoint_num_cpus"):
        submit.append(f"--entrypoint-num-cpus {q(str(launch['entrypoint_num_cpus']))}")
    if launch.get("entrypoint_resources"):
        submit.append(f"--entrypoint-resources {q(json.dumps(launch['entrypoint_resources']))}")
    submit.append("--")
    submit.extend(q(arg) for arg in launch["argv"])
    lines = [
        "#!/usr/bin/env bash",
        f"# Submits run {run_id} ({json.dumps(name)}) by hand, as the service would.",
        "# Needs: the `ray` CLI and the `jobs` package (pip install rlrun) where this runs.",
        "# Ray's submission id is the run id: the job can be submitted once.",
        "set -euo pipefail",
        *(
            [f"# Its cluster: {cluster} (RAY_ADDRESS: that cluster's dashboard)."]
            if cluster
            else []
        ),
        'RAY_ADDRESS="${RAY_ADDRESS:-http://127.0.0.1:8265}"',
        *(f': "${{{n}:?set {n} in the environment (a secret)}}"' for n in from_env),
        f"RUNTIME_ENV={q(json.dumps(runtime_env, sort_keys=True))}",
        f"FILES={q(json.dumps(launch.get('files') or {}, sort_keys=True))}",
        "# The service ships the jobs package as py_modules (add the installed one here), the",
        "# run's files as its working directory (written to a temporary directory here), and",
        "# the secrets from this environment.",
        f'RUNTIME_ENV_JSON="$(python3 -c {q(ADD_JOBS_MODULE)} "$RUNTIME_ENV" "$FILES"'
        + "".join(f" {n}" for n in from_env)
        + ')"',
        " \\\n    ".join(submit),
        "",
    ]
    return "\n".join(lines)
