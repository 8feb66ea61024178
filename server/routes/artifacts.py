"""Compiled artifacts: compile a model (queued for a worker of the host class), list, show, download."""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import APIRouter, Header, Response, status
from fastapi.responses import FileResponse

from server import jobs, storage
from server.auth import CurrentTeam, SessionDep, SettingsDep
from server.models import UploadedModel
from server.params import Id
from server.schemas import ERROR_RESPONSES, ArtifactOut, CompileRequest, Conflict, Gone, error_responses

router = APIRouter(tags=["artifacts"], responses=ERROR_RESPONSES)


@router.post("/models/{model_id}/compile", status_code=status.HTTP_202_ACCEPTED, responses=error_responses(404, 503))
def compile_model(
    model_id: Id, who: CurrentTeam, settings: SettingsDep, body: CompileRequest | None = None
) -> ArtifactOut:
    """Queue a build of the model with the best schedules the records hold for the host class."""
    return jobs.request_compile(settings, who.team_id, model_id, body or CompileRequest())


@router.get("/artifacts")
def list_artifacts(who: CurrentTeam, session: SessionDep) -> list[ArtifactOut]:
    return jobs.list_artifacts(session, who.team_id)


@router.get("/artifacts/{artifact_id}", responses=error_responses(404))
def get_artifact(artifact_id: Id, who: CurrentTeam, session: SessionDep) -> ArtifactOut:
    return jobs.artifact_view(session, jobs.get_artifact(session, who.team_id, artifact_id))


@router.get(
    "/artifacts/{artifact_id}/download",
    response_class=FileResponse,
    responses={
        **error_responses(404, 409, 410),
        200: {"content": {"application/x-tar": {}}, "description": "the artifact (.tar)"},
        304: {},
    },
)
def download_artifact(
    artifact_id: Id,
    who: CurrentTeam,
    session: SessionDep,
    settings: SettingsDep,
    if_none_match: Annotated[str | None, Header()] = None,
) -> Response:
    """The .tar, with its sha256 in X-Checksum-SHA256 and as the ETag."""
    artifact = jobs.get_artifact(session, who.team_id, artifact_id)
    if artifact.state != "ready" or not artifact.path or not artifact.sha256:
        why = f": {artifact.error_message}" if artifact.error_message else ""
        raise Conflict(f"artifact {artifact_id} is {artifact.state}, not ready{why}", code="artifact_not_ready")
    path = storage.resolve(settings, artifact.path)
    if not path.is_file():
        raise Gone(f"artifact {artifact_id}'s file is gone from the server's storage; compile the model again")
    etag = f'"{artifact.sha256}"'
    headers = {"X-Checksum-SHA256": artifact.sha256, "ETag": etag}
    if if_none_match and etag in [t.strip() for t in if_none_match.split(",")]:
        return Response(status_code=status.HTTP_304_NOT_MODIFIED, headers=headers)
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", session.get_one(UploadedModel, artifact.model_id).name)
    return FileResponse(path, media_type="application/x-tar", filename=f"{name}-{artifact_id}.tar", headers=headers)
