"""Where the browser tests find Chromium, and how each of them skips without it: one mark and
one fixture check, with the install hint. CI installs Chromium, so there none of them skips."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
INSTALL_HINT = "needs Debian's chromium (apt-get install -y chromium)"


def chromium_missing() -> bool:
    """Outside CI a machine without Chromium skips the browser tests; in CI they must run."""
    return not Path(CHROMIUM).exists() and not os.environ.get("CI")


# For a module of browser tests; a test elsewhere that asks for the ``browser`` (or ``page``)
# fixture skips the same way from the fixture.
needs_chromium = pytest.mark.skipif(chromium_missing(), reason=INSTALL_HINT)


def skip_without_chromium() -> None:
    if chromium_missing():
        pytest.skip(INSTALL_HINT)
