"""Browser and terminal: security headers, the host allow-list, API docs without a CDN, and CLI
output that neither parses markup nor passes control characters."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient

from service.app import create_app
from service.cli import clean
from tests.conftest import make_settings


def test_every_answer_carries_the_security_headers(api: TestClient) -> None:
    for path in ("/healthz", "/runs", "/runs/nope", "/ui/", "/docs", "/openapi.json"):
        resp = api.get(path)
        csp = resp.headers["content-security-policy"]
        assert "default-src 'self'" in csp and "script-src 'self'" in csp, path
        assert "unsafe-inline" not in csp.split("script-src")[1].split(";")[0]
        assert resp.headers["x-frame-options"] == "DENY"
        assert resp.headers["x-content-type-options"] == "nosniff"
        assert resp.headers["referrer-policy"] == "no-referrer"


def test_api_docs_load_only_from_the_service_and_have_no_inline_script(api: TestClient) -> None:
    page = api.get("/docs")
    assert page.status_code == 200
    sources = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert sources and all(s.startswith("/") and not s.startswith("//") for s in sources)
    assert not re.search(r"<script>(?!</script>)", page.text)
    for source in sources:
        assert api.get(source).status_code == 200, source
    assert "SwaggerUIBundle" in api.get("/docs/init.js").text
    assert api.get("/redoc").status_code == 404


def test_dashboard_has_no_inline_script(api: TestClient) -> None:
    page = api.get("/ui/").text
    assert re.findall(r"<script[^>]*>([^<]+)</script>", page) == []
    assert not re.search(r"\son[a-z]+=", page)


def test_hosts_outside_the_allow_list_are_refused(db_url: str) -> None:
    settings = make_settings(
        db_url, "http://127.0.0.1:9", run_loops=False, allowed_hosts=["rlrun.example"]
    )
    with TestClient(create_app(settings), base_url="http://rlrun.example") as client:
        assert client.get("/healthz").status_code == 200
        assert client.get("/healthz", headers={"host": "evil.example"}).status_code == 400


def test_cancel_without_the_bearer_header_is_refused_when_auth_is_on(db_url: str) -> None:
    """A cross-site form post cannot set the header, so it cannot cancel."""
    settings = make_settings(db_url, "http://127.0.0.1:9", run_loops=False, auth="on")
    with TestClient(create_app(settings)) as client:
        resp = client.post(
            "/runs/any/cancel",
            content=b"x=1",
            headers={"content-type": "application/x-www-form-urlencoded"},
        )
        assert resp.status_code == 401


def test_clean_drops_control_characters_and_keeps_markup_as_text() -> None:
    assert clean("a\x1b[31mred\x1b[0m\x07\r\nb\x9b") == "a[31mred[0mb"
    assert clean("[bold]x[/bold]") == "[bold]x[/bold]"  # printed as Text, never as markup
