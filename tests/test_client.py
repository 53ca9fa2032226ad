"""The Python client alone, against a fake transport: requests it sends, answers it raises."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from service.client import ApiError, Client, Unreachable, parse_sse

Handler = Callable[[httpx.Request], httpx.Response]


def client_with(handler: Handler, **kwargs: Any) -> Client:
    return Client(url="http://svc", transport=httpx.MockTransport(handler), **kwargs)


def test_url_and_token_come_from_the_environment_and_the_token_is_sent_as_bearer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RLRUN_URL", "http://from-env:9000/")
    monkeypatch.setenv("RLRUN_TOKEN", "s3cret")
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"status": "ok"})

    with Client(transport=httpx.MockTransport(handler)) as client:
        assert client.healthz() == {"status": "ok"}
    assert str(seen[0].url) == "http://from-env:9000/healthz"
    assert seen[0].headers["authorization"] == "Bearer s3cret"


def test_no_token_no_authorization_header(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RLRUN_TOKEN", raising=False)
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"status": "ok"})

    client_with(handler).healthz()
    assert "authorization" not in seen[0].headers


def test_a_problem_is_raised_with_its_detail_and_each_field_error() -> None:
    problem = {
        "type": "urn:rlrun:problem:invalid-run-spec",
        "title": "Invalid run spec",
        "status": 422,
        "detail": "1 invalid field(s), first: n",
        "errors": [{"loc": ["n"], "field": "n", "msg": "too small", "type": "greater_than"}],
    }

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.params["dry_run"] == "true"
        return httpx.Response(
            422, content=json.dumps(problem), headers={"content-type": "application/problem+json"}
        )

    with pytest.raises(ApiError) as caught:
        client_with(handler).dry_run({"recipe": "tiny-grpo", "n": 1})
    err = caught.value
    assert (err.status, err.title, err.detail) == (422, "Invalid run spec", problem["detail"])
    assert [(e.field, e.msg) for e in err.errors] == [("n", "too small")]


def test_an_error_without_a_problem_body_still_raises_with_its_text() -> None:
    client = client_with(lambda r: httpx.Response(502, text="bad gateway"))
    with pytest.raises(ApiError) as caught:
        client.get_run("r1")
    assert caught.value.status == 502 and caught.value.detail == "bad gateway"


def test_an_unreachable_service_is_its_own_error() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    with pytest.raises(Unreachable):
        client_with(handler).cluster()


def test_list_runs_sends_filters_and_iter_runs_walks_the_cursor() -> None:
    def summary(run_id: str) -> dict[str, Any]:
        return {
            "id": run_id,
            "name": "n",
            "recipe": "tiny-grpo",
            "team": "t",
            "priority": "normal",
            "status": "QUEUED",
            "health": {"status": "ok", "reason": None},
            "created_at": "2026-01-01T00:00:00Z",
            "submitted_at": None,
            "started_at": None,
            "ended_at": None,
            "links": {},
        }

    seen: list[httpx.QueryParams] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.params)
        if "cursor" not in request.url.params:
            return httpx.Response(200, json={"items": [summary("r2")], "next_cursor": "r2"})
        return httpx.Response(200, json={"items": [summary("r1")], "next_cursor": None})

    runs = list(client_with(handler).iter_runs(["QUEUED", "RUNNING"], "t", page_size=1))
    assert [r.id for r in runs] == ["r2", "r1"]
    assert seen[0].get_list("status") == ["QUEUED", "RUNNING"] and seen[0]["team"] == "t"
    assert seen[1]["cursor"] == "r2"


def test_logs_read_on_from_the_offset_until_complete() -> None:
    answers = iter(
        [
            ("one\n", "4", "false"),
            ("", "4", "false"),
            ("two\n", "8", "true"),
        ]
    )
    offsets: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        offsets.append(request.url.params.get("offset"))
        text, offset, complete = next(answers)
        return httpx.Response(
            200, text=text, headers={"Log-Offset": offset, "Log-Complete": complete}
        )

    chunks = list(client_with(handler).follow_logs("r1", poll_s=0))
    assert chunks == ["one\n", "two\n"]
    assert offsets == [None, "4", "4"]


def test_events_resume_with_last_event_id_after_a_dropped_connection() -> None:
    streams = [
        b'event: status\nid: 1-0\ndata: {"to_status": "RUNNING"}\n\n: keep-alive\n\n',
        b'event: metrics\nid: 1-40\ndata: {"step": 1}\n\nevent: end\nid: 1-40\ndata: {}\n\n',
    ]
    seen: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("last-event-id"))
        body = streams[len(seen) - 1]
        if len(seen) == 1:
            # The first connection drops after one event.
            def broken() -> Any:
                yield body
                raise httpx.ReadError("connection reset")

            return httpx.Response(200, stream=IterStream(broken()))
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    events = list(client_with(handler).events("r1", retry_s=0))
    assert [(e.kind, e.id) for e in events] == [
        ("status", "1-0"),
        ("metrics", "1-40"),
        ("end", "1-40"),
    ]
    assert seen == [None, "1-0"]


class IterStream(httpx.SyncByteStream):
    def __init__(self, chunks: Any) -> None:
        self.chunks = chunks

    def __iter__(self) -> Any:
        yield from self.chunks


def test_parse_sse_joins_multi_line_data_and_skips_comments() -> None:
    lines = [": hello", "event: metrics", 'data: {"a":', "data: 1}", "id: 5-9", ""]
    [event] = parse_sse(lines)
    assert (event.kind, event.data, event.id) == ("metrics", {"a": 1}, "5-9")
