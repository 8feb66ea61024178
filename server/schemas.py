"""What the REST API takes and answers: Pydantic models, apart from the SQL models in server/models.py, and the
typed errors every route answers with (`{"detail": ..., "code": ...}`)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from compiler.base.errors import TilefarmError
from server.params import INT32_MAX


def as_utc(value: datetime) -> datetime:
    """SQLite gives back naive datetimes; every datetime the service stores is UTC."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


Timestamp = Annotated[datetime, AfterValidator(as_utc)]


def printable(text: str) -> str:
    """Text a client sends: no NUL or other control characters (PostgreSQL's text refuses NUL: a 500 where it
    reached the database)."""
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise ValueError("must not hold control characters (NUL included)")
    return text


# the same rule as a JSON-schema pattern, so the OpenAPI description says which strings are refused
PRINTABLE = r"^[^\x00-\x1f\x7f]*$"
Text = Annotated[str, AfterValidator(printable), Field(json_schema_extra={"pattern": PRINTABLE})]

# ---------------------------------------------------------------------------------------------- errors


class ErrorBody(BaseModel):
    detail: str
    code: str


class ApiError(TilefarmError):
    """An error the API answers with its own status and a slug clients can branch on."""

    status_code = 400
    code = "bad_request"

    def __init__(self, detail: str, *, code: str | None = None):
        super().__init__(detail)
        self.detail = detail
        if code is not None:
            self.code = code


class Unauthorized(ApiError):
    status_code, code = 401, "unauthorized"


class Forbidden(ApiError):
    status_code, code = 403, "forbidden"


class NotFound(ApiError):
    status_code, code = 404, "not_found"


class Conflict(ApiError):
    status_code, code = 409, "conflict"


class Gone(ApiError):
    status_code, code = 410, "gone"


class TooLarge(ApiError):
    status_code, code = 413, "too_large"


class Invalid(ApiError):
    status_code, code = 422, "invalid_request"


class TooMany(ApiError):
    status_code, code = 429, "too_many_requests"


class Unavailable(ApiError):
    status_code, code = 503, "unavailable"


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for the error statuses a route answers with."""
    return {status: {"model": ErrorBody} for status in statuses}


# on every authenticated route (a 422 of our own shape replaces FastAPI's default validation error schema)
ERROR_RESPONSES = error_responses(401, 422)

# ---------------------------------------------------------------------------------------------- health, tokens


class Health(BaseModel):
    status: str
    version: str
    database: str  # sqlite | postgresql
    broker: str  # embedded | redis


# admin: manages the team's tokens and imports records; member: uploads, tunes, compiles and reads
Role = Literal["admin", "member"]


class TokenRef(BaseModel):
    id: int
    name: str
    prefix: str
    role: Role


class Me(BaseModel):
    team: str
    token: TokenRef


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: Text = Field(min_length=1, max_length=64)
    role: Role = "member"


class TokenOut(TokenRef):
    created_at: Timestamp
    last_used_at: Timestamp | None
    revoked_at: Timestamp | None


class NewToken(TokenRef):
    token: str  # shown once: only its hash is stored


class EventTicket(BaseModel):
    ticket: str  # GET /jobs/{job_id}/events?ticket=...: this job only, until expires_at
    expires_at: Timestamp


# ---------------------------------------------------------------------------------------------- models


class ModelTaskOut(BaseModel):
    position: int
    name: str
    workload_key: str
    weight: int
    flops: int | None


class TaskCoverageOut(BaseModel):
    position: int
    records: int  # error-free records for this target and host class, counted up to the per-task budget
    best_latency_s: float | None  # the fastest of them that replays (what a compile would apply)
    trials_needed: int


class CoverageOut(BaseModel):
    host: str
    target: str
    tasks: list[TaskCoverageOut]
    trials_needed: int
    tuned_tasks: int


class ModelOut(BaseModel):
    id: int
    name: str
    sha256: str
    size_bytes: int
    input_shapes: dict[str, list[int]] | None
    created_at: Timestamp
    tasks: list[ModelTaskOut]
    coverage: CoverageOut | None  # None in listings: it costs a query per task


class UploadedModelOut(ModelOut):
    duplicate: bool  # the team had uploaded these very bytes before: this is that model


class CompileRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    target: Text = Field(default="llvm", max_length=255)
    host: Text | None = Field(default=None, max_length=64)


# ---------------------------------------------------------------------------------------------- jobs


JobState = Literal["queued", "running", "succeeded", "failed", "cancelled"]


class JobCreate(BaseModel):
    # strict: a JSON true or "8" is not the integer the schema says (lax mode took `"seed": false` as 0)
    model_config = ConfigDict(extra="forbid", strict=True)
    model_id: int = Field(ge=1, le=INT32_MAX)  # the models table's integer id (server.params)
    target: Text = Field(default="llvm", max_length=255)
    host: Text | None = Field(default=None, max_length=64, description="host fingerprint; default: the workers' one")
    trials: int = Field(gt=0, le=1_000_000)
    time_budget_s: float | None = Field(default=None, gt=0)
    per_round: int = Field(default=64, gt=0, le=4096)
    seed: int = Field(default=0, ge=0, lt=2**31)


class JobTaskRow(BaseModel):
    """A row of the per-task table a job's search writes after every round (missing values are None)."""

    model_config = ConfigDict(extra="ignore")
    position: int
    name: str | None = None
    flops: int | None = None
    weight: int | None = None
    gflops: float | None = None
    latency_s: float | None = None
    weighted_latency_s: float | None = None
    trials: int = 0
    done: bool = False


