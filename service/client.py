"""Python client of the rlrun API (httpx): one typed method per call.

``Client()`` reads the service URL from ``RLRUN_URL`` and a bearer token from ``RLRUN_TOKEN``
unless they are given. A problem+json answer is raised as ``ApiError`` (its ``detail`` and
``errors`` with each bad field); a service that cannot be reached as ``Unreachable``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel

from service.backoff import Backoff
from service.store.status import TERMINAL as TERMINAL
from service.wire.cluster import RecipeOut
from service.wire.metrics import LatestOut, SamplesPage, SeriesOut, StepTimeOut
from service.wire.runs import BaselineOut, RunOut, RunPage, RunSummary

# Where the client looks for the service, and where ``rlrun serve`` listens by default.
URL_ENV, TOKEN_ENV = "RLRUN_URL", "RLRUN_TOKEN"
DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 8000
DEFAULT_URL = f"http://{DEFAULT_HOST}:{DEFAULT_PORT}"
Model = TypeVar("Model", bound=BaseModel)


def given(**params: Any) -> dict[str, Any]:
    """The query parameters that are set: None is not sent."""
    return {name: value for name, value in params.items() if value is not None}


class ClientError(Exception):
    """Base of what the client raises."""


class Unreachable(ClientError):
    """The service did not answer (connection refused, timeout, ...)."""


@dataclass(frozen=True)
class FieldError:
    field: str
    msg: str
    type: str = ""


class ApiError(ClientError):
    """An error answer: RFC 9457 problem fields, and ``errors`` naming each bad field."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        self.status = status
        self.body = body
        self.title = str(body.get("title") or "Error")
        self.detail = str(body.get("detail") or "")
        self.errors = [
            FieldError(str(e.get("field", "")), str(e.get("msg", "")), str(e.get("type", "")))
            for e in body.get("errors") or []
            if isinstance(e, dict)
        ]
        super().__init__(f"{status} {self.title}: {self.detail}")

    @classmethod
    def from_response(cls, resp: httpx.Response) -> ApiError:
        try:
            body = resp.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            body = {"title": resp.reason_phrase, "detail": resp.text[:2000]}
        return cls(resp.status_code, body)


@dataclass(frozen=True)
class Event:
    """One Server-Sent Event of ``/runs/{id}/events``: ``status``, ``metrics`` or ``end``."""

    kind: str
    data: Any
    id: str | None = None


def parse_sse(lines: Iterable[str]) -> Iterator[Event]:
    """Server-Sent Events from text lines (JSON data); comments (keep-alives) are skipped."""
    kind, data, event_id = "message", list[str](), None
    for line in lines:
        if line.startswith("event:"):
            kind = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
        elif line.startswith("id:"):
            event_id = line[3:].strip()
        elif not line and (data or kind != "message"):
            yield Event(kind, json.loads("\n".join(data)) if data else None, event_id)
            kind, data, event_id = "message", [], None


@dataclass
class LogChunk:
    """Part of a job log: ``text``, the ``offset`` to read on from, ``complete`` at its end."""

    text: str
    offset: int
    complete: bool


