"""An argv becomes an entrypoint with shell quoting: user strings stay single, inert arguments."""

from __future__ import annotations

import shlex
import subprocess
import uuid
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from service.recipes.base import Launch, LaunchContext
from service.scheduling.shape import ResourceShape
from tests.recipes import ScriptRecipe, ScriptSpec


def test_a_hostile_run_name_stays_one_argv_element_and_runs_nothing(tmp_path: Path) -> None:
    marker = Path(f"/tmp/pwned-{uuid.uuid4().hex[:8]}")
    name = f"x; touch {marker}"
    spec = ScriptSpec(name=f"{name} $(touch {marker}) `touch {marker}` | touch {marker} &")
    launch = ScriptRecipe().build(spec, LaunchContext(run_id="r1"))
    assert shlex.split(launch.entrypoint) == launch.argv
    assert launch.argv[3] == spec.name
    # Run the entrypoint through a real shell, with python3 replaced by a harmless echo.
    shown = subprocess.run(
        ["bash", "-c", launch.entrypoint.replace("python3", "printf '%s\\n'", 1)],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    )
    assert spec.name in shown.stdout.splitlines()
    assert not marker.exists()


@settings(max_examples=200)
@given(st.lists(st.text(min_size=0, max_size=40), min_size=1, max_size=6))
def test_any_argv_survives_the_round_trip_through_the_shell_quoting(argv: list[str]) -> None:
    argv = [a.replace("\x00", "") for a in argv]
    launch = Launch(argv=argv, runtime_env={}, shape=ResourceShape())
    assert shlex.split(launch.entrypoint) == argv
