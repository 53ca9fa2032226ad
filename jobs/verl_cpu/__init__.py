"""verl 0.9.1 and vLLM 0.32 on CPU: the platform and shims a CPU run needs, outside verl's files.

Everything here is loaded through entry points (``pyproject.toml``): verl imports its
``verl.plugins`` at ``import verl`` (``plugin.load``), vLLM its ``vllm.general_plugins`` in every
engine process. Loading registers the ``cpu`` platform and the ``file`` checkpoint engine; the
shims that change verl's or vLLM's behaviour apply only when ``VERL_PLATFORM=cpu`` (``enabled``),
so an installed project never changes an accelerator run. See docs/guide/verl.md#cpu.
"""

from __future__ import annotations

import os

PLATFORM = "cpu"


def enabled() -> bool:
    return os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM
