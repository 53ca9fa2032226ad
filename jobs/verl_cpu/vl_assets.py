"""The VL smoke run's model, processor and image data, made here (no hub needed), the same bytes
each time.

``python -m jobs.verl_cpu.vl_assets DIR`` (or ``rlrun verl make-smoke-assets --vl DIR``) writes:

- ``DIR/model``: a Qwen3-VL of random weights built from transformers' own config classes
  (``Qwen3VLConfig``): a text model like the smoke Qwen2's (hidden 128, 2 layers, 2 heads of
  dim 64, one KV head, interleaved M-RoPE over sections 16/8/8) and a vision tower of 2 layers
  (hidden 128, 2 heads of dim 64, patch 16, merge 2, a deepstack feature from its last layer),
  float32 (vLLM's CPU attention refuses head dim 16; bfloat16 dies with SIGILL on some CPUs);
  its byte-level BPE tokenizer trained here with Qwen's vision tokens (``<|vision_start|>``,
  ``<|image_pad|>``, ``<|vision_end|>``, ``<|video_pad|>``; whole tokens, not special, so that
  verl's samples, decoded without special tokens, show them) and a ChatML template that renders
  an image part as ``<|vision_start|><|image_pad|><|vision_end|>``; and its processor (Qwen3-VL's,
  with the PIL image processor: no torchvision here), whose pixel bounds keep every image at
  64x64, i.e. 16 patches and 4 image tokens after the merge;
- ``DIR/data/{train,test}.parquet``: geo3k-shaped rows in verl's geo3k preprocessing format
  (``images``: one PNG as ``{"bytes": ...}``; the prompt's user turn starts with ``<image>``;
  ``data_source: hiyouga/geometry3k``, which verl's built-in geo3k reward scores): a shape drawn
  here with PIL (a triangle, square, pentagon or hexagon of a random colour, size and position),
  the question how many sides it has, the answer the number.

Random weights answer nothing: every reward is 0 and the run proves the path (images through
the processor to vLLM's rollout and to the trainer's forward), not learning.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import random
from pathlib import Path
from typing import Any

from jobs.verl_cpu import assets

SEED = 4321
VOCAB = 512
SPECIALS = assets.SPECIALS
# Qwen-VL's vision tokens, added whole but not special: verl writes its rollout samples decoded
# with skip_special_tokens, and a sample's prompt is to show where its image went.
VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
# ChatML with Qwen-VL's image parts: verl's dataset turns "<image>" in a prompt into a
# {"type": "image"} part before the processor renders the chat.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}" + IMAGE_PLACEHOLDER + "{% elif part['type'] == 'text' %}"
    "{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
IMAGE_SIZE = 64
PATCH, MERGE, TEMPORAL = 16, 2, 2
# The processor's pixel bounds: exactly one 64x64 image (a multiple of patch x merge = 32).
PIXELS = IMAGE_SIZE * IMAGE_SIZE
IMAGE_TOKENS = (IMAGE_SIZE // PATCH) ** 2 // MERGE**2
TRAIN_ROWS, TEST_ROWS = 64, 8
DATA_SOURCE = "hiyouga/geometry3k"
# verl's geo3k preprocessing appends its instruction; shorter here (a tiny vocabulary).
INSTRUCTION = " Think in <think> </think>, then put the answer in \\boxed{}."
DATASET_FILE = "vl_dataset.py"
DATASET_SOURCE = 'from jobs.verl_cpu.vl_dataset import ImageDataset\n\n__all__ = ["ImageDataset"]\n'
SHAPES = {3: "triangle", 4: "square", 5: "pentagon", 6: "hexagon"}


def draw(rng: random.Random) -> tuple[bytes, int]:
    """A PNG of a regular polygon (3-6 sides) on a plain background, and its number of sides."""
    from PIL import Image, ImageDraw

    sides = rng.choice(sorted(SHAPES))
    bg = tuple(rng.randint(200, 255) for _ in range(3))
    fg = tuple(rng.randint(0, 150) for _ in range(3))
    image = Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), bg)
    radius = rng.uniform(14, 26)
    cx = rng.uniform(radius + 2, IMAGE_SIZE - radius - 2)
    cy = rng.uniform(radius + 2, IMAGE_SIZE - radius - 2)
    turn = rng.uniform(0, 2 * math.pi)
    points = [
        (cx + radius * math.cos(turn + 2 * math.pi * k / sides),
         cy + radius * math.sin(turn + 2 * math.pi * k / sides))
        for k in range(sides)
    ]  # fmt: skip
    ImageDraw.Draw(image).polygon(points, fill=fg)
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue(), sides


def row(png: bytes, sides: int, split: str, index: int) -> dict[str, Any]:
    """One row as verl's geo3k preprocessing writes it (examples/data_preprocess/geo3k.py)."""
    question = "<image>How many sides does the shape have?"
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": question + INSTRUCTION}],
        "images": [{"bytes": png, "path": None}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(sides)},
        "extra_info": {"split": split, "index": index, "answer": str(sides), "question": question},
    }


