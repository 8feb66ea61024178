"""The web dashboard: one static page, its stylesheet and ES modules (server/dashboard/static), served by the API
itself under `/` and `/static` so it works offline, with no build step and no CDN. The files are public; everything
they show comes from /api/v1 with the team token the page keeps in the browser's localStorage."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles
from starlette.responses import Response
from starlette.types import Scope

STATIC = Path(__file__).parent / "static"

# The page builds every element itself (no HTML from the server's strings) and loads only its own files: the policy
# makes the browser refuse anything else, an injected inline script or a stylesheet from elsewhere included.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
# revalidated on every load (a cheap 304 with the ETag), so a server upgrade never leaves a browser on old modules
NO_CACHE = {"Cache-Control": "no-cache"}


class _Assets(StaticFiles):
    """StaticFiles whose answers carry NO_CACHE."""

    def file_response(self, full_path, stat_result, scope: Scope, status_code: int = 200) -> Response:
        response = super().file_response(full_path, stat_result, scope, status_code)
        response.headers.update(NO_CACHE)
        return response


def mount(app: FastAPI) -> None:
    """`GET /` answers the page; `/static/...` its assets. Added after the API's routers, so /api/v1 and /docs keep
    their own routes."""
    app.mount("/static", _Assets(directory=STATIC), name="dashboard")

    @app.get("/", include_in_schema=False)
    def dashboard() -> FileResponse:
        return FileResponse(
            STATIC / "index.html",
            media_type="text/html",
            headers={**NO_CACHE, "Content-Security-Policy": CONTENT_SECURITY_POLICY},
        )
