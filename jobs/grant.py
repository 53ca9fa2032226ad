"""The job's side of a secrets grant: redeemed once when a launcher starts, its values go into
this process's environment and, through Ray's internal key-value store while the job runs, into
every worker the job starts.

A run that names secrets is submitted with ``RLRUN_GRANT`` (a one-time token) and
``RLRUN_GRANT_URL`` (the service as the cluster reaches it) in its env, and Ray's
``worker_process_setup_hook`` set to ``setup_worker``. The values never travel in a runtime env:

- ``redeem`` (the driver): one ``POST <url>/grants/redeem`` with the grant as bearer (stdlib
  urllib, no proxy, no redirect, bounded timeouts); the values go into ``os.environ``.
- ``share`` (the driver, once connected to Ray): the values go into Ray's internal key-value
  store under the grant's hash, for as long as the job runs: a detached keeper actor deletes
  them when the job's supervisor ends (so after ``exec`` too).
- ``setup_worker`` (each worker of the job, before its first task): reads them from there.

Never imports ``service``; ``ray`` only where it is used.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import MutableMapping
from typing import Any

GRANT_ENV = "RLRUN_GRANT"
GRANT_URL_ENV = "RLRUN_GRANT_URL"
REDEEM_PATH = "/grants/redeem"
WORKER_HOOK = "jobs.grant.setup_worker"
HOLDER_NAMESPACE = "rlrun-grants"
# Set in the keeper's own worker, which needs nothing of the job's.
HOLDER_MARK = "RLRUN_GRANT_HOLDER"
MAX_ANSWER_BYTES = 1 << 20


class GrantRefused(RuntimeError):
    """The grant could not be redeemed (the message names no value)."""


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # the grant goes to the URL it was given, nowhere else


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())


def holder_name(grant: str) -> str:
    return "rlrun-grant-" + hashlib.sha256(grant.encode()).hexdigest()[:32]


def redeem(
    environ: MutableMapping[str, str] | None = None, timeout_s: float = 10.0, attempts: int = 3
) -> tuple[dict[str, str], str | None]:
    """The run's secret values (env var -> value) and its Ray submission id, put into
    ``environ``; nothing without a grant. Retried only while the service cannot be reached."""
    env = os.environ if environ is None else environ
    grant, base = env.get(GRANT_ENV), env.pop(GRANT_URL_ENV, "")
    if not grant:
        return {}, None
    url = base.rstrip("/") + REDEEM_PATH
    if not url.startswith(("http://", "https://")):
        raise GrantRefused(f"{GRANT_URL_ENV} is not an http(s) URL")
    request = urllib.request.Request(  # noqa: S310 - the scheme is checked above
        url,
        data=b"",
        method="POST",
        headers={"Authorization": f"Bearer {grant}", "Accept": "application/json"},
    )
    for attempt in range(attempts):
        try:
            with _OPENER.open(request, timeout=timeout_s) as resp:
                answer = json.loads(resp.read(MAX_ANSWER_BYTES))
            break
        except urllib.error.HTTPError as exc:
            raise GrantRefused(f"the service refused the secrets grant (HTTP {exc.code})") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            if attempt == attempts - 1:
                raise GrantRefused(
                    f"the secrets grant could not be redeemed at {url}: {exc}"
                ) from None
            time.sleep(1.0 + attempt)
    values = answer.get("env") if isinstance(answer, dict) else None
    if not isinstance(values, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in values.items()
    ):
        raise GrantRefused("the service's answer to the secrets grant is not {env: {name: value}}")
    env.update(values)
    submission = answer.get("submission_id")
    return values, submission if isinstance(submission, str) else None


def share(values: dict[str, str], submission_id: str | None, environ: Any = None) -> None:
    """Hand ``values`` to the workers the job starts from now on (the driver, connected to
    Ray): kept under the grant's hash in Ray's internal key-value store, and deleted by a
    detached keeper actor when the job's supervisor ends (after ``exec`` too)."""
    env = os.environ if environ is None else environ
    grant = env.get(GRANT_ENV)
    if not values or not grant or not submission_id:
        return
    import ray
    from ray.experimental.internal_kv import _internal_kv_put

    key = holder_name(grant)
    keeper: Any = (
        ray.remote(_Keeper)
        .options(
            name=key,
            namespace=HOLDER_NAMESPACE,
            lifetime="detached",
            num_cpus=0,
            max_restarts=0,
            runtime_env={"env_vars": {HOLDER_MARK: "1"}},
        )
        .remote(key, submission_id)
    )
    ray.get(keeper.ready.remote(), timeout=120)  # running before there is anything to delete
    _internal_kv_put(key, json.dumps(values).encode(), overwrite=True, namespace=HOLDER_NAMESPACE)


def setup_worker() -> None:
    """Ray's ``worker_process_setup_hook``: this worker's environment gets the run's values.
    (A hook cannot submit tasks, since the worker runs none yet; a store read it can do.)"""
    grant = os.environ.get(GRANT_ENV)
    if not grant or os.environ.get(HOLDER_MARK):
        return
    from ray.experimental.internal_kv import _internal_kv_get

    raw = _internal_kv_get(holder_name(grant), namespace=HOLDER_NAMESPACE)
    if raw:
        os.environ.update(json.loads(raw))


class _Keeper:
    """Deletes a job's values from the store when the job's supervisor ends, then exits."""

    def __init__(self, key: str, submission_id: str) -> None:
        threading.Thread(target=self._end_with, args=(key, submission_id), daemon=True).start()

    def ready(self) -> bool:
        return True

    @staticmethod
    def _end_with(key: str, submission_id: str, every_s: float = 2.0) -> None:
        import ray
        from ray.dashboard.modules.job.common import (
            JOB_ACTOR_NAME_TEMPLATE,
            SUPERVISOR_ACTOR_RAY_NAMESPACE,
        )
        from ray.experimental.internal_kv import _internal_kv_del

        name = JOB_ACTOR_NAME_TEMPLATE.format(job_id=submission_id)
        while True:
            time.sleep(every_s)
            try:
                ray.get_actor(name, namespace=SUPERVISOR_ACTOR_RAY_NAMESPACE)
            except ValueError:
                break
        _internal_kv_del(key, namespace=HOLDER_NAMESPACE)
        os._exit(0)  # the job is over: so are its values
