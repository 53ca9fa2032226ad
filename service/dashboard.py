"""The internal web dashboard: static files that read the same public API as curl and the CLI."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

STATIC = Path(__file__).parent / "static"

router = APIRouter(include_in_schema=False)

# Scripts only from the service itself (no inline script, no CDN); uPlot sets inline styles.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; "
    "frame-ancestors 'none'"
)


@router.get("/")
def root() -> RedirectResponse:
    return RedirectResponse("/ui/")


@router.get("/ui/")
def index() -> FileResponse:
    return FileResponse(STATIC / "index.html", headers={"Content-Security-Policy": CSP})


def install(app: FastAPI) -> None:
    app.include_router(router)
    app.mount("/ui/static", StaticFiles(directory=STATIC), name="static")
