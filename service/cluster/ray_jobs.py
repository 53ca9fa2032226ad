"""The one client of Ray: the Jobs REST API of the head's dashboard, with timeouts (and the
log tail stream, in ``log_tail``).

Every call is synchronous and bounded by a timeout; callers run it off the event loop.
"""

from __future__ import annotations

import hashlib
import io
import logging
import time
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from service.cluster.log_tail import LogTail

log = logging.getLogger(__name__)


class RayUnavailable(Exception):
    """Ray did not answer, or answered with a server error: try again later."""


class RayRejected(Exception):
    """Ray refused the request outright (4xx): retrying the same request will not help."""


@dataclass(frozen=True)
class JobInfo:
    submission_id: str
    status: str
    message: str | None
    error_type: str | None
    driver_exit_code: int | None
    start_time_ms: int | None
    end_time_ms: int | None
    # Ray's own id of the job (hex), once its driver has started: what the state API names.
    job_id: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobInfo:
        return cls(
            submission_id=data["submission_id"],
            status=data["status"],
            message=data.get("message"),
            error_type=data.get("error_type"),
            driver_exit_code=data.get("driver_exit_code"),
            start_time_ms=data.get("start_time"),
            end_time_ms=data.get("end_time"),
            job_id=data.get("job_id"),
        )


@dataclass
class _Package:
    name: str
    payload: bytes
    checked_at: float = float("-inf")


class RayJobs:
    """A client for one Ray cluster's dashboard (``http://host:8265``)."""

    ALREADY_EXISTS = "already exists"
    # A package found on the head is trusted this long. A restarted head has lost its packages,
    # and a restart takes longer than this, so no submission can follow one unchecked.
    PACKAGE_CHECK_S = 1.0

    def __init__(self, address: str, token: str | None = None, timeout_s: float = 10.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.address = address
        self._token = token
        self._http = httpx.Client(base_url=address, headers=headers, timeout=timeout_s)
        self._packages: dict[Path, _Package] = {}

    @property
    def token(self) -> str | None:
        return self._token

    def close(self) -> None:
        self._http.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            resp = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise RayUnavailable(f"Ray at {self.address} did not answer: {exc!r}") from exc
        return resp

    @staticmethod
    def _text(resp: httpx.Response) -> str:
        return resp.text.strip()[:2000]

    def _check(self, resp: httpx.Response) -> httpx.Response:
        if resp.status_code >= 500:
            raise RayUnavailable(f"Ray answered {resp.status_code}: {self._text(resp)}")
        if resp.status_code >= 400:
            raise RayRejected(f"Ray refused ({resp.status_code}): {self._text(resp)}")
        return resp

    def version(self) -> dict[str, Any]:
        data: dict[str, Any] = self._check(self._request("GET", "/api/version")).json()
        return data

    def submit(
        self,
        submission_id: str,
        entrypoint: str,
        runtime_env: dict[str, Any],
        metadata: dict[str, str],
        entrypoint_num_cpus: float = 0.0,
        entrypoint_resources: dict[str, float] | None = None,
    ) -> bool:
        """Submit a job. Returns False when Ray already has ``submission_id`` (a retry)."""
        body: dict[str, Any] = {
            "entrypoint": entrypoint,
            "submission_id": submission_id,
            "runtime_env": runtime_env,
            "metadata": metadata,
        }
        optional = {
            "entrypoint_num_cpus": entrypoint_num_cpus,
            "entrypoint_resources": entrypoint_resources,
        }
        body |= {k: v for k, v in optional.items() if v}
        resp = self._request("POST", "/api/jobs/", json=body)
        # Ray answers a duplicate submission_id with a 500 and this text, not a 409.
        if resp.status_code >= 400 and self.ALREADY_EXISTS in resp.text:
            return False
        self._check(resp)
        return True

    def _known(self, method: str, path: str) -> Any | None:
        """The JSON answer about a job, or None when Ray does not know the job (404)."""
        resp = self._request(method, path)
        return None if resp.status_code == 404 else self._check(resp).json()

    def get(self, submission_id: str) -> JobInfo | None:
        """The job, or None when Ray does not know it (404)."""
        data = self._known("GET", f"/api/jobs/{submission_id}")
        return None if data is None else JobInfo.from_json(data)

    def list_jobs(self) -> list[JobInfo]:
        data = self._check(self._request("GET", "/api/jobs/")).json()
        return [JobInfo.from_json(j) for j in data if j.get("type") == "SUBMISSION"]

    def all_jobs(self) -> list[dict[str, Any]]:
        """Every job Ray knows, as it lists them (``SUBMISSION`` and ``DRIVER``)."""
        data: list[dict[str, Any]] = self._check(self._request("GET", "/api/jobs/")).json()
        return data

    # The most rows one call of Ray's state API answers (its own upper bound).
    STATE_LIMIT = 10_000

    def state(self, kind: str, state: str, **equal: str) -> list[dict[str, Any]]:
        """Ray's state API, detailed: ``kind`` ("actors", "placement_groups", "nodes") in one
        ``state`` ("ALIVE", "CREATED"), and with each column of ``equal`` at its value."""
        filters = {"state": state} | equal
        params: list[tuple[str, str]] = [("detail", "true"), ("limit", str(self.STATE_LIMIT))]
        for key, value in filters.items():
            params += [("filter_keys", key), ("filter_predicates", "="), ("filter_values", value)]
        body = self._check(self._request("GET", f"/api/v0/{kind}", params=params)).json()
        rows: list[dict[str, Any]] = body["data"]["result"]["result"]
        return rows

    def stop(self, submission_id: str) -> bool:
        data = self._known("POST", f"/api/jobs/{submission_id}/stop")
        return bool(data and data.get("stopped", False))

    def logs(self, submission_id: str) -> str | None:
        data = self._known("GET", f"/api/jobs/{submission_id}/logs")
        return None if data is None else str(data.get("logs", ""))

    def tail(self, submission_id: str, offset: int) -> LogTail:
        """Follow the job's log from character ``offset`` on (see ``LogTail``)."""
        return LogTail(self.address, submission_id, offset, self._token)

    def cluster_status(self) -> dict[str, Any]:
        data: dict[str, Any] = self._check(
            self._request("GET", "/api/cluster_status", params={"format": 0})
        ).json()
        return data

    def package_uri(self, module_dir: Path) -> str:
        """Upload ``module_dir`` as a py_modules package if the head lacks it; its ``gcs://`` URI.

        The head's packages live in its GCS and go with it when it restarts, so their presence
        is checked again (one cheap GET) before submissions more than ``PACKAGE_CHECK_S`` apart.
        """
        module_dir = module_dir.resolve()
        package = self._packages.get(module_dir)
        if package is None:
            package = self._packages[module_dir] = _Package(*_named(zip_module(module_dir)))
        now = time.monotonic()
        if now - package.checked_at > self.PACKAGE_CHECK_S:
            self._ensure(package.name, package.payload)
            package.checked_at = now
        return f"gcs://{package.name}"

    def upload(self, payload: bytes) -> str:
        """Put a zip in the cluster's package store (once per content); its ``gcs://`` URI."""
        name, payload = _named(payload)
        self._ensure(name, payload)
        return f"gcs://{name}"

    def _ensure(self, name: str, payload: bytes) -> None:
        """The package is on the head: one cheap GET, and a PUT only when it is missing."""
        path = f"/api/packages/gcs/{name}"
        if self._request("GET", path).status_code != 200:
            self._check(self._request("PUT", path, content=payload))


def _named(payload: bytes) -> tuple[str, bytes]:
    """A package's content-addressed name, with its bytes."""
    return f"_ray_pkg_{hashlib.sha256(payload).hexdigest()[:32]}.zip", payload


def stop_job(ray: RayJobs, run_id: str, why: str) -> bool:
    """Stop a run's job on Ray: the one place the loops do it (a stop request being delivered,
    or a run cancelled while its submission was in flight)."""
    log.debug("stopping run %s on Ray: %s", run_id, why)
    return ray.stop(run_id)


def zip_module(module_dir: Path) -> bytes:
    """A deterministic zip of a Python package with its directory as the top-level entry."""
    return _zip(
        (str(Path(module_dir.name) / path.relative_to(module_dir)), path.read_bytes())
        for path in sorted(module_dir.rglob("*"))
        if "__pycache__" not in path.parts and path.suffix != ".pyc" and path.is_file()
    )


def zip_files(files: dict[str, str], under: str) -> bytes:
    """A deterministic zip of a run's files in its directory ``under`` (a ``working_dir``
    package whose top holds nothing else)."""
    return _zip((f"{under}/{name}", text.encode()) for name, text in sorted(files.items()))


def _zip(entries: Iterable[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for arcname, data in entries:
            info = zipfile.ZipInfo(arcname, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, data)
    return buf.getvalue()
