"""verl's dataset for image prompts on a stack without torchvision (``jobs.verl_cpu.vision``):
``data.custom_cls.path=pkg://jobs.verl_cpu.vl_dataset``, ``data.custom_cls.name=ImageDataset``."""

from __future__ import annotations

from typing import Any

from verl.utils.dataset.rl_dataset import RLHFDataset

from jobs.verl_cpu.vision import images_of


class ImageDataset(RLHFDataset):  # type: ignore[misc]
    """verl's ``RLHFDataset`` whose images are taken without ``qwen_vl_utils`` (images only: a
    video part is refused)."""

    @classmethod
    def _process_multi_modal_info(
        cls, messages: list[dict[str, Any]], image_patch_size: int | None, config: Any
    ) -> tuple[list[Any] | None, None, Any]:
        for message in messages:
            content = message.get("content")
            if isinstance(content, list) and any(
                isinstance(p, dict) and p.get("type") == "video" for p in content
            ):
                raise ValueError("video parts need qwen_vl_utils and torchvision")
        images = images_of(messages, image_patch_size)
        return images or None, None, cls._extract_audio_info(messages)

    @classmethod
    async def process_vision_info(
        cls, messages: list[dict[str, Any]], image_patch_size: int | None, config: Any
    ) -> tuple[list[Any], list[Any]]:
        images, _, _ = cls._process_multi_modal_info(messages, image_patch_size, config)
        return images or [], []
