"""The internal web dashboard: static files that read the same public API as curl and the CLI.

Its content security policy (scripts only from the service) is set for every answer by
``service.api.browser``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

from service.api.deps import ServicesDep
from service.metrics import keys
from service.notify.outbox import EVENT_TYPES
from service.operations.baseline import COMPARED
from service.store.status import TERMINAL, RunStatus

STATIC = Path(__file__).parent / "static"

router = APIRouter(include_in_schema=False)


@router.get("/")
def root() -> RedirectResponse:
    return RedirectResponse("/ui/")


@router.get("/ui/")
def index() -> FileResponse:
    return FileResponse(STATIC / "index.html")


@router.get("/ui/config")
def config(services: ServicesDep) -> dict[str, Any]:
    """What the page must know before its first call (no token needed): whether to offer a
    sign-in, and the service's words it shows (statuses, the reward and progress keys, the
    keys a run is compared with its baseline on, the events a webhook may hear)."""
    return {
        "auth": services.settings.auth_enabled,
        "statuses": [s.value for s in RunStatus],
        "terminal": sorted(s.value for s in TERMINAL),
        "reward_key": keys.REWARD_KEY,
        "reward_band_keys": [keys.REWARD_MAX_KEY, keys.REWARD_MIN_KEY],
        "step_key": keys.STEP_KEY,
        "baseline_keys": COMPARED,
        "webhook_events": list(EVENT_TYPES),
    }


def install(app: FastAPI) -> None:
    app.include_router(router)
    app.mount("/ui/static", StaticFiles(directory=STATIC), name="static")
