"""The VL smoke run's pieces, in-process: the tiny Qwen3-VL assets, the processor without
torchvision, verl's image dataset without qwen_vl_utils, and the ``cpu-smoke-vl`` preset.

These need the trainer stack (rlrun[verl-cpu], README): without it they fail, never skip.
"""

from __future__ import annotations

import asyncio
import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from jobs.verl_cpu import vision, vl_assets
from service.recipes.verl.preset import PRESETS, SMOKE_VL_DIR, VL_OVERRIDES
from service.recipes.verl.spec import VerlFullyAsyncSpec
from service.settings import Settings


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two builds by the CLI, as a user makes them."""
    from typer.testing import CliRunner

    from service.cli import app

    root = tmp_path_factory.mktemp("vl")
    runs = [CliRunner().invoke(app, ["verl", "make-smoke-assets", "--vl", str(root / d),
                                     "--output", "json"]) for d in ("a", "b")]  # fmt: skip
    assert [r.exit_code for r in runs] == [0, 0], runs[0].output
    return root / "a", root / "b"


def chat(image: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "image", "image": image},
                                         {"type": "text", "text": "How many?"}]}]  # fmt: skip


@pytest.mark.slow
def test_two_builds_are_byte_identical_and_readable(built: tuple[Path, Path]) -> None:
    a, b = built
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert {Path("model/model.safetensors"), Path("model/processor_config.json"),
            Path("vl_dataset.py"), Path("data/train.parquet"),
            Path("data/test.parquet")} <= set(files)  # fmt: skip
    assert all((a / f).stat().st_mode & 0o777 == 0o644 for f in files)
    for f in files:
        if f.name != "assets.json":  # names its own directory
            assert (a / f).read_bytes() == (b / f).read_bytes(), f


@pytest.mark.slow
def test_the_model_is_a_tiny_qwen3_vl_vllms_cpu_attention_takes(built: tuple[Path, Path]) -> None:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(built[0] / "model")
    text, seen = config.text_config, config.vision_config
    assert config.model_type == "qwen3_vl" and config.architectures == [
        "Qwen3VLForConditionalGeneration"
    ]
    assert (text.head_dim, text.num_hidden_layers, text.hidden_size) == (64, 2, 128)
    assert sum(text.rope_parameters["mrope_section"]) == text.head_dim // 2
    assert seen.hidden_size // seen.num_heads == 64  # vLLM's CPU attention refuses 16
    assert (seen.depth, seen.patch_size, seen.spatial_merge_size) == (2, 16, 2)
    assert config.dtype == "float32" or str(config.dtype) == "torch.float32"


@pytest.mark.slow
def test_rows_are_verls_geo3k_format_and_scored_by_its_reward(built: tuple[Path, Path]) -> None:
    import pandas as pd
    from PIL import Image
    from verl.utils.reward_score import default_compute_score

    train = pd.read_parquet(built[0] / "data" / "train.parquet")
    test = pd.read_parquet(built[0] / "data" / "test.parquet")
    assert (len(train), len(test)) == (vl_assets.TRAIN_ROWS, vl_assets.TEST_ROWS)
    row = train.iloc[0]
    assert row["data_source"] == "hiyouga/geometry3k"
    assert row["prompt"][0]["content"].startswith("<image>")
    assert len(row["images"]) == 1
    image = Image.open(io.BytesIO(row["images"][0]["bytes"]))
    assert (image.format, image.size, image.mode) == ("PNG", (64, 64), "RGB")
    truths = {r["ground_truth"] for r in train["reward_model"]}
    assert truths == {"3", "4", "5", "6"}  # every shape drawn
    truth = row["reward_model"]["ground_truth"]
    right = f"<think>count</think> \\boxed{{{truth}}}"
    assert default_compute_score(row["data_source"], right, truth) == 1.0
    assert default_compute_score(row["data_source"], "<think>x</think> \\boxed{9}", truth) == (
        pytest.approx(0.1)  # the format's share only
    )
    assert default_compute_score(row["data_source"], "nothing", truth) == 0


@pytest.mark.slow
def test_the_processor_renders_the_image_placeholder_and_its_tokens(
    built: tuple[Path, Path],
) -> None:
    import pandas as pd
    from PIL import Image
    from transformers import AutoProcessor

    vision.without_torchvision()
    processor = AutoProcessor.from_pretrained(built[0] / "model")
    assert type(processor).__name__ == "Qwen3VLProcessor"
    row = pd.read_parquet(built[0] / "data" / "train.parquet").iloc[0]
    image = Image.open(io.BytesIO(row["images"][0]["bytes"]))
    text = processor.apply_chat_template(chat(image), add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|im_start|>user\n" + vl_assets.IMAGE_PLACEHOLDER)
    assert text.endswith("<|im_start|>assistant\n")
    inputs = processor(text=[text], images=[image], return_tensors="pt")
    assert inputs["image_grid_thw"].tolist() == [[1, 4, 4]]  # 64 px / patch 16
    assert tuple(inputs["pixel_values"].shape) == (16, 3 * 2 * 16 * 16)
    pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert inputs["input_ids"][0].tolist().count(pad) == vl_assets.IMAGE_TOKENS == 4
    # As verl writes a sample's prompt (skip_special_tokens): ChatML's tokens go, the image stays.
    shown = processor.tokenizer.decode(inputs["input_ids"][0], skip_special_tokens=True)
    assert shown.startswith("user\n<|vision_start|>" + "<|image_pad|>" * 4 + "<|vision_end|>How")


@pytest.mark.slow
def test_the_model_takes_the_image_and_generates(built: tuple[Path, Path]) -> None:
    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    vision.without_torchvision()
    processor = AutoProcessor.from_pretrained(built[0] / "model")
    model = AutoModelForImageTextToText.from_pretrained(built[0] / "model").eval()
    images = [Image.new("RGB", (64, 64), c) for c in ("white", "black")]
    text = processor.apply_chat_template(chat(images[0]), add_generation_prompt=True,
                                         tokenize=False)  # fmt: skip
    logits = []
    with torch.no_grad():
        for image in images:
            inputs = processor(text=[text], images=[image], return_tensors="pt")
            logits.append(model(**inputs).logits[0, -1])
        out = model.generate(**inputs, max_new_tokens=4, do_sample=False)
    assert not torch.allclose(logits[0], logits[1])  # the image reaches the language model
    assert out.shape[1] == inputs["input_ids"].shape[1] + 4


def test_without_torchvision_qwen_vls_image_module_is_the_pil_one() -> None:
    from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl as pil

    assert vision.torchvision_missing()  # the stack leaves it out (test_verl_cpu)
    vision.without_torchvision()
    # What vLLM 0.32's qwen2_vl.py / qwen3_vl.py import at their top.
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import (  # type: ignore[attr-defined]
        Qwen2VLImageProcessor,
        smart_resize,
    )

    assert Qwen2VLImageProcessor is pil.Qwen2VLImageProcessorPil
    assert smart_resize is pil.smart_resize


def test_the_alias_module_is_only_made_without_torchvision(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, vision.TORCHVISION_IMAGES, raising=False)
    monkeypatch.setattr(vision, "torchvision_missing", lambda: False)
    vision.without_torchvision()
    assert vision.TORCHVISION_IMAGES not in sys.modules


def test_processors_drop_only_the_video_processor() -> None:
    from transformers import Qwen2_5_VLProcessor, Qwen3VLProcessor

    vision.without_torchvision()
    for cls in (Qwen3VLProcessor, Qwen2_5_VLProcessor):
        assert cls.get_attributes() == ["image_processor", "tokenizer"]


def test_image_dataset_takes_images_with_pil() -> None:
    from PIL import Image

    from jobs.verl_cpu.vl_dataset import ImageDataset

    odd = Image.new("L", (50, 70))
    messages = chat(odd)
    images, videos, audios = ImageDataset._process_multi_modal_info(messages, 16, None)
    assert videos is None and audios is None
    [image] = images
    # RGB, resized to multiples of patch x merge (32) as qwen_vl_utils.fetch_image does.
    assert image.mode == "RGB" and image.size[0] % 32 == 0 and image.size[1] % 32 == 0
    images, videos = asyncio.run(ImageDataset.process_vision_info(messages, 16, None))
    assert len(images) == 1 and videos == []
    assert (
        ImageDataset._process_multi_modal_info([{"role": "user", "content": "hi"}], 16, None)[0]
        is None
    )
    with pytest.raises(ValueError, match="video"):
        ImageDataset._process_multi_modal_info(
            [{"role": "user", "content": [{"type": "video", "video": "x.mp4"}]}], 16, None
        )


def test_make_smoke_assets_refuses_warm_start_with_vl(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from service.cli import app

    args = ["verl", "make-smoke-assets", "--vl", "--warm-start-steps", "3", str(tmp_path / "x")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "text model only" in result.output
    assert not (tmp_path / "x").exists()


def test_cpu_smoke_vl_preset_reads_the_vl_assets_and_images() -> None:
    settings = Settings(verl_data_dir="/d", verl_model_dir="/m")
    body = PRESETS["cpu-smoke-vl"](settings)
    spec = VerlFullyAsyncSpec.model_validate(body)
    root = f"/d/{SMOKE_VL_DIR}"
    assert body["model"]["path"] == f"{root}/model"
    assert body["data"]["train_files"] == f"{root}/data/train.parquet"
    assert body["data"]["image_key"] == "images"
    assert spec.overrides[-len(VL_OVERRIDES) :] == VL_OVERRIDES
    # Everything else is cpu-smoke's: the CPU shims and one worker of each kind.
    smoke = PRESETS["cpu-smoke"](settings)
    assert set(smoke["overrides"]) < set(body["overrides"])
    assert body["rollout"]["total_rollout_steps"] == smoke["rollout"]["total_rollout_steps"]


def test_cpu_smoke_vl_builds_through_the_recipe_with_its_hooks_as_verl_reads_them() -> None:
    from tests.test_verl_recipe import build, verl_argv

    launch = build({"recipe": "verl-fully-async", "preset": "cpu-smoke-vl"})
    args = dict(a.lstrip("+").split("=", 1) for a in verl_argv(launch)[5:])
    assert args["data.image_key"] == "images"
    assert args["data.custom_cls.path"] == f"/mnt/data/{SMOKE_VL_DIR}/vl_dataset.py"
    assert args["data.custom_cls.name"] == "ImageDataset"
    limit = args["actor_rollout_ref.rollout.engine_kwargs.vllm.limit_mm_per_prompt"]
    assert json.loads(limit.strip("'")) == {"image": 1, "video": 0}
    assert args["trainer.device"] == "cpu"


@pytest.mark.slow
def test_the_assets_dataset_file_hands_verl_the_projects_class(built: tuple[Path, Path]) -> None:
    from verl.utils.import_utils import load_extern_object

    from jobs.verl_cpu.vl_dataset import ImageDataset

    assert load_extern_object(str(built[0] / "vl_dataset.py"), "ImageDataset") is ImageDataset
