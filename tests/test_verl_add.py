"""``rlrun verl add``: a strict release version (matched whole, no newline), and a wheel used
only when its SHA-256 is one the index's JSON API publishes. Against a package index served
here (a simple index for pip and the JSON API), so no network is needed."""

from __future__ import annotations

import hashlib
import io
import json
import threading
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from service import cli
from service.recipes.verl import versions

WHEEL = "verl-0.9.0-py3-none-any.whl"


def wheel_bytes() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("verl/__init__.py", "")
        zf.writestr("verl/experimental/fully_async_policy/config/fully_async_ppo_trainer.yaml", "")
        zf.writestr(
            "verl-0.9.0.dist-info/METADATA",
            "Metadata-Version: 2.1\nName: verl\nVersion: 0.9.0\nRequires-Dist: transformers\n",
        )
        zf.writestr(
            "verl-0.9.0.dist-info/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        zf.writestr("verl-0.9.0.dist-info/RECORD", "")
    return buf.getvalue()


class Index:
    """A package index on 127.0.0.1: ``published`` is the SHA-256 its JSON API lists."""

    def __init__(self) -> None:
        self.wheel = wheel_bytes()
        self.published: str | None = hashlib.sha256(self.wheel).hexdigest()
        self.hits: list[str] = []
        index = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                index.hits.append(self.path)
                if self.path.rstrip("/") == "/simple/verl":
                    digest = hashlib.sha256(index.wheel).hexdigest()
                    body = f'<a href="/files/{WHEEL}#sha256={digest}">{WHEEL}</a>'.encode()
                    self._send(200, "text/html", body)
                elif self.path == f"/files/{WHEEL}":
                    self._send(200, "application/octet-stream", index.wheel)
                elif self.path == "/pypi/verl/json" and index.published:
                    entry = {
                        "filename": WHEEL,
                        "packagetype": "bdist_wheel",
                        "digests": {"sha256": index.published},
                    }
                    page = {"releases": {"0.9.0": [entry], "0.8.0": []}}
                    self._send(200, "application/json", json.dumps(page).encode())
                else:
                    self._send(404, "text/plain", b"not found")

            def _send(self, status: int, kind: str, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def index(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Index]:
    served = Index()
    monkeypatch.setenv("PIP_INDEX_URL", f"{served.url}/simple/")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    monkeypatch.setenv("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    monkeypatch.setenv("RLRUN_VERL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("RLRUN_VERL_INDEX_JSON_URL", f"{served.url}/pypi")
    yield served
    served.server.shutdown()


def add(version: str) -> Any:
    return CliRunner().invoke(cli.app, ["verl", "add", version])


def test_a_wheel_with_the_published_sha256_is_added(index: Index, tmp_path: Path) -> None:
    result = add("0.9.0")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "cache" / "0.9.0" / "verl" / "__init__.py").is_file()
    assert "/pypi/verl/json" in index.hits


def test_a_wheel_whose_sha256_the_index_does_not_publish_is_refused(
    index: Index, tmp_path: Path
) -> None:
    index.published = "0" * 64
    result = add("0.9.0")
    assert result.exit_code == 1
    assert not (tmp_path / "cache" / "0.9.0").exists()


def test_without_the_indexs_hashes_nothing_is_downloaded(index: Index, tmp_path: Path) -> None:
    index.published = None
    result = add("0.9.0")
    assert result.exit_code == 1 and "no checked wheel" in result.output
    assert not any(hit.startswith("/files/") for hit in index.hits)
    assert not (tmp_path / "cache" / "0.9.0").exists()


@pytest.mark.parametrize(
    "version",
    ["0.9.0\n", "0.9.0 ", " 0.9.0", "0.9", "v0.9.0", "0.9.0+local", "0.9.0;id", "0.09.0",
     "\uff10.9.0", "0.9.0rc", "0.9.0-1", "../0.9.0"],
)  # fmt: skip
def test_a_version_that_is_not_a_strict_release_is_refused_before_any_download(
    index: Index, version: str
) -> None:
    assert not versions.is_release(version)
    result = add(version)
    assert result.exit_code == 1
    assert index.hits == []


@pytest.mark.parametrize("version", ["0.9.0", "0.10.1", "1.0.0rc1", "0.9.1.post2", "1.2.3.dev4"])
def test_releases_are_accepted(version: str) -> None:
    assert versions.is_release(version)
