"""Small user files travel with a run (its working directory on every node), referred to by name
in the config; a relative path the run does not ship is refused."""

from __future__ import annotations

import io
import zipfile

import pytest

from service.cluster.ray_jobs import zip_files
from tests.test_verl_recipe import PRESET, build, refused

REWARD = (
    "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1\n"
)


def test_a_shipped_reward_function_is_referred_to_by_name() -> None:
    body = {
        **PRESET,
        "files": {"reward.py": REWARD},
        "overrides": ["custom_reward_function.path=reward.py"],
    }
    launch = build(body)
    assert launch.files == {"reward.py": REWARD}
    with zipfile.ZipFile(io.BytesIO(zip_files(launch.files))) as zf:
        assert zf.namelist() == ["reward.py"] and zf.read("reward.py").decode() == REWARD
    assert zip_files(launch.files) == zip_files(dict(launch.files))  # same content, same package


def test_a_relative_path_the_run_does_not_ship_is_refused_naming_the_field() -> None:
    (error,) = refused({**PRESET, "overrides": ["custom_reward_function.path=reward.py"]})
    assert error["field"] == "overrides[0]" and "not one of the run's files" in error["msg"]


@pytest.mark.parametrize(
    "files",
    [
        {"../escape.py": "x"},
        {"dir/reward.py": "x"},
        {"big.py": "x" * (64 * 1024 + 1)},
        {f"f{i}.py": "x" for i in range(17)},
        {f"f{i}.py": "x" * 60_000 for i in range(5)},
    ],
    ids=["dotdot", "slash", "too-big", "too-many", "too-much"],
)
def test_files_are_plain_names_and_small(files: dict[str, str]) -> None:
    errors = refused({**PRESET, "files": files})
    assert errors[0]["field"].startswith("files"), errors