def make_tokenizer(corpus: list[str], out: Path) -> Any:
    """cpu-smoke's tokenizer with Qwen's vision tokens and a template that renders images."""
    return assets.make_tokenizer(corpus, out, VOCAB, CHAT_TEMPLATE, tuple(VISION_TOKENS))


def make_processor(tokenizer: Any, out: Path) -> Any:
    """Qwen3-VL's processor with the PIL image processor and no video processor (transformers'
    torchvision-backed image processor and every video processor need torchvision, which this
    stack leaves out: ``jobs.verl_cpu.vision``)."""
    from jobs.verl_cpu.vision import without_torchvision

    without_torchvision()
    from transformers import Qwen3VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    images = Qwen2VLImageProcessorPil(
        patch_size=PATCH,
        temporal_patch_size=TEMPORAL,
        merge_size=MERGE,
        size={"shortest_edge": PIXELS, "longest_edge": PIXELS},
        min_pixels=PIXELS,
        max_pixels=PIXELS,
    )
    processor = Qwen3VLProcessor(
        image_processor=images, tokenizer=tokenizer, chat_template=CHAT_TEMPLATE
    )
    processor.save_pretrained(out)
    return processor


def make_model(tokenizer: Any) -> Any:
    import torch
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    torch.manual_seed(SEED)
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIALS + VISION_TOKENS}
    hidden = 128
    config = Qwen3VLConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": hidden,
            "intermediate_size": 256,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 64,
            "max_position_embeddings": 1024,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 500000.0,
                "mrope_section": [16, 8, 8],  # sums to head_dim / 2
                "mrope_interleaved": True,
            },
            "eos_token_id": ids["<|im_end|>"],
            "pad_token_id": ids["<|endoftext|>"],
            "bos_token_id": None,
            "dtype": "float32",
        },
        vision_config={
            "depth": 2,
            "hidden_size": hidden,
            "intermediate_size": 256,
            "num_heads": 2,
            "patch_size": PATCH,
            "spatial_merge_size": MERGE,
            "temporal_patch_size": TEMPORAL,
            "out_hidden_size": hidden,
            "num_position_embeddings": 16,  # a 4x4 grid of learned positions, interpolated
            "deepstack_visual_indexes": [1],
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
        dtype="float32",
    )
    return Qwen3VLForConditionalGeneration(config).to(torch.float32).eval()


def make(out_dir: str | Path) -> dict[str, Any]:
    """Write the model, tokenizer, processor and data under ``out_dir``; a summary of it."""
    import pandas as pd

    out = Path(out_dir)
    model_dir, data_dir = out / "model", out / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(SEED)
    splits = {"train": TRAIN_ROWS, "test": TEST_ROWS}
    rows = {s: [row(*draw(rng), s, i) for i in range(n)] for s, n in splits.items()}
    answer = "<think> </think> \\boxed{{{}}}"
    corpus = [r["prompt"][0]["content"] + " " + answer.format(r["reward_model"]["ground_truth"])
              for r in rows["train"]] + ["user assistant system\n"]  # fmt: skip
    tokenizer = make_tokenizer(corpus, model_dir)
    make_processor(tokenizer, model_dir)
    model = make_model(tokenizer)
    model.save_pretrained(model_dir, safe_serialization=True)
    for split, items in rows.items():
        pd.DataFrame(items).to_parquet(data_dir / f"{split}.parquet", index=False)
    # verl's data.custom_cls.path names a file (a spec's paths lie under the data roots): this one
    # only hands over the project's dataset class, installed on the nodes.
    (out / DATASET_FILE).write_text(DATASET_SOURCE)
    files = sorted(p for p in out.rglob("*") if p.is_file() and p.name != "assets.json")
    for path in files:  # the cluster may run jobs as another user; save_pretrained writes 0600
        path.chmod(0o644)
    summary = {
        "model": str(model_dir),
        "train_files": str(data_dir / "train.parquet"),
        "val_files": str(data_dir / "test.parquet"),
        "parameters": sum(p.numel() for p in model.parameters()),
        "dataset": str(out / DATASET_FILE),
        "image_tokens": IMAGE_TOKENS,
        "bytes": {str(p.relative_to(out)): p.stat().st_size for p in files},
    }
    (out / "assets.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("dir")
    print(json.dumps(make(parser.parse_args().dir), indent=2))


if __name__ == "__main__":
    main()