def target_kind(target: str) -> Literal["cpu", "gpu"]:
    """The hardware a target string is for: "gpu" for cuda ("cuda -arch=sm_90"), "cpu" for llvm."""
    words = target.split()
    return "gpu" if words and words[0].lower() == "cuda" else "cpu"


class JobOut(BaseModel):
    id: int
    model_id: int
    model_name: str
    state: str
    target: str
    target_kind: Literal["cpu", "gpu"]  # the hardware of its host class (target_kind)
    host: str
    trials: int
    trials_done: int
    time_budget_s: float | None
    per_round: int
    seed: int
    estimated_latency_s: float | None
    tuning_s: float
    error_message: str
    worker: str | None
    attempt: int
    cancel_requested: bool
    created_at: Timestamp
    started_at: Timestamp | None
    finished_at: Timestamp | None
    tasks: list[JobTaskRow]
    # what the trial budget leaves out (a budget too small to give every task its first round: said when the job is
    # created), or why a finished job has no estimate; None when there is nothing to say
    note: str | None = None


class PointOut(BaseModel):
    id: int
    trials: int
    elapsed_s: float
    estimated_latency_s: float | None
    task: int | None
    task_best: list[float | None] | None
    errors: dict[str, int] | None
    created_at: Timestamp


class Progress(BaseModel):
    job: JobOut
    points: list[PointOut]


ErrorGroup = Literal["build", "run", "timeout", "wrong_answer"]  # server.job_detail.ERROR_GROUPS maps codes to them
RecordFilter = Literal["build", "run", "timeout", "wrong_answer", "ok", "failed"]
RecordOrder = Literal["id", "-id", "latency"]


class JobRecordOut(BaseModel):
    """A record a job's measurement made; `task` is its position in the job's model."""

    id: int
    task: int | None
    task_name: str | None
    mean_cost: float | None  # seconds; None for a failed measurement
    cache: str  # the cache condition it was timed in: "warm", "cold-weights" or "flushed"
    error: str | None  # the stored code, e.g. "build_timeout"
    group: ErrorGroup | None  # the error's group in the breakdown
    error_message: str
    timestamp: float  # seconds since the epoch
    created_by: str | None
    build_seconds: float | None
    run_seconds: float | None


class JobRecordPage(BaseModel):
    total: int  # records that match the filters, on every page
    records: list[JobRecordOut]


class ErrorCounts(BaseModel):
    build: int = 0
    run: int = 0
    timeout: int = 0
    wrong_answer: int = 0


class JobErrorOut(BaseModel):
    record_id: int
    task: int | None
    error: str
    group: ErrorGroup
    error_message: str
    timestamp: float


class JobErrors(BaseModel):
    counts: ErrorCounts
    ok: int
    latest: list[JobErrorOut]  # newest first


class BatchOut(BaseModel):
    id: str
    task: int | None
    size: int
    queue: str
    worker: str | None
    state: str  # sent, running, done, lost, failed, cancelled (its job was cancelled before a worker started it)
    try_number: int
    errors: dict[str, Any] | None  # error code -> count when done; {"lost": why} or {"failure": why} otherwise
    sent_at: Timestamp
    started_at: Timestamp | None
    finished_at: Timestamp | None


