"""Each shared word of the service is defined in one module; the others import it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

SERVICE = Path(__file__).resolve().parent.parent / "service"

# What defines the word (a pattern of code, not of prose) -> the one module allowed to.
HOMES = {
    r"[\"']critic/score/mean[\"']": "metrics/keys.py",
    r"[\"']fully_async/count/current_param_version[\"']": "metrics/keys.py",
    r"[\"']training/global_step[\"']": "metrics/keys.py",
    r"\\x1b": "metrics/ansi.py",
    r"[\"']RLRUN_URL[\"']": "client.py",
    r"\b8000\b": "client.py",
    r"datetime\.now\(|datetime\.utcnow\(": "clock.py",
    r"inf_nan_mode|[\"']-?Infinity[\"']\s*(?:if|else|$)": "wire/documents.py",
    # A run event's JSON, in a run's answer and on its stream alike: the one list of its columns.
    r"[\"']from_status[\"'],\s*[\"']to_status[\"']": "wire/runs.py",
    r"frozenset\(\s*\{[^}]*SUCCEEDED": "store/status.py",
    r"^(?:class ResourceShape|PRIORITIES\b)": "scheduling/",
}


def _code(path: Path) -> str:
    """The file without comments and docstrings' prose lines (a word may be named in text)."""
    lines = []
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("#") or '"""' in stripped or stripped.startswith("``"):
            continue
        lines.append(line)
    return "\n".join(lines)


@pytest.mark.parametrize("pattern", sorted(HOMES))
def test_a_shared_word_is_defined_once(pattern: str) -> None:
    found = {
        str(path.relative_to(SERVICE))
        for path in SERVICE.rglob("*.py")
        if re.search(pattern, _code(path), re.MULTILINE)
    }
    assert found and all(f.startswith(HOMES[pattern]) for f in found), found
