"""verl's ``cpu`` platform (``VERL_PLATFORM=cpu``): verl 0.9.1 knows nvidia, huawei and amd and
falls back to nvidia; this one puts every worker's tensors on the host and talks over gloo.

Ray still places verl's trainer and rollout workers on accelerator-like slots (one bundle per
worker, as on a device): ``RLRUN_CPU_DEVICE_RESOURCE`` names that logical Ray resource
(default ``GPU``; the embedded local head declares ``NPU``).
"""

from __future__ import annotations

import os
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psutil
import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry

from jobs.verl_cpu import PLATFORM

RESOURCE_ENV = "RLRUN_CPU_DEVICE_RESOURCE"


class DeviceId(str):
    """The current "device index" on CPU. verl passes it to ``.to()`` and ``device=`` (where
    torch reads an int as an accelerator index: "Cannot access accelerator device when none is
    available") and formats it into ``f"{device}:{id}"``: as a value it is ``"cpu"``, formatted
    it is ``0``."""

    def __new__(cls) -> DeviceId:
        return super().__new__(cls, "cpu")

    def __format__(self, spec: str) -> str:
        return format(0, spec)

    def __int__(self) -> int:
        return 0

    def __index__(self) -> int:
        return 0


def _zero(*_: Any, **__: Any) -> int:
    return 0


def _nothing(*_: Any, **__: Any) -> None:
    return None


def _mem_get_info(*_: Any) -> tuple[int, int]:
    vm = psutil.virtual_memory()
    return vm.available, vm.total


def _device_module() -> types.ModuleType:
    """``torch.cpu`` plus what verl asks of a device module that torch.cpu lacks (memory
    statistics and cache control are no-ops on the host)."""
    mod = types.ModuleType("rlrun_torch_cpu")
    for name in dir(torch.cpu):
        if not name.startswith("__"):
            setattr(mod, name, getattr(torch.cpu, name))
    for name in ("memory_allocated", "memory_reserved", "max_memory_allocated",
                 "max_memory_reserved"):  # fmt: skip
        setattr(mod, name, _zero)
    for name in ("empty_cache", "reset_peak_memory_stats", "ipc_collect", "set_device",
                 "set_per_process_memory_fraction"):  # fmt: skip
        setattr(mod, name, _nothing)
    mod.mem_get_info = _mem_get_info  # type: ignore[attr-defined]
    mod.current_device = DeviceId  # type: ignore[attr-defined]
    mod.get_device_name = lambda *_: "cpu"  # type: ignore[attr-defined]
    mod.device_count = lambda: 1  # type: ignore[attr-defined]
    mod.is_available = lambda: True  # type: ignore[attr-defined]
    mod.manual_seed = torch.manual_seed  # type: ignore[attr-defined]
    mod.manual_seed_all = torch.manual_seed  # type: ignore[attr-defined]
    mod.get_rng_state = torch.get_rng_state  # type: ignore[attr-defined]
    mod.set_rng_state = torch.set_rng_state  # type: ignore[attr-defined]
    return mod


_DEVICE_MODULE = _device_module()


@PlatformRegistry.register(platform=PLATFORM)
class PlatformCPU(PlatformBase):  # type: ignore[misc]
    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return _DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return False  # never auto-detected: only VERL_PLATFORM=cpu selects it

    def current_device(self) -> Any:
        return DeviceId()

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        pass

    def synchronize(self, device_index: int | None = None) -> None:
        pass

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        pass

    def empty_cache(self) -> None:
        pass

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"  # nothing reads it on CPU; Ray sets it empty

    @contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None:
        pass

    def profiler_stop(self) -> None:
        pass

    def ray_resource_name(self) -> str:
        return os.environ.get(RESOURCE_ENV, "GPU")

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None