@dataclass
class Client:
    """``with Client() as c: c.get_run(run_id)``."""

    url: str | None = None
    token: str | None = None
    timeout: float = 30.0
    transport: httpx.BaseTransport | None = None
    _http: httpx.Client = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.url = (self.url or os.environ.get(URL_ENV) or DEFAULT_URL).rstrip("/")
        self.token = self.token or os.environ.get(TOKEN_ENV) or None
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        self._http = httpx.Client(
            base_url=self.url, headers=headers, timeout=self.timeout, transport=self.transport
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            resp = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise Unreachable(f"cannot reach {self.url}: {exc}") from exc
        if resp.status_code >= 400:
            raise ApiError.from_response(resp)
        return resp

    def _read(self, model: type[Model], method: str, path: str, **kwargs: Any) -> Model:
        """The service's answer to a request, read as ``model``."""
        return model.model_validate(self._request(method, path, **kwargs).json())

    # Runs

    def create_run(self, spec: dict[str, Any], idempotency_key: str | None = None) -> RunOut:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return self._read(RunOut, "POST", "/runs", json=spec, headers=headers)

    def dry_run(self, spec: dict[str, Any]) -> dict[str, Any]:
        """The plan for ``spec``: command, runtime env, placement, queue position (not stored)."""
        resp = self._request("POST", "/runs", json=spec, params={"dry_run": True})
        plan: dict[str, Any] = resp.json()
        return plan

    def list_runs(
        self,
        status: Iterable[str] = (),
        team: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        baseline: bool = False,
    ) -> RunPage:
        params: dict[str, Any] = {"limit": limit, "status": list(status)}
        if baseline:
            params["baseline"] = "true"
        if team:
            params["team"] = team
        if cursor:
            params["cursor"] = cursor
        return self._read(RunPage, "GET", "/runs", params=params)

    def iter_runs(
        self, status: Iterable[str] = (), team: str | None = None, page_size: int = 100
    ) -> Iterator[RunSummary]:
        """Every matching run, newest first, page after page."""
        statuses, cursor = list(status), None
        while True:
            page = self.list_runs(statuses, team, page_size, cursor)
            yield from page.items
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def get_run(self, run_id: str) -> RunOut:
        return self._read(RunOut, "GET", f"/runs/{run_id}")

    def wait(self, run_id: str, timeout_s: float | None = None, every_s: float = 1.0) -> RunOut:
        """The run once its status is terminal, which is final (a failed attempt that may be
        retried reads RETRYING, not FAILED); ``TimeoutError`` after ``timeout_s``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            run = self.get_run(run_id)
            if run.status in TERMINAL:
                return run
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"run {run_id} is still {run.status} after {timeout_s:g} s")
            time.sleep(every_s)

    def cancel_run(
        self, run_id: str, at_checkpoint: bool = False, within_s: float | None = None
    ) -> RunOut:
        """Cancel a queued run or stop an active one; ``at_checkpoint``: right after its next
        complete checkpoint, waiting at most ``within_s`` (None: the service's default)."""
        body: dict[str, Any] | None = None
        if at_checkpoint:
            body = {"at": "next_checkpoint"}
            if within_s is not None:
                body["within_s"] = within_s
        return self._read(RunOut, "POST", f"/runs/{run_id}/cancel", json=body)

    def retry_run(self, run_id: str, resume: str = "checkpoint") -> RunOut:
        """Start the next attempt of an ended run, from its checkpoint or from scratch."""
        return self._read(RunOut, "POST", f"/runs/{run_id}/retry", json={"from": resume})

    def pin_baseline(self, run_id: str) -> BaselineOut:
        """Make the run the baseline of its team and recipe."""
        return self._read(BaselineOut, "PUT", f"/runs/{run_id}/baseline")

    def unpin_baseline(self, run_id: str) -> None:
        self._request("DELETE", f"/runs/{run_id}/baseline")

    def script(self, run_id: str) -> str:
        return self._request("GET", f"/runs/{run_id}/script").text

    # Metrics and logs

    def metrics(
        self,
        run_id: str,
        keys: Iterable[str] = (),
        max_points: int = 1000,
        from_step: int | None = None,
        to_step: int | None = None,
    ) -> SeriesOut:
        params = given(
            max_points=max_points, keys=",".join(keys) or None, from_step=from_step, to_step=to_step
        )
        return self._read(SeriesOut, "GET", f"/runs/{run_id}/metrics", params=params)

    def step_time(self, run_id: str) -> StepTimeOut:
        """Where the run's step time goes, the verdict with its figures, and a change of split."""
        return self._read(StepTimeOut, "GET", f"/runs/{run_id}/step-time")

    def samples(
        self,
        run_id: str,
        step: int | None = None,
        min_score: float | None = None,
        max_score: float | None = None,
        q: str | None = None,
        prompt_id: str | None = None,
        cursor: int | None = None,
        limit: int = 50,
    ) -> SamplesPage:
        """A page of the run's rollout samples, newest first."""
        params = given(
            step=step,
            min_score=min_score,
            max_score=max_score,
            q=q,
            prompt_id=prompt_id,
            cursor=cursor,
            limit=limit,
        )
        return self._read(SamplesPage, "GET", f"/runs/{run_id}/samples", params=params)

    def latest_metrics(self, run_id: str) -> LatestOut:
        """Every key the run logged, with its value at the newest step it was logged."""
        return self._read(LatestOut, "GET", f"/runs/{run_id}/metrics/latest")

    def metric_keys(self, run_id: str) -> list[str]:
        keys: list[str] = self._request("GET", f"/runs/{run_id}/metrics/keys").json()
        return keys

    def logs(
        self,
        run_id: str,
        tail: int | None = None,
        offset: int | None = None,
        ansi: bool = False,
    ) -> LogChunk:
        params = given(ansi=ansi, tail=tail, offset=offset)
        resp = self._request("GET", f"/runs/{run_id}/logs", params=params)
        return LogChunk(
            resp.text,
            int(resp.headers.get("Log-Offset", "0")),
            resp.headers.get("Log-Complete") == "true",
        )

    def follow_logs(
        self, run_id: str, tail: int | None = None, ansi: bool = False, poll_s: float = 1.0
    ) -> Iterator[str]:
        """The log's text as it grows, until the run has ended and its log is read to the end."""
        chunk = self.logs(run_id, tail=tail, ansi=ansi)
        while True:
            if chunk.text:
                yield chunk.text
            if chunk.complete:
                return
            time.sleep(poll_s)
            chunk = self.logs(run_id, offset=chunk.offset, ansi=ansi)

    def events(
        self,
        run_id: str,
        last_event_id: str | None = None,
        retry_s: float = 1.0,
        give_up_s: float = 300.0,
        max_retry_s: float = 10.0,
    ) -> Iterator[Event]:
        """The run's events until ``end`` (which is yielded last). A dropped connection, or the
        service's ``reconnect`` event, is resumed with ``Last-Event-ID``, so no event is lost or
        repeated: after ``retry_s``, doubling while connecting fails (at most ``max_retry_s``);
        after ``give_up_s`` without a connection, ``Unreachable``."""
        backoff = Backoff(retry_s, max(retry_s, max_retry_s))
        failing_since: float | None = None
        failures = 0
        while True:
            headers = {"Accept": "text/event-stream"}
            if last_event_id:
                headers["Last-Event-ID"] = last_event_id
            try:
                with self._http.stream(
                    "GET",
                    f"/runs/{run_id}/events",
                    headers=headers,
                    timeout=httpx.Timeout(self.timeout, read=60),
                ) as resp:
                    if resp.status_code >= 400:
                        resp.read()
                        raise ApiError.from_response(resp)
                    failing_since, failures = None, 0
                    for event in parse_sse(resp.iter_lines()):
                        last_event_id = event.id or last_event_id
                        if event.kind == "reconnect":  # the service asks for a fresh stream
                            break
                        yield event
                        if event.kind == "end":
                            return
            except httpx.TransportError as exc:
                failing_since = failing_since or time.monotonic()
                failures += 1
                if time.monotonic() - failing_since > give_up_s:
                    raise Unreachable(f"lost {self.url}: {exc}") from exc
            time.sleep(backoff.delay(failures))

    # Webhooks

    def create_webhook(self, subscription: dict[str, Any]) -> dict[str, Any]:
        """Subscribe; the answer's ``secret`` is shown this once."""
        body: dict[str, Any] = self._request("POST", "/webhooks", json=subscription).json()
        return body

    def webhooks(self) -> list[dict[str, Any]]:
        body: list[dict[str, Any]] = self._request("GET", "/webhooks").json()
        return body

    def webhook(self, hook_id: str) -> dict[str, Any]:
        body: dict[str, Any] = self._request("GET", f"/webhooks/{hook_id}").json()
        return body

    def update_webhook(self, hook_id: str, changes: dict[str, Any]) -> dict[str, Any]:
        """``PATCH``: the fields given replace the subscription's (``paused: false`` resumes)."""
        body: dict[str, Any] = self._request("PATCH", f"/webhooks/{hook_id}", json=changes).json()
        return body

    def delete_webhook(self, hook_id: str) -> None:
        self._request("DELETE", f"/webhooks/{hook_id}")

    def deliveries(self, hook_id: str, limit: int = 50) -> list[dict[str, Any]]:
        resp = self._request("GET", f"/webhooks/{hook_id}/deliveries", params={"limit": limit})
        body: list[dict[str, Any]] = resp.json()
        return body

    def usage(
        self, start: str | None = None, end: str | None = None, group_by: Sequence[str] = ()
    ) -> dict[str, Any]:
        """Accelerator-hours in the UTC days [start, end), per ``group_by`` (default team):
        the whole report, its pages read one after another."""
        params: dict[str, Any] = {"from": start, "to": end, "group_by": list(group_by) or None}
        params = {k: v for k, v in params.items() if v} | {"limit": 10_000}
        body: dict[str, Any] = self._request("GET", "/usage", params=params).json()
        while body["next_cursor"]:
            more = self._request("GET", "/usage", params=params | {"cursor": body["next_cursor"]})
            page = more.json()
            body = page | {"rows": body["rows"] + page["rows"]}
        return body

    # Cluster and service

    def cluster(self) -> dict[str, Any]:
        body: dict[str, Any] = self._request("GET", "/cluster").json()
        return body

    def recipes(self) -> list[RecipeOut]:
        return [RecipeOut.model_validate(r) for r in self._request("GET", "/recipes").json()]

    def healthz(self) -> dict[str, Any]:
        body: dict[str, Any] = self._request("GET", "/healthz").json()
        return body

    def prometheus(self) -> str:
        """``GET /metrics``: the service's own figures, Prometheus text."""
        return self._request("GET", "/metrics").text

    def readyz(self) -> dict[str, Any]:
        """Readiness; a 503 (not ready) is answered, not raised: ``ready`` says which."""
        try:
            resp = self._http.get("/readyz")
        except httpx.TransportError as exc:
            raise Unreachable(f"cannot reach {self.url}: {exc}") from exc
        if resp.status_code not in (200, 503):
            raise ApiError.from_response(resp)
        body: dict[str, Any] = resp.json()
        return body
