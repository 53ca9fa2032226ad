"""``GET /verl/versions``: the verl releases a spec may name in ``verl_version``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter

from service.api.auth import Viewer
from service.api.deps import ServicesDep
from service.recipes.verl import versions

router = APIRouter(tags=["verl"])


@router.get("/verl/versions")
def list_versions(services: ServicesDep, principal: Viewer) -> dict[str, Any]:
    """The installed verl (the default) and those added to the cache with `rlrun verl add`."""
    default = versions.installed()
    cached = versions.cached(Path(services.settings.verl_cache_dir))
    return {
        "default": default,
        "versions": [
            {
                "version": v,
                "default": v == default,
                "source": "cache" if v in cached else "installed",
            }
            for v in sorted({default, *cached})
        ],
    }
