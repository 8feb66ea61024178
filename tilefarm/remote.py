"""`tilefarm remote ...`: the REST client of a tilefarm service (`tilefarm serve`, or a team's farm).

    from tilefarm.remote import Client
    with Client("http://127.0.0.1:8000", token) as c:
        model = c.upload("model.onnx")
        job = c.wait_job(c.create_job(model["id"], trials=200)["id"])
        art = c.wait_artifact(c.compile(model["id"])["id"])
        c.download(art["id"], "model.tar")          # checked against the server's sha256

Every failed call raises `RemoteError` carrying the server's `detail` message (and its status and code)."""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from compiler.base.errors import TilefarmError

DEFAULT_SERVER = "http://127.0.0.1:8000"
TERMINAL_JOB = ("succeeded", "failed", "cancelled")
TERMINAL_ARTIFACT = ("ready", "failed")


class RemoteError(TilefarmError):
    """A call the service refused or could not answer; the message is the server's `detail`."""

    def __init__(self, message: str, status: int | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.code = status, code


def token_file(environ=os.environ) -> Path:
    """Where `tilefarm serve` writes the token of the team "default" ($XDG_DATA_HOME/tilefarm/token)."""
    from server.settings import data_dir

    return data_dir(environ) / "token"


def _error(response: httpx.Response) -> RemoteError:
    try:
        body = response.json()
        detail, code = body.get("detail"), body.get("code")
        if not isinstance(detail, str):  # a framework error the server did not reshape: say something readable
            detail = json.dumps(detail) if detail is not None else response.text
    except (ValueError, AttributeError):
        detail, code = response.text.strip() or response.reason_phrase, None
    return RemoteError(f"{detail} (HTTP {response.status_code})", response.status_code, code)


class Client:
    """One tilefarm service, as a team's token sees it: a method per REST route (prefix /api/v1)."""

    def __init__(self, server: str = DEFAULT_SERVER, token: str | None = None, timeout: float = 60.0):
        self.server = server.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=f"{self.server}/api/v1", headers=headers, timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _send(self, method: str, path: str, **kw) -> httpx.Response:
        try:
            r = self.http.request(method, path, **kw)
        except httpx.TransportError as e:
            raise RemoteError(f"cannot reach the tilefarm server at {self.server}: {e}") from None
        if r.status_code >= 400:
            raise _error(r)
        return r

    def _json(self, method: str, path: str, **kw) -> Any:
        r = self._send(method, path, **kw)
        return r.json() if r.content else None

    # -- service and team

    def health(self) -> dict:
        return self._json("GET", "/health")

    def me(self) -> dict:
        return self._json("GET", "/me")

    def tokens(self) -> list[dict]:
        return self._json("GET", "/tokens")

    def create_token(self, name: str, role: str = "member") -> dict:
        """A new token of this team (this needs an admin token): {id, name, prefix, role, token}; the token itself
        is shown only here. `role`: member (upload, tune, compile, read) or admin (also tokens and records import)."""
        return self._json("POST", "/tokens", json={"name": name, "role": role})

    def revoke_token(self, token_id: int) -> None:
        self._send("DELETE", f"/tokens/{token_id}")

    def workers(self) -> list[dict]:
        return self._json("GET", "/workers")

    # -- models

    def upload(self, path: str | Path, name: str | None = None, input_shapes: dict[str, list[int]] | None = None):
        """Upload an ONNX file; the model object has `duplicate: true` when the team had the same bytes already."""
        path = Path(path)
        if not path.is_file():
            raise RemoteError(f"no such model file: {path}")
        data: dict[str, str] = {"name": name or path.stem}
        if input_shapes:
            data["input_shapes"] = json.dumps(input_shapes)
        with path.open("rb") as f:
            return self._json("POST", "/models", files={"file": (path.name, f, "application/octet-stream")}, data=data)

    def models(self) -> list[dict]:
        return self._json("GET", "/models")

    def model(self, model_id: int, host: str | None = None) -> dict:
        return self._json("GET", f"/models/{model_id}", params={"host": host} if host else None)

    # -- tuning jobs

    def create_job(
        self,
        model_id: int,
        trials: int,
        time_budget_s: float | None = None,
        per_round: int = 64,
        seed: int = 0,
        target: str = "llvm",
        host: str | None = None,
    ) -> dict:
        body = {"model_id": model_id, "trials": trials, "time_budget_s": time_budget_s, "per_round": per_round}
        return self._json("POST", "/jobs", json={**body, "seed": seed, "target": target, "host": host})

    def jobs(self, state: str | None = None) -> list[dict]:
        return self._json("GET", "/jobs", params={"state": state} if state else None)

    def job(self, job_id: int) -> dict:
        return self._json("GET", f"/jobs/{job_id}")

    def progress(self, job_id: int, after: int = 0) -> dict:
        """{job, points}: the job and its curve points with id > `after`."""
        return self._json("GET", f"/jobs/{job_id}/progress", params={"after": after})

    def cancel(self, job_id: int) -> dict:
        return self._json("POST", f"/jobs/{job_id}/cancel")

    def resume(self, job_id: int) -> dict:
        return self._json("POST", f"/jobs/{job_id}/resume")

    def event_ticket(self, job_id: int) -> dict:
        """{ticket, expires_at}: opens the job's event stream as `?ticket=` for a minute, for a client that cannot
        send this token in a header (events() sends the header and needs none)."""
        return self._json("POST", f"/jobs/{job_id}/events/ticket")

    def events(self, job_id: int) -> Iterator[tuple[str, Any]]:
        """The job's server-sent events as (event, data) pairs: "progress" with the progress JSON on every change,
        then "end" once the job is terminal. The token goes in the header, as on every call, never in the URL."""
        # no read timeout: the server is silent while a round is being measured, which can take minutes
        timeout = httpx.Timeout(self.http.timeout.connect, read=None)
        try:
            with self.http.stream("GET", f"/jobs/{job_id}/events", timeout=timeout) as r:
                if r.status_code >= 400:
                    r.read()
                    raise _error(r)
                event, data = "message", list[str]()
                for line in r.iter_lines():
                    if not line:  # a blank line ends an event
                        if data:
                            text = "\n".join(data)
                            try:
                                payload = json.loads(text)
                            except ValueError:
                                payload = text
                            yield event, payload
                        event, data = "message", []
                    elif line.startswith(":"):
                        continue  # a comment: keep-alive
                    else:
                        field, _, value = line.partition(":")
                        value = value[1:] if value.startswith(" ") else value
                        if field == "event":
                            event = value
                        elif field == "data":
                            data.append(value)
        except httpx.TransportError as e:
            raise RemoteError(f"lost the event stream of job {job_id} from {self.server}: {e}") from None

    def wait_job(self, job_id: int, on_progress: Callable[[dict], None] | None = None, poll_s: float = 1.0) -> dict:
        """Follow a job until it is terminal, calling `on_progress(progress)` on every change; returns the job.
        Follows the event stream, and falls back to polling when the stream breaks."""
        progress: dict | None = None
        try:
            for event, data in self.events(job_id):
                if event == "progress" and isinstance(data, dict):
                    progress = data
                    if on_progress:
                        on_progress(data)
                if event == "end":
                    break
        except RemoteError as e:
            if e.status is not None:  # the server refused (unknown job, bad token): polling would too
                raise
        seen = progress["job"] if progress else None
        while True:
            job = self.job(job_id)
            if job["state"] in TERMINAL_JOB:
                if on_progress and job != seen:
                    on_progress({"job": job, "points": []})
                return job
            if on_progress and job != seen:
                on_progress({"job": job, "points": []})
                seen = job
            time.sleep(poll_s)

    # -- artifacts

    def compile(self, model_id: int, target: str = "llvm", host: str | None = None) -> dict:
        return self._json("POST", f"/models/{model_id}/compile", json={"target": target, "host": host})

    def artifacts(self) -> list[dict]:
        return self._json("GET", "/artifacts")

    def artifact(self, artifact_id: int) -> dict:
        return self._json("GET", f"/artifacts/{artifact_id}")

    def wait_artifact(self, artifact_id: int, poll_s: float = 0.5, timeout_s: float | None = None) -> dict:
        """Poll an artifact until it is ready or failed; returns it."""
        start = time.monotonic()
        while True:
            art = self.artifact(artifact_id)
            if art["state"] in TERMINAL_ARTIFACT:
                return art
            if timeout_s is not None and time.monotonic() - start > timeout_s:
                raise RemoteError(f"artifact {artifact_id} is still {art['state']} after {timeout_s:.0f} s")
            time.sleep(poll_s)

    def download(
        self, artifact_id: int, path: str | Path, progress: Callable[[int, int | None], None] | None = None
    ) -> dict:
        """Write an artifact's .tar to `path`; the bytes written must match the server's X-Checksum-SHA256, else they
        are deleted (`path` is only replaced by a download that matched) and RemoteError raised. `progress` is called
        with (bytes so far, total bytes or None) as they arrive. Returns {path, sha256, size_bytes}."""
        path = Path(path)
        part = path.with_name(path.name + ".part")
        digest, size = hashlib.sha256(), 0
        try:
            with self.http.stream("GET", f"/artifacts/{artifact_id}/download") as r:
                if r.status_code >= 400:
                    r.read()
                    raise _error(r)
                want = r.headers.get("X-Checksum-SHA256", "").lower()
                total = int(r.headers["Content-Length"]) if r.headers.get("Content-Length", "").isdigit() else None
                with part.open("wb") as f:
                    for chunk in r.iter_bytes():
                        f.write(chunk)
                        digest.update(chunk)
                        size += len(chunk)
                        if progress is not None:
                            progress(size, total)
        except httpx.TransportError as e:
            part.unlink(missing_ok=True)
            raise RemoteError(f"download of artifact {artifact_id} from {self.server} broke off: {e}") from None
        except BaseException:
            part.unlink(missing_ok=True)
            raise
        got = digest.hexdigest()
        if not want or got != want:
            part.unlink(missing_ok=True)
            why = f"announced sha256 {want}, the bytes hash to {got}" if want else "sent no X-Checksum-SHA256 header"
            raise RemoteError(f"artifact {artifact_id} failed its checksum ({why}); nothing was kept")
        part.replace(path)
        return {"path": str(path), "sha256": got, "size_bytes": size}

    # -- records (shared by every team)

    def records(self, workload: str | None = None, host: str | None = None, limit: int = 100, offset: int = 0):
        params: dict[str, Any] = {"limit": limit, "offset": offset}
        params.update({k: v for k, v in (("workload", workload), ("host", host)) if v})
        return self._json("GET", "/records", params=params)

    def export_records(self, path: str | Path, best_only: bool = False) -> int:
        """Write the service's records (JSON lines, `tilefarm records export`'s format) to `path`; returns lines."""
        path, lines = Path(path), 0
        try:
            with self.http.stream("GET", "/records/export", params={"best_only": str(best_only).lower()}) as r:
                if r.status_code >= 400:
                    r.read()
                    raise _error(r)
                with path.open("wb") as f:
                    for chunk in r.iter_bytes():
                        f.write(chunk)
                        lines += chunk.count(b"\n")
        except httpx.TransportError as e:
            raise RemoteError(f"records export from {self.server} broke off: {e}") from None
        return lines

    def import_records(self, path: str | Path) -> dict:
        """Add a JSON-lines records file to the service; {added}: records it did not hold yet."""
        path = Path(path)
        if not path.is_file():
            raise RemoteError(f"no such records file: {path}")
        with path.open("rb") as f:
            return self._json("POST", "/records/import", files={"file": (path.name, f, "application/x-ndjson")})


# ------------------------------------------------------------------------------------------------- the command


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None or not math.isfinite(seconds) else f"{seconds * 1e3:.4f}"


def job_table(job: dict) -> str:
    """The per-task table of a job's last round, as `tilefarm tune` prints it, and its estimated latency."""
    rows = [
        f"{'ID':>3} {'task':<28} {'MFLOP':>9} {'weight':>6} {'GFLOP/s':>8} {'latency ms':>10} "
        f"{'weighted ms':>11} {'trials':>6} {'done':>4}"
    ]
    for t in job.get("tasks") or []:
        gflops = t.get("gflops")
        rows.append(
            f"{t['position']:>3} {str(t['name'])[:28]:<28} {(t.get('flops') or 0) / 1e6:>9.2f} {t['weight']:>6} "
            f"{(f'{gflops:.2f}' if gflops is not None else '-'):>8} {_ms(t.get('latency_s')):>10} "
            f"{_ms(t.get('weighted_latency_s')):>11} {t.get('trials', 0):>6} {'yes' if t.get('done') else '':>4}"
        )
    est = job.get("estimated_latency_s")
    est_text = f"{est * 1e3:.3f} ms" if est is not None else "unknown (a task has no measured program yet)"
    rows.append(f"estimated end-to-end latency: {est_text}   trials: {job['trials_done']} of {job['trials']}")
    return "\n".join(rows)


def _job_line(job: dict) -> str:
    where = f" on {job['worker']}" if job.get("worker") else ""
    line = (
        f"job {job['id']} ({job.get('model_name') or 'model ' + str(job['model_id'])}): {job['state']}{where}, "
        f"{job['trials_done']}/{job['trials']} trials, {job.get('tuning_s') or 0:.1f} s tuning, "
        f"attempt {job['attempt']}"
    )
    return line + (f"\n  error: {job['error_message']}" if job.get("error_message") else "")


def _follow(client: Client, job_id: int) -> dict:
    """Print the table each time the job's trials move, the state line when it changes; returns the final job."""
    last: list[Any] = [None, None]

    def show(progress: dict) -> None:
        job = progress["job"]
        if job["state"] != last[0]:
            print(_job_line(job), flush=True)
        if job.get("tasks") and job["trials_done"] != last[1]:
            print(job_table(job), flush=True)
        last[:] = [job["state"], job["trials_done"]]

    job = client.wait_job(job_id, on_progress=show)
    return job


def _client(args: argparse.Namespace) -> Client:
    token = args.token or os.environ.get("TILEFARM_TOKEN")
    if not token:
        path = token_file()
        if path.exists():
            token = path.read_text().strip()
    if not token:
        raise SystemExit(
            "error: no token: pass --token, set TILEFARM_TOKEN, or run `tilefarm serve` on this machine once "
            f"(it writes {token_file()})"
        )
    return Client(args.server or os.environ.get("TILEFARM_SERVER") or DEFAULT_SERVER, token)


def _shapes(text: str | None) -> dict[str, list[int]] | None:
    from compiler.model.onnx_import import parse_input_shapes

    return parse_input_shapes(text) if text else None


def _model_line(m: dict) -> str:
    cov = m.get("coverage") or {}
    what = f"{len(m.get('tasks') or [])} tasks"
    if cov:
        what += f", {cov.get('tuned_tasks', 0)} tuned, {cov.get('trials_needed', 0)} trials still needed on this host"
    return f"model {m['id']} {m['name']} ({m['size_bytes']} bytes, sha256 {m['sha256'][:12]}): {what}"


def cmd_upload(args: argparse.Namespace) -> int:
    """Upload an ONNX model to the service; prints its id (the same bytes again give the same model)."""
    with _client(args) as c:
        m = c.upload(args.model, name=args.name, input_shapes=_shapes(args.input_shapes))
    print(("already uploaded: " if m.get("duplicate") else "uploaded ") + _model_line(m))
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    """Start a tuning job on the farm for an uploaded model id (or an .onnx file, uploaded first)."""
    if args.trials <= 0:
        raise SystemExit("error: --trials must be positive")
    with _client(args) as c:
        if args.model.isdigit() and not Path(args.model).exists():
            model_id = int(args.model)
        else:
            m = c.upload(args.model, input_shapes=_shapes(args.input_shapes))
            print(("already uploaded: " if m.get("duplicate") else "uploaded ") + _model_line(m))
            model_id = m["id"]
        job = c.create_job(model_id, args.trials, args.time_budget, args.per_round, args.seed)
        print(f"job {job['id']} queued: {job['trials']} trials on {job['host']} ({job['target']})")
        if not args.wait:
            print(f"  tilefarm remote status {job['id']} --follow")
            return 0
        job = _follow(c, job["id"])
    return 0 if job["state"] == "succeeded" else 1


def cmd_status(args: argparse.Namespace) -> int:
    """Show a job (its per-task table and estimated latency); --follow until it ends. Without an id: list jobs."""
    with _client(args) as c:
        if args.job is None:
            for job in c.jobs():
                print(_job_line(job))
            return 0
        if args.follow:
            job = _follow(c, args.job)
        else:
            job = c.job(args.job)
            print(_job_line(job))
            print(job_table(job))
    return 0 if job["state"] != "failed" else 1


def cmd_cancel(args: argparse.Namespace) -> int:
    """Cancel a queued or running job (a running one stops at the end of its current round)."""
    with _client(args) as c:
        print(_job_line(c.cancel(args.job)))
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    """Queue a failed or cancelled job again; it continues from the records it has, measuring nothing twice."""
    with _client(args) as c:
        print(_job_line(c.resume(args.job)))
    return 0


def _artifact_line(a: dict) -> str:
    line = f"artifact {a['id']} of model {a['model_id']} ({a.get('model_name') or ''}): {a['state']} for {a['target']}"
    if a["state"] == "ready":
        line += f", {a['size_bytes']} bytes, sha256 {a['sha256'][:12]}, {len(a.get('records_used') or [])} tuned tasks"
    return line + (f"\n  error: {a['error_message']}" if a.get("error_message") else "")


def cmd_compile(args: argparse.Namespace) -> int:
    """Compile an uploaded model on the farm with the best records there; --wait for it, -o to download it too."""
    with _client(args) as c:
        art = c.compile(args.model_id)
        print(_artifact_line(art))
        if not (args.wait or args.output):
            print(f"  tilefarm remote download {art['id']} -o model.tar")
            return 0
        art = c.wait_artifact(art["id"])
        print(_artifact_line(art))
        if art["state"] != "ready":
            return 1
        if args.output:
            from tilefarm.progress import download_progress

            with download_progress(f"artifact {art['id']}") as progress:
                got = c.download(art["id"], args.output, progress)
            print(f"downloaded {got['path']} ({got['size_bytes']} bytes, sha256 verified)")
    return 0


def cmd_download(args: argparse.Namespace) -> int:
    """Download a ready artifact (.tar), verifying its sha256."""
    from tilefarm.progress import download_progress

    with _client(args) as c, download_progress(f"artifact {args.artifact_id}") as progress:
        got = c.download(args.artifact_id, args.output, progress)
    print(f"downloaded artifact {args.artifact_id} -> {got['path']} ({got['size_bytes']} bytes, sha256 verified)")
    return 0


def cmd_workers(args: argparse.Namespace) -> int:
    """List the farm's workers: kind, host fingerprint, queues, liveness, measurements done."""
    with _client(args) as c:
        rows = c.workers()
    print(f"{'name':<32} {'kind':<6} {'host':<16} {'alive':<5} {'measured':>8}  current batch / queues")
    for w in rows:
        print(
            f"{w['name'][:32]:<32} {w['kind']:<6} {(w.get('fingerprint') or '-')[:16]:<16} "
            f"{'yes' if w['alive'] else 'no':<5} {w['measurements_done']:>8}  "
            f"{w.get('current_batch') or '-'} {','.join(w.get('queues') or [])}"
        )
    if not rows:
        print("no workers have registered yet")
    return 0


def cmd_records(args: argparse.Namespace) -> int:
    """Export the farm's records to a JSON-lines file, or import one (records already held are skipped)."""
    with _client(args) as c:
        if args.action == "export":
            n = c.export_records(args.output, best_only=args.best_only)
            print(f"exported {n} {'best ' if args.best_only else ''}records from {c.server} to {args.output}")
        else:
            added = c.import_records(args.file)["added"]
            print(f"imported {args.file} into {c.server}: {added} new records")
    return 0


def cmd_token(args: argparse.Namespace) -> int:
    """Create (shown once), list or revoke the team's API tokens (with an admin token)."""
    with _client(args) as c:
        if args.action == "create":
            t = c.create_token(args.name, args.role)
            print(t["token"])
            print(
                f"{t['role']} token {t['id']} ({t['name']}, {t['prefix']}...) created; it is shown only now",
                file=sys.stderr,
            )
        elif args.action == "list":
            for t in c.tokens():
                revoked = f"  revoked {t['revoked_at']}" if t.get("revoked_at") else ""
                head = f"{t['id']:>4} {t['name']:<24} {t['role']:<6} {t['prefix']}..."
                print(f"{head}  created {t['created_at']}{revoked}")
        else:
            c.revoke_token(args.id)
            print(f"token {args.id} revoked")
    return 0


def add_remote_parser(subparsers) -> None:
    """`tilefarm remote ...`: adds the parser; `args.func(args)` runs the command."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--server", help=f"service URL (default: TILEFARM_SERVER, else {DEFAULT_SERVER})")
    common.add_argument(
        "--token", help="API token (default: TILEFARM_TOKEN, else the token file `tilefarm serve` writes)"
    )
    r = subparsers.add_parser("remote", help="use a tilefarm service: upload, tune on the farm, compile, download")
    sub = r.add_subparsers(dest="remote_command", required=True)

    def cmd(name: str, fn: Callable[[argparse.Namespace], int]) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=fn.__doc__, parents=[common])
        p.set_defaults(func=fn)
        return p

    up = cmd("upload", cmd_upload)
    up.add_argument("model", help="an .onnx file")
    up.add_argument("--name", help="what to call it (default: the file name)")
    up.add_argument("--input-shapes", help='fix symbolic dims, e.g. "input:[1,3,224,224]"')
    t = cmd("tune", cmd_tune)
    t.add_argument("model", help="an uploaded model's id, or an .onnx file to upload first")
    t.add_argument("--input-shapes", help="with an .onnx file: fix symbolic dims")
    t.add_argument("--trials", type=int, required=True, help="measurement budget over all tasks")
    t.add_argument("--time-budget", type=float, help="stop after this many seconds of tuning")
    t.add_argument("--per-round", type=int, default=64, help="programs measured per round")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--wait", action="store_true", help="follow the job until it ends, printing the per-task table")
    s = cmd("status", cmd_status)
    s.add_argument("job", type=int, nargs="?", help="a job id (none: list the team's jobs)")
    s.add_argument("--follow", action="store_true", help="print the table as rounds finish, until the job ends")
    for name, fn in (("cancel", cmd_cancel), ("resume", cmd_resume)):
        cmd(name, fn).add_argument("job", type=int)
    c = cmd("compile", cmd_compile)
    c.add_argument("model_id", type=int)
    c.add_argument("--wait", action="store_true", help="wait until the artifact is ready")
    c.add_argument("-o", "--output", help="when ready, download it here (implies --wait)")
    d = cmd("download", cmd_download)
    d.add_argument("artifact_id", type=int)
    d.add_argument("-o", "--output", required=True, help="the .tar to write")
    cmd("workers", cmd_workers)
    rs = sub.add_parser("records", help=cmd_records.__doc__).add_subparsers(dest="action", required=True)
    ex = rs.add_parser("export", help="write the farm's records as JSON lines", parents=[common])
    ex.add_argument("-o", "--output", required=True)
    ex.add_argument("--best-only", action="store_true", help="only the fastest record per workload, target and host")
    im = rs.add_parser("import", help="add a JSON-lines records file to the farm", parents=[common])
    im.add_argument("file")
    tk = sub.add_parser("token", help=cmd_token.__doc__).add_subparsers(dest="action", required=True)
    tc = tk.add_parser("create", help="a new token of your team (printed once)", parents=[common])
    tc.add_argument("name")
    tc.add_argument(
        "--role",
        choices=("member", "admin"),
        default="member",
        help="member: upload, tune, compile, read; admin: also manage tokens and import records (default: member)",
    )
    tk.add_parser("list", help="the team's tokens", parents=[common])
    tv = tk.add_parser("revoke", help="revoke a token by id", parents=[common])
    tv.add_argument("id", type=int)
    for p in (ex, im):
        p.set_defaults(func=cmd_records)
    for p in (tc, tv, *[tk.choices["list"]]):
        p.set_defaults(func=cmd_token)


def main(argv: list[str] | None = None) -> int:
    """`tilefarm remote ...` alone (python -m tilefarm.remote), for use before the main command wires it in."""
    p = argparse.ArgumentParser(prog="tilefarm")
    add_remote_parser(p.add_subparsers(dest="command", required=True))
    args = p.parse_args(argv)
    try:
        return args.func(args)
    except TilefarmError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
