"""Service benchmark: how many status, progress and download requests the API answers, and how fast.

    python -m bench.service [--clients 50] [--seconds 30] [--json rows.json] [--workers 0]

Starts the real API (uvicorn in a subprocess on loopback, embedded settings: SQLite and the file-system broker in a
temporary folder), uploads tiny_cnn, creates a tuning job (it stays queued: no workers unless --workers) and puts a
ready artifact in place (built here with compiler.artifact.build into the service's storage, its row marked ready). Then
`--clients` concurrent clients (one asyncio loop, one connection each) cycle through GET job, GET job progress and
GET artifact download (every download's sha256 checked) for `--seconds`. Prints requests/s and p50/p99/max
latency per route, and errors, which must be 0 (the exit status is 1 otherwise). The server runs one uvicorn
worker process: on SQLite every read is a separate connection to one file, which is the embedded deployment's
ceiling; a farm puts PostgreSQL behind it. The load generator shares the machine with the server, so on a small
machine the figures are a floor, and the report says how many cores there were."""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx

from tilefarm.remote import Client
from tilefarm.serve import EmbeddedService

ROUTES = ("job", "progress", "download")


def _ready_artifact(environ: dict[str, str], artifact_id: int, onnx_path: Path) -> tuple[str, int]:
    """Build the model into the service's storage and mark artifact `artifact_id` ready, as a compile worker would;
    returns its sha256 and size."""
    from compiler.artifact.build import build
    from compiler.model.onnx_import import load
    from server.db import session_scope
    from server.models import ArtifactRow
    from server.settings import Settings

    settings = Settings.from_env(environ)
    path = settings.storage / "artifacts" / f"{artifact_id}.tar"
    path.parent.mkdir(parents=True, exist_ok=True)
    info = build(load(onnx_path), path, name="tiny_cnn")
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    with session_scope(settings) as session:
        row = session.get(ArtifactRow, artifact_id)
        assert row is not None
        row.state, row.path, row.sha256, row.size_bytes = "ready", str(path), digest, len(data)
        row.records_used, row.finished_at = list(info.records_used.values()), datetime.now(UTC)
    return digest, len(data)


async def _client(
    http: httpx.AsyncClient, job_id: int, artifact_id: int, sha: str, until: float, start: int, out: dict[str, dict]
) -> None:
    """One client: the routes in turn (starting at `start`, so the clients' mix is even at every moment)."""
    paths = {
        "job": f"/jobs/{job_id}",
        "progress": f"/jobs/{job_id}/progress",
        "download": f"/artifacts/{artifact_id}/download",
    }
    k = start
    while time.perf_counter() < until:
        route = ROUTES[k % len(ROUTES)]
        k += 1
        t = time.perf_counter()
        try:
            r = await http.get(paths[route])
            ok = r.status_code == 200 and (
                route != "download"
                or (hashlib.sha256(r.content).hexdigest() == sha and r.headers.get("X-Checksum-SHA256") == sha)
            )
            why = "" if ok else f"HTTP {r.status_code}" + ("" if r.status_code != 200 else " bad checksum")
        except httpx.HTTPError as e:
            ok, why = False, f"{type(e).__name__}: {e}"
        dt = time.perf_counter() - t
        out[route]["latencies"].append(dt)
        if not ok:
            out[route]["errors"].append(why)


async def _load(url: str, token: str, clients: int, seconds: float, job_id: int, artifact_id: int, sha: str):
    out: dict[str, dict[str, list]] = {r: {"latencies": [], "errors": []} for r in ROUTES}
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(
        base_url=f"{url}/api/v1", headers={"Authorization": f"Bearer {token}"}, limits=limits, timeout=60
    ) as http:
        await http.get(f"/jobs/{job_id}")  # connection warm-up, not counted
        t0 = time.perf_counter()
        until = t0 + seconds
        await asyncio.gather(*(_client(http, job_id, artifact_id, sha, until, i, out) for i in range(clients)))
        wall = time.perf_counter() - t0
    return out, wall


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.service", description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--workers", type=int, default=0, help="worker processes (0: the job stays queued)")
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args(argv)

    from tilefarm import examples

    with tempfile.TemporaryDirectory(prefix="tilefarm-bench-service-") as tmp:
        root = Path(tmp)
        environ = {k: v for k, v in os.environ.items() if not k.startswith("TILEFARM_")}
        environ.update(XDG_DATA_HOME=str(root / "data"), XDG_CACHE_HOME=str(root / "cache"))
        onnx_path = root / "tiny_cnn.onnx"
        examples.save("tiny_cnn", onnx_path)
        with EmbeddedService(environ, workers=args.workers, log_dir=root / "logs", prefix="bench") as svc:
            assert svc.token is not None
            with Client(svc.url, svc.token) as c:
                health = c.health()
                model = c.upload(onnx_path)
                job = c.create_job(model["id"], trials=64)
                art = c.compile(model["id"])
            sha, size = _ready_artifact(environ, art["id"], onnx_path)
            print(
                f"server {svc.url}: 1 uvicorn worker process, database {health['database']}, broker "
                f"{health['broker']}; {os.cpu_count()} cores shared with the load generator; job {job['id']}, "
                f"artifact {art['id']} ready; {args.clients} clients for {args.seconds:.0f} s",
                flush=True,
            )
            out, wall = asyncio.run(_load(svc.url, svc.token, args.clients, args.seconds, job["id"], art["id"], sha))
    rows = []
    common = {
        "clients": args.clients,
        "seconds": round(wall, 2),
        "uvicorn_workers": 1,
        "database": health["database"],
        "broker": health["broker"],
        "cores": os.cpu_count(),
    }
    every = [x for r in ROUTES for x in out[r]["latencies"]]
    print(f"{'route':<10} {'requests':>8} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'errors':>6}")
    for route, lat, errs in [*((r, out[r]["latencies"], out[r]["errors"]) for r in ROUTES), ("all", every, None)]:
        errors = errs if errs is not None else [e for r in ROUTES for e in out[r]["errors"]]
        row = {
            "route": route,
            **common,
            "requests": len(lat),
            "requests_per_s": round(len(lat) / wall, 1),
            "p50_ms": round(_pct(lat, 0.50) * 1e3, 2),
            "p99_ms": round(_pct(lat, 0.99) * 1e3, 2),
            "max_ms": round(max(lat, default=float("nan")) * 1e3, 2),
            "mean_ms": round(statistics.fmean(lat) * 1e3, 2) if lat else None,
            "errors": len(errors),
        }
        if route == "download":
            row["artifact_bytes"] = size
        rows.append(row)
        print(
            f"{route:<10} {row['requests']:>8} {row['requests_per_s']:>8} {row['p50_ms']:>8} {row['p99_ms']:>8} "
            f"{row['max_ms']:>8} {row['errors']:>6}"
        )
        for e in sorted(set(errors))[:5]:
            print(f"  {errors.count(e)} x {e}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 1 if rows[-1]["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