class JobBatches(BaseModel):
    total: int  # the job's batches; `batches` holds the latest `limit` of them
    batches: list[BatchOut]  # by sent_at, oldest first


# ---------------------------------------------------------------------------------------------- artifacts


class ArtifactOut(BaseModel):
    id: int
    model_id: int
    model_name: str
    state: str
    target: str
    host: str
    sha256: str | None
    size_bytes: int | None
    records_used: list[dict[str, Any]] | None
    error_message: str
    created_at: Timestamp
    finished_at: Timestamp | None


# ---------------------------------------------------------------------------------------------- records, workers


class RecordOut(BaseModel):
    id: int
    workload_key: str
    target: str
    host: str
    mean_cost: float | None
    cache: str  # the cache condition it was timed in: "warm", "cold-weights" or "flushed"
    costs: list[float]
    error: str | None
    error_message: str
    timestamp: float
    created_by: str | None
    # false for an imported record a farm worker of its host class has not measured yet: only the team that imported
    # it (`imported_by`, a team id) compiles and tunes with it until then (server.trust)
    verified: bool
    imported_by: int | None


class RecordPage(BaseModel):
    total: int
    records: list[RecordOut]


class CoverageHost(BaseModel):
    fingerprint: str
    cpu_model: str | None
    kind: str | None
    alive_workers: int
    target: str | None  # the target its records are counted for (None: any llvm target, the CPU is not known)


class ModelCoverageRow(BaseModel):
    id: int
    name: str
    tasks: int
    tuned: list[int]  # per host (in `hosts` order): how many tasks have an error-free record
    task_tuned: list[list[bool]]  # per host, per task position


class CoverageMatrix(BaseModel):
    hosts: list[CoverageHost]
    models: list[ModelCoverageRow]


class WorkloadHostOut(BaseModel):
    host: str
    records: int
    best_latency_s: float | None  # of the fastest record the asking team may use: verified, or its own import
    best_record_id: int | None
    best_verified: bool | None  # false: the best is the asking team's own import, not measured by the farm yet
    unverified: int = 0  # imported records of the host class the farm has not measured yet (any team's)


class WorkloadOut(BaseModel):
    key: str
    op_tag: str | None
    flops: int | None
    shapes: Any | None  # {"inputs": [[...], ...], "outputs": [[...]]}
    records: int
    hosts: list[WorkloadHostOut]


class WorkloadPage(BaseModel):
    total: int
    workloads: list[WorkloadOut]


WorkloadOrder = Literal["records", "-records", "flops", "-flops"]


class ScheduleOut(BaseModel):
    record_id: int
    workload_key: str
    op_tag: str | None
    host: str
    target: str
    mean_cost: float | None
    steps: list[Any]  # the step records, ["SP", 2, 0, [8], true], ...
    loop_nest: str  # the lowered loop IR, printed
    verified: bool  # false: imported, its timing a claim until a farm worker of its host class has measured it
    imported_by: int | None  # the team id that imported it


class ImportResult(BaseModel):
    added: int  # new records, stored unverified (server.trust)
    # workloads of the file with no stored DAG (no uploaded model has them): their records' steps could not be replayed
    # nor their timings checked; the farm measures them once a model with the workload is uploaded
    unknown_workloads: list[str] = []


class GpuOut(BaseModel):
    """A GPU worker's GPU, as its driver reports it (compiler.targets.cuda.fingerprint.GpuFingerprint)."""

    name: str
    sm_count: int
    compute_capability: str  # "9.0"
    memory_bytes: int
    cuda_version: str  # the newest CUDA the driver supports
    driver_release: str  # "" where the driver did not say
    sm_clock_mhz: int
    memory_clock_mhz: int


class WorkerOut(BaseModel):
    name: str
    kind: str
    fingerprint: str | None
    gpu: GpuOut | None = None  # a GPU worker's GPU (kind "gpu")
    queues: list[str]
    hostname: str | None
    pid: int | None
    started_at: Timestamp
    last_heartbeat: Timestamp
    alive: bool
    state: Literal["alive", "lost", "stopped"]  # lost: not stopped, yet silent past TILEFARM_WORKER_GRACE_S
    measurements_done: int
    current_batch: str | None
    current_job: int | None  # the job of its current batch (or of the search it runs), if the caller's team's
    current_task: int | None  # that batch's task position
