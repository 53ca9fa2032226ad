"""Liveness and readiness (the database and Ray reported apart)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from sqlalchemy import text

from service.api.deps import ServicesDep
from service.cluster.ray_jobs import RayRejected, RayUnavailable

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """Alive: answered on the event loop, never waiting for a worker thread or the database."""
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"description": "the database does not answer"}})
def readyz(services: ServicesDep) -> JSONResponse:
    """Ready when the database answers: runs can be accepted (and queue) while Ray is away."""
    checks: dict[str, Any] = {}
    try:
        with services.db.read() as session:
            session.execute(text("SELECT 1"))
        checks["database"] = {"ok": True}
    except Exception as exc:
        checks["database"] = {"ok": False, "error": repr(exc)[:500]}
    try:
        checks["ray"] = {"ok": True, "version": services.ray.version().get("ray_version")}
    except (RayUnavailable, RayRejected) as exc:
        checks["ray"] = {"ok": False, "error": str(exc)[:500]}
    ready = checks["database"]["ok"]
    return JSONResponse({"ready": ready, "checks": checks}, status_code=200 if ready else 503)
