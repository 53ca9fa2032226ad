"""Vision-language models on this CPU stack, which has no torchvision.

PyPI's torchvision wheels are CUDA builds: beside torch's CPU build they fail to load their
operators (``operator torchvision::nms does not exist``) and break every transformers model
import, so the stack leaves torchvision out. Two things of a Qwen-VL run need it anyway:

- transformers 5.19's processors of Qwen2-VL, Qwen2.5-VL and Qwen3-VL take a video processor,
  and every video processor needs torchvision (``BaseVideoProcessor``): without it no such
  processor can be built or loaded (``ProcessorMixin.check_argument_for_proper_class`` fails on
  ``VIDEO_PROCESSOR_MAPPING``). ``image_only_processors`` drops the video processor from a
  processor's attributes while torchvision is missing: images only, which is all an image
  dataset asks of it (``ProcessorMixin.__call__`` skips videos when it has no video processor).
- verl 0.9.1's ``RLHFDataset`` takes a prompt's images with ``qwen_vl_utils``, which imports
  torchvision at its top. ``vl_dataset.ImageDataset`` (``data.custom_cls``) does the same for
  images with PIL: the image opened, in RGB, resized as the processor would (``smart_resize``).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
import types
from typing import Any

VIDEO = "video_processor"
# transformers' torchvision-backed Qwen2-VL image processor module, which imports torchvision at
# its top, and its PIL twin (the same smart_resize, "Copied from" it).
TORCHVISION_IMAGES = "transformers.models.qwen2_vl.image_processing_qwen2_vl"
PIL_IMAGES = "transformers.models.qwen2_vl.image_processing_pil_qwen2_vl"


def torchvision_missing() -> bool:
    return importlib.util.find_spec("torchvision") is None


def without_torchvision() -> None:
    """While torchvision is missing: processors without their video processor, and the Qwen2-VL
    image processor module vLLM imports served by its PIL twin."""
    if torchvision_missing():
        image_only_processors()
        pil_image_processor_module()


def pil_image_processor_module() -> None:
    """vLLM 0.32's Qwen2-VL, Qwen2.5-VL and Qwen3-VL models import ``smart_resize`` (and Qwen3-VL
    ``Qwen2VLImageProcessor``) from ``TORCHVISION_IMAGES``, which cannot be imported without
    torchvision: register that name as a module of the PIL twin's contents, with
    ``Qwen2VLImageProcessor`` its PIL class (what ``transformers.models.qwen2_vl`` itself falls
    back to without torchvision)."""
    if TORCHVISION_IMAGES in sys.modules:
        return
    pil = importlib.import_module(PIL_IMAGES)
    alias = types.ModuleType(TORCHVISION_IMAGES, pil.__doc__)
    alias.__dict__.update({k: v for k, v in vars(pil).items() if not k.startswith("__")})
    alias.Qwen2VLImageProcessor = pil.Qwen2VLImageProcessorPil  # type: ignore[attr-defined]
    sys.modules[TORCHVISION_IMAGES] = alias


def image_only_processors() -> None:
    """While torchvision is missing, a processor's attributes leave out its video processor."""
    if not torchvision_missing():
        return
    from transformers.processing_utils import ProcessorMixin

    original = ProcessorMixin.get_attributes.__func__
    if getattr(original, "_rlrun_images_only", False):
        return

    @functools.wraps(original)
    def get_attributes(cls: type) -> list[str]:
        return [a for a in original(cls) if a != VIDEO]

    get_attributes._rlrun_images_only = True  # type: ignore[attr-defined]
    ProcessorMixin.get_attributes = classmethod(get_attributes)


def image_patch_factor(image_patch_size: int | None) -> int:
    """Qwen-VL's resize unit: a patch times the 2x2 merge (verl passes the patch size)."""
    return (image_patch_size or 14) * 2


def fetch_image(part: dict[str, Any], image_patch_size: int | None) -> Any:
    """One image part of a message as ``qwen_vl_utils.fetch_image`` returns it for a PIL image:
    RGB, both sides a multiple of the resize unit, the pixels within the part's bounds."""
    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    image = part.get("image")
    if not isinstance(image, Image.Image):
        raise TypeError(f"an image part must hold a PIL image here, not {type(image).__name__}")
    factor = image_patch_factor(image_patch_size)
    min_pixels = int(part.get("min_pixels", 4 * factor * factor))
    max_pixels = int(part.get("max_pixels", 16384 * factor * factor))
    image = image.convert("RGB")
    height, width = smart_resize(image.height, image.width, factor, min_pixels, max_pixels)
    if (height, width) != (image.height, image.width):
        image = image.resize((width, height), Image.Resampling.BICUBIC)
    return image


def images_of(messages: list[dict[str, Any]], image_patch_size: int | None) -> list[Any]:
    return [
        fetch_image(part, image_patch_size)
        for message in messages
        if isinstance(message.get("content"), list)
        for part in message["content"]
        if isinstance(part, dict) and part.get("type") == "image"
    ]
