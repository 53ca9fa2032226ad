"""Liveness and readiness (the database and Ray reported apart) on the API's own port.

The same checks are answered on the probe listener (``probe_process``, ``RLRUN_PROBE_PORT``),
which a flood of API calls cannot delay: point an orchestrator's probes there.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from service.api.auth import CredentialsDep, resolve
from service.api.deps import Services, ServicesDep
from service.api.probe_process import readiness

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """Alive: answered on the event loop, never waiting for a worker thread or the database."""
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"description": "the database does not answer"}})
async def readyz(services: ServicesDep, credentials: CredentialsDep) -> JSONResponse:
    """Ready when the database answers. Errors and versions are shown to admins only; any
    caller, with a token or without, gets ``ok`` per check."""
    rays = {h.name: h.ray for h in services.clusters}
    admin = await _is_admin(services, credentials)
    ready, checks = await run_in_threadpool(readiness, services.db, rays, admin)
    return JSONResponse({"ready": ready, "checks": checks}, status_code=200 if ready else 503)


async def _is_admin(services: Services, credentials: CredentialsDep) -> bool:
    if services.settings.auth_enabled and credentials is None:
        return False
    try:
        return (await resolve(services, credentials, None)).at_least("admin")
    except Exception:
        # An unknown token, or the very database being checked: no details, and no failure.
        return False
