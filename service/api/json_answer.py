"""An answer's document as the HTTP response, serialised once (``wire.documents.encode``)."""

from __future__ import annotations

from typing import Any

from fastapi import Response

from service.wire.documents import encode


def json_response(
    doc: Any, status_code: int = 200, headers: dict[str, str] | None = None
) -> Response:
    """``doc`` serialised once, by ``encode``."""
    return Response(encode(doc), status_code, headers, media_type="application/json")
