"""Where a later attempt resumes, decided on the node: verl's newest complete checkpoint (with
``resume_path`` when the tracker is missing or behind, verl #7952), tiny-grpo's newest, and a
start from scratch that sets the earlier checkpoints aside."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from jobs import resume
from jobs.verl_launch import resume as verl_resume


def _step(root: Path, n: int, ranks: int = 2, data: bool = True) -> Path:
    actor = root / f"global_step_{n}" / "actor"
    actor.mkdir(parents=True)
    for r in range(ranks):
        (actor / f"model_world_size_2_rank_{r}.pt").write_bytes(b"x")
    if data:
        (root / f"global_step_{n}" / "data.pt").write_bytes(b"x")
    return root / f"global_step_{n}"


def test_the_tracker_missing_resumes_from_the_newest_complete_step_by_path(tmp_path: Path) -> None:
    _step(tmp_path, 2)
    newest = _step(tmp_path, 4)
    _step(tmp_path, 6, ranks=1)  # a shard missing: not complete
    _step(tmp_path, 8, data=False)  # the rollouter's state never written
    overrides, step, path = verl_resume.decide(tmp_path, "checkpoint")
    assert overrides == [
        "trainer.resume_mode=resume_path",
        f"trainer.resume_from_path={newest}",
    ]
    assert (step, path) == (4, str(newest))


def test_a_tracker_that_names_the_newest_leaves_verl_s_auto_resume(tmp_path: Path) -> None:
    _step(tmp_path, 4)
    (tmp_path / resume.TRACKER).write_text("4")
    assert verl_resume.decide(tmp_path, "checkpoint")[:2] == (["trainer.resume_mode=auto"], 4)
    (tmp_path / resume.TRACKER).write_text("2")  # behind: by path
    assert verl_resume.decide(tmp_path, "checkpoint")[1] == 4
    assert verl_resume.decide(tmp_path, "checkpoint")[0][0] == "trainer.resume_mode=resume_path"


def test_no_checkpoint_or_scratch_starts_from_step_zero(tmp_path: Path) -> None:
    assert verl_resume.decide(tmp_path / "none", "checkpoint") == (
        ["trainer.resume_mode=disable"],
        0,
        None,
    )
    _step(tmp_path, 4)
    (tmp_path / resume.TRACKER).write_text("4")
    assert verl_resume.decide(tmp_path, "scratch")[:2] == (["trainer.resume_mode=disable"], 0)
    # Set aside: a later attempt from checkpoint does not resume the superseded run.
    assert (tmp_path / "superseded-1" / "global_step_4" / "data.pt").is_file()
    assert not (tmp_path / resume.TRACKER).exists()
    assert verl_resume.decide(tmp_path, "checkpoint")[1] == 0


def test_the_resume_overrides_replace_any_the_command_had() -> None:
    command = ["python3", "-m", "verl", "trainer.resume_mode=disable", "+trainer.x=1"]
    assert verl_resume.with_overrides(command, ["trainer.resume_mode=auto"]) == [
        "python3",
        "-m",
        "verl",
        "+trainer.x=1",
        "trainer.resume_mode=auto",
    ]


def test_the_announce_line_is_read_back() -> None:
    assert resume.parse('(pid=1) rlrun resume: {"step": 7, "path": "/c/global_step_7"}') == 7
    assert resume.parse("rlrun resume: {nonsense") is None
    assert resume.parse("step:1 - a:1") is None


def test_the_watcher_says_every_save_the_tracker_passed_between_two_looks(tmp_path: Path) -> None:
    from jobs.verl_launch import saves

    for n in (1, 2, 3):
        _step(tmp_path, n)
    _step(tmp_path, 4, data=False)  # being written: not yet a checkpoint
    (tmp_path / verl_resume.TRACKER).write_text("3")
    now = saves.saved(tmp_path)
    assert now is not None and now[0] == 3
    assert [s for s, _ in saves.news(tmp_path, 1, now)] == [2, 3]
    assert [s for s, _ in saves.news(tmp_path, None, now)] == [1, 2, 3]
    assert [s for s, _ in saves.news(tmp_path, 2, now)] == [3]


def test_the_watcher_says_a_save_well_inside_a_verl_step(tmp_path: Path, monkeypatch: Any) -> None:
    """A save is said at the watcher's next look, at most ``POLL_S`` after it is written: well
    inside a verl step on CPU (0.6 s on a quiet host). Said a step later, it would follow that
    step's lines in the log, and a stop decided on it would count that step as lost."""
    from jobs.verl_launch import saves

    slept: list[float] = []
    said: list[tuple[int, float]] = []  # each save said, and the watcher's sleep until then

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 1:  # verl saves while the watcher waits
            _step(tmp_path, 1)
            (tmp_path / verl_resume.TRACKER).write_text("1")

    def announce(step: int, path: str) -> None:
        said.append((step, sum(slept)))

    monkeypatch.setattr(saves, "time", SimpleNamespace(sleep=sleep, monotonic=time.monotonic))
    monkeypatch.setattr(saves, "alive", lambda pid: not said)  # verl ends once a save is said
    monkeypatch.setattr(saves.checkpoints, "announce", announce)
    saves.watch(tmp_path, 1)
    assert said == [(1, 0.25)]
