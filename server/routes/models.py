"""A team's models: upload (multipart, streamed into storage), list, and one with its coverage on a host class."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response, status
from starlette.concurrency import run_in_threadpool

from server import archive, catalog, storage, trust, workloads
from server.auth import CurrentTeam, SessionDep, SettingsDep
from server.params import Id
from server.schemas import (
    ERROR_RESPONSES,
    PRINTABLE,
    CoverageMatrix,
    Invalid,
    ModelOut,
    Text,
    UploadedModelOut,
    error_responses,
    printable,
)

MAX_NAME = 128

router = APIRouter(tags=["models"], responses=ERROR_RESPONSES)

# the body is read by hand (streamed, stopped at the size limit), so FastAPI cannot describe it by itself
UPLOAD_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file"],
                    "properties": {
                        "file": {
                            "type": "string",
                            "format": "binary",
                            "description": "the .onnx model, or a .zip / .tar / .tar.gz archive of it and the "
                            "external data files it references",
                        },
                        "name": {
                            "type": "string",
                            "maxLength": MAX_NAME,
                            "pattern": PRINTABLE,
                            "description": "default: the file's name",
                        },
                        "input_shapes": {
                            "type": "string",
                            "description": 'static input shapes as a JSON object, e.g. {"input": [1, 3, 224, 224]}',
                        },
                    },
                }
            }
        },
    }
}


@router.post(
    "/models",
    status_code=status.HTTP_201_CREATED,
    openapi_extra=UPLOAD_BODY,
    responses={
        **error_responses(413),
        200: {"model": UploadedModelOut, "description": "These bytes were uploaded before"},
    },
)
async def upload_model(
    request: Request, response: Response, who: CurrentTeam, settings: SettingsDep
) -> UploadedModelOut:
    """Upload an ONNX model (multipart `file`, optional `name` and `input_shapes`): 201 when new, 200 with
    `duplicate` when the team had uploaded the same bytes; 413 over the size limit, 422 if it cannot compile (code
    over_budget past the service's model budget, TILEFARM_MAX_MODEL_*: a model of a few bytes can ask for gigabytes,
    which is a model the server will not process, not a request too large). A model with external data comes as an
    archive of it and its data files (server.archive checks and unpacks it)."""
    limit = settings.max_upload_bytes
    storage.check_length(request.headers, limit)
    upload = await storage.receive_multipart(settings, request.headers.get("content-type", ""), request.stream(), limit)
    try:
        shapes = catalog.parse_shapes(upload.fields.get("input_shapes"))
        name = upload.fields.get("name", "").strip() or archive.stem(upload.filename or "") or "model"
        try:  # a name is shown and stored, never a file name on disk (those are made from ids and hashes)
            printable(name)
        except ValueError as e:
            raise Invalid(f"name: {e}") from None
        if len(name) > MAX_NAME:
            raise Invalid(f"name: at most {MAX_NAME} characters, got {len(name)}")
        model, duplicate = await run_in_threadpool(
            catalog.register_model, settings, who.team_id, upload.file, name, shapes
        )
    finally:
        storage.discard(upload.file)
    if duplicate:
        response.status_code = status.HTTP_200_OK
    else:  # its workloads are known now: records imported for them before can be measured (server.trust)
        await run_in_threadpool(trust.request_verification, settings)
    return UploadedModelOut(**model.model_dump(), duplicate=duplicate)


@router.get("/models")
def list_models(who: CurrentTeam, session: SessionDep) -> list[ModelOut]:
    """The team's models, newest first (without coverage: ask for one model to get it)."""
    return catalog.list_models(session, who.team_id)


@router.get("/models/{model_id}", responses=error_responses(404))
def get_model(
    model_id: Id,
    who: CurrentTeam,
    session: SessionDep,
    settings: SettingsDep,
    host: Annotated[Text | None, Query(max_length=64, description="host fingerprint; default: the workers'")] = None,
) -> ModelOut:
    model = catalog.get_model(session, who.team_id, model_id)
    return catalog.model_view(session, settings, model, host)


@router.get("/coverage")
def coverage(
    who: CurrentTeam,
    session: SessionDep,
    settings: SettingsDep,
    target: Annotated[Text, Query(max_length=255, description="llvm (each host's CPU) or a full target name")] = "llvm",
) -> CoverageMatrix:
    """The team's models x every host class with records or workers: which tasks have an error-free record there."""
    return workloads.coverage_matrix(session, settings, who.team_id, target)
