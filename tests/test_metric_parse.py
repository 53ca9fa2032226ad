"""The console metric parser on verl's sample log, tiny-grpo's real log, and every quirk."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from service.loops.follower import split_lines
from service.metrics.keys import STEP_KEY
from service.metrics.parse import MetricLine, parse_line, parse_lines, parse_synced, parse_value

DATA = Path(__file__).parent / "data"


def metric_lines(path: Path) -> list[tuple[int, dict[str, float]]]:
    out = []
    for line in path.read_text().splitlines():
        parsed = parse_line(line)
        if parsed is not None:
            out.append((parsed.step, parsed.values))
    return out


def test_the_verl_sample_yields_every_metric_line_and_nothing_else() -> None:
    every = metric_lines(DATA / "verl_console_log_sample.txt")
    # The trainer's sync lines (one before each sync's step lines) are its version, at once.
    synced = [(step, values) for step, values in every if set(values) == {STEP_KEY}]
    assert synced == [(v, {STEP_KEY: float(v)}) for v in range(4)]
    lines = [line for line in every if line not in synced]
    assert [step for step, _ in lines] == [0, 1, 1, 2, 2, 2, 3, 3]
    training = lines[2][1]
    assert training["critic/score/mean"] == 0.475371786659471
    assert training["training/global_step"] == 4.0
    assert training["actor/lr"] == 1e-06
    assert training["timing_s/timing_s/param_sync"] == 8.92876531677876
    validation = lines[4][1]
    assert validation["val-core/hiyouga/geometry3k/acc/mean@1"] == 0.5424221531492307
    assert validation["val-aux/num_turns/min"] == 2.0
    assert math.isnan(lines[7][1]["actor/grad_norm"])
    assert not any("timing_s/param_sync" in values for _, values in lines)


def test_a_captured_tiny_grpo_log_parses_with_verl_names_and_ray_prefixes() -> None:
    lines = metric_lines(DATA / "tiny_grpo_job_log.txt")
    training = [(s, v) for s, v in lines if "training/global_step" in v]
    assert training, "no training lines"
    assert [s for s, _ in training] == list(range(1, len(training) + 1))
    assert all(v["fully_async/count/current_param_version"] == s for s, v in training)
    assert training[0][1]["critic/score/mean"] < 0.2
    assert training[-1][1]["critic/score/mean"] > 0.8
    assert any("val-core/tiny/arith/acc/mean@1" in v for _, v in lines)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0.5", 0.5),
        ("-1.5e-06", -1.5e-06),
        ("3", 3.0),
        ("np.float64(0.41)", 0.41),
        ("np.int64(3)", 3.0),
        ("np.float32(-2.5)", -2.5),
        ("numpy.float64(1.0)", 1.0),
        ("True", 1.0),
        ("False", 0.0),
        ("np.True_", 1.0),
        ("inf", math.inf),
        ("-inf", -math.inf),
        ("np.float64(inf)", math.inf),
        ("7.41 seconds", None),
        ("tensor(0.5)", None),
        ("", None),
    ],
)
def test_values_parse_as_printed_by_python_and_numpy(text: str, expected: float | None) -> None:
    assert parse_value(text) == expected


def test_nan_parses_in_plain_and_numpy_form() -> None:
    for text in ("nan", "np.float64(nan)"):
        value = parse_value(text)
        assert value is not None and math.isnan(value)


@pytest.mark.parametrize(
    "line",
    [
        "(FullyAsyncTrainer pid=1, ip=10.0.0.1) step:4 - a/b@1:0.5 - c-d_e:np.int64(2)",
        "\x1b[36m(TinyGrpoTrainer pid=77)\x1b[0m step:4 - a/b@1:0.5 - c-d_e:np.int64(2)",
        "(pid=9) step:4 - a/b@1:0.5 - c-d_e:np.int64(2) [repeated 2x across cluster]",
        "step:4 - a/b@1:0.5 - c-d_e:np.int64(2)\r\n",
    ],
)
def test_ray_prefixes_colours_and_dedup_suffixes_are_stripped(line: str) -> None:
    parsed = parse_line(line)
    assert parsed is not None
    assert parsed.step == 4 and parsed.values == {"a/b@1": 0.5, "c-d_e": 2.0}


@pytest.mark.parametrize(
    "line",
    [
        "[FullyAsyncTrainer] _fit_update_weights, timing_s/param_sync: 7.41 seconds",
        "step:3",
        "step:x - a:1",
        "step:3 - timing_s/param_sync: 7.41 seconds",
        "step:3 - a:1 - note:hello",
        "step:3 - a b:1",
        "training step:3 - a:1",
        "{'step': 3, 'a': 1}",
    ],
)
def test_lines_that_only_look_like_metrics_are_not_metric_lines(line: str) -> None:
    assert parse_line(line) is None


def test_a_key_may_hold_a_colon_free_mix_of_separators_and_splits_on_its_last_colon() -> None:
    parsed = parse_line("step:12 - val-core/a_b/acc/mean@4:np.float64(0.25) - x:-inf")
    assert parsed is not None
    assert parsed.values == {"val-core/a_b/acc/mean@4": 0.25, "x": -math.inf}


def test_the_launchers_preflight_line_is_read_and_nothing_else_is() -> None:
    from service.metrics.parse import parse_preflight

    report = {"ok": True, "seconds": 1.5, "nodes": [{"node": "10.0.0.1", "checks": []}]}
    assert parse_preflight("rlrun-preflight: " + json.dumps(report) + "\n") == report
    assert parse_preflight("(raylet) rlrun-preflight: {not json") is None
    assert parse_preflight('rlrun-preflight: {"ok": true}') is None  # no nodes: not a report
    assert parse_preflight("step:1 - a:1") is None


def test_any_terminal_escape_is_stripped_before_a_line_is_read() -> None:
    line = "\x1b]0;title\x07\x1b[36m(TinyGrpoTrainer pid=1)\x1b[0m\x1b[2K step:4 - a/b:1.5"
    parsed = parse_line(line)
    assert parsed is not None and parsed.step == 4 and parsed.values == {"a/b": 1.5}


@pytest.mark.parametrize(
    ("line", "version"),
    [
        # As verl 0.9.1 prints it in a Ray job log (a real cpu-smoke run's, colour and all).
        (
            "\x1b[36m(FullyAsyncTrainer pid=23305)\x1b[0m [FullyAsyncTrainer] _fit_update_weights,"
            " timing_s/param_sync: 0.1310 seconds self.current_param_version: 3",
            3,
        ),
        ("[FullyAsyncTrainer] _fit_update_weights, self.current_param_version: 12 ", 12),
        ("[FullyAsyncTrainer] _fit_update_weights, timing_s/param_sync: 7.41 seconds", None),
        ("[FullyAsyncTrainer] global_steps: 3 local_trigger_step: 1", None),
        ("echo [FullyAsyncTrainer] _fit_update_weights, current_param_version: 3", None),
        ("[FullyAsyncTrainer] _fit_update_weights, current_param_version: 3x", None),
    ],
)
def test_the_trainers_own_sync_line_is_its_parameter_version_at_that_step(
    line: str, version: int | None
) -> None:
    assert parse_synced(line) == version
    parsed = parse_line(line)
    assert parsed == (None if version is None else (version, {STEP_KEY: float(version)}))
    # verl's own step line says the version the step trained with: a metric, not a sync.
    assert parse_synced("step:3 - fully_async/count/current_param_version:1.0") is None


def test_a_step_line_glued_behind_the_drivers_unfinished_print_is_still_read() -> None:
    # As a tiny-grpo job log had it: the driver's print wrote its text, Ray's log thread wrote a
    # forwarded worker line, then the driver's newline came.
    line = (
        "[TinyGrpo] saved checkpoint global_step_12\x1b[36m(TinyGrpoTrainer pid=25496)\x1b[0m "
        "step:12 - training/global_step:24 - critic/score/mean:0.9125"
    )
    got = parse_line(line)
    assert got is not None and got.step == 12
    assert got.values == {"training/global_step": 24.0, "critic/score/mean": 0.9125}
    # The last of two prefixes is the step line's own; text without one is not a step line.
    two = "(A pid=1) x (B pid=2) step:3 - a:1"
    assert parse_line(two) == parse_line("(B pid=2) step:3 - a:1")
    assert parse_line("note: step:3 - a:1") is None


def test_a_step_line_with_a_sample_frame_glued_after_it_is_read_up_to_the_frame() -> None:
    # As a tiny-grpo job log had it: the driver's sample shipper wrote a frame between Ray's
    # forwarded line and its newline.
    line = (
        "\x1b[36m(TinyGrpoRollouter pid=26851)\x1b[0m step:12 - fully_async/rollouter/"
        "idle_ratio:0.0044 - fully_async/rollouter/step_generated_samples:128"
        'rlrun-sample {"step":20}'
    )
    got = parse_line(line)
    assert got is not None and got.step == 12
    assert got.values == {
        "fully_async/rollouter/idle_ratio": 0.0044,
        "fully_async/rollouter/step_generated_samples": 128.0,
    }


# Two cpu-learn runs' logs, as Ray's Jobs API gave them: step 19's line glued behind its own
# worker's "Dumped generations" print; step 28's cut in two by Ray's log monitor (it read the
# worker's file mid-write), its rest 6 lines later behind that worker's progress bar.
CUT = DATA / "verl_cut_step_lines.log"


def _lines(text: str) -> list[tuple[int, str]]:
    return split_lines(text, 0, True)[1]  # as the follower splits a read (\r too)


def test_a_step_line_cut_in_two_or_glued_behind_its_workers_print_is_read_whole() -> None:
    lines = _lines(CUT.open(encoding="utf-8", newline="").read())
    steps = [
        (m.step, len(m.values), m.values.get("critic/score/mean")) for _, m in parse_lines(lines)
    ]
    assert steps == [(19, 141, 0.6640625), (28, 1, None), (28, 5, None), (28, 141, 0.6640625)]
    # Line by line, step 28's reward is not there.
    alone = [m for _, line in lines if (m := parse_line(line)) and m.step == 28]
    assert not [m for m in alone if "critic/score/mean" in m.values]


def test_a_step_line_with_another_threads_print_glued_behind_it_is_read_up_to_it() -> None:
    # cpu-learn's step 27 as the service kept it: verl's trainer thread printed "Dumped
    # generations to ..." between the step line's text and its newline.
    text = (DATA / "verl_glued_step_line.log").open(encoding="utf-8", newline="").read()
    (step,) = [m for _, m in parse_lines(_lines(text))]
    assert (step.step, len(step.values), step.values["critic/score/mean"]) == (27, 141, 0.7578125)
    assert step.values["dynamic_resource/resource_utilization"] == 0.3926694382619132
    glued = "step:3 - a:1 - b:np.float64(0.5)[Trainer] INFO: at 12:00 - c:2"
    assert parse_line(glued) == MetricLine(3, {"a": 1.0, "b": 0.5})
    nan = parse_line("step:3 - a:1 - b:nanDumped x")
    assert nan is not None and nan.values["a"] == 1.0 and math.isnan(nan.values["b"])
    # A whole step line and its worker's next print (the next sync's line) stay two lines.
    worker = "(FullyAsyncTrainer pid=7) "
    text = (
        f"{worker}step:2 - training/global_step:1.0 - fully_async/count/current_param_version:0.0\n"
        f"{worker}[FullyAsyncTrainer] _fit_update_weights, timing_s/param_sync: 0.12 seconds "
        "self.current_param_version: 3\n"
    )
    assert [(m.step, len(m.values)) for _, m in parse_lines(_lines(text))] == [(2, 2), (3, 1)]
    # Text run into a value that no print starts with is no metric line.
    for bad in ("step:3 - a:1 - b:0.5abc", "step:3 - a:1.5e - b:2", "step:3 - a:Dumped"):
        assert parse_line(bad) is None, bad


def test_a_step_line_cut_anywhere_with_other_lines_between_is_read_as_the_whole() -> None:
    whole = "step:7 - " + " - ".join(f"k{i}/x_{i}:{i * 0.731:.5f}" for i in range(60))
    expected = parse_line(whole)
    assert expected is not None and len(expected.values) == 60
    worker = "\x1b[36m(FullyAsyncTrainer pid=42)\x1b[0m "
    for cut in range(9, len(whole) - 1, 7):
        text = (
            f"{worker}{whole[:cut]}\n"
            "\x1b[36m(FullyAsyncRollouter pid=43)\x1b[0m step:7 - other:1.0\n"
            f"{worker}\rTraining Progress:  47%|####  | 28/60\n"
            f"{worker}\n"
            f"{worker}{whole[cut:]}\n"
            f"{worker}aggregated metrics done. cost 0.0027 seconds.\n"
        )
        got = [m for _, m in parse_lines(_lines(text)) if m.values != {"other": 1.0}]
        assert got == [expected], (cut, whole[:cut][-20:], got)
    # A whole line and the worker's next line stay apart.
    text = f"{worker}{whole}\n{worker}{whole.replace('step:7', 'step:8')}\n"
    assert [m.step for _, m in parse_lines(_lines(text))] == [7, 8]
