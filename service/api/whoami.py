"""``GET /whoami``: the caller as the service sees it (a page offers what its role may do)."""

from __future__ import annotations

from fastapi import APIRouter

from service.api.auth import Viewer
from service.api.deps import ServicesDep
from service.wire.admin import WhoAmIOut

router = APIRouter(tags=["auth"])


@router.get("/whoami", response_model=WhoAmIOut)
def whoami(services: ServicesDep, principal: Viewer) -> WhoAmIOut:
    """User, team and role of the token (open mode: an anonymous admin)."""
    return WhoAmIOut(
        user=principal.user,
        team=principal.team,
        role=principal.role,
        auth=services.settings.auth_enabled,
    )
