"""Small user files travel with a run (its working directory on every node), referred to by name
in the config; a relative path the run does not ship is refused."""

from __future__ import annotations

import io
import zipfile

import pytest

from service.cluster.ray_jobs import zip_files
from service.recipes.base import RUN_FILES_DIR
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
    package = zip_files(launch.files, RUN_FILES_DIR)
    with zipfile.ZipFile(io.BytesIO(package)) as zf:
        assert zf.namelist() == ["run-files/reward.py"]
        assert zf.read("run-files/reward.py").decode() == REWARD
    assert package == zip_files(dict(launch.files), RUN_FILES_DIR)  # same content, same package
    # verl is pointed at the file's place; the command shows where it is.
    assert "custom_reward_function.path=run-files/reward.py" in launch.argv


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


def test_only_path_keys_naming_a_shipped_file_are_pointed_at_its_place() -> None:
    body = {
        **PRESET,
        "files": {"reward.py": REWARD},
        "overrides": [
            "custom_reward_function.path=./reward.py",
            "trainer.experiment_name=reward.py",  # not a path: left as it is
        ],
    }
    argv = build(body).argv
    assert "custom_reward_function.path=run-files/reward.py" in argv
    assert "trainer.experiment_name=reward.py" in argv
