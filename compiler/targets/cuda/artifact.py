"""The CUDA part of an artifact: every kernel launch's PTX (and cubin, where ptxas is installed) under `kernels/`,
the weights (`params.bin`), and `<name>.launches.json`, which with meta.json's call plan (which kernel runs when, on
which buffers: inputs, outputs, weights and workspace offsets) says everything a host needs to run the model
through the driver API: per task kernel, its launches in order with grid, block, static shared memory, the
buffers each takes and whether it takes the kernel's workspace (its global intermediates, `workspace_bytes`)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from compiler.base.errors import InvalidTarget, MissingExtra
from compiler.schedule.loopir import Func
from compiler.targets.cuda.codegen import GpuArch, GpuProgram, compile_func
from compiler.targets.cuda.fingerprint import GpuFingerprint
from compiler.targets.cuda.ptx import assemble_program, find_ptxas

KERNELS_DIR = "kernels"
PARAMS_FILE = "params.bin"


def launches_file(name: str) -> str:
    return f"{name}.launches.json"


def have_ptxas() -> bool:
    try:
        find_ptxas()
    except MissingExtra:
        return False
    return True


def program_entry(program: GpuProgram, cubins: dict[str, dict]) -> dict:
    """The launches.json entry of one task kernel: its launches in order and its workspace's size."""
    return {
        "params": [b.name for b in program.params],
        "workspace_bytes": program.workspace_bytes,
        "launches": [
            {
                "name": k.name,
                "ptx": f"{KERNELS_DIR}/{k.name}.ptx",
                "grid": list(k.grid),
                "block": list(k.block),
                "shared_bytes": k.shared_bytes,
                "takes_workspace": k.takes_workspace,
            }
            | cubins.get(k.name, {})
            for k in program.kernels
        ],
    }


def write_kernels(funcs: Sequence[Func], params: bytes, folder: Path, name: str, arch: GpuArch) -> list[str]:
    """Compile every task kernel of `funcs` for `arch` and write the artifact's CUDA files into `folder`: PTX per
    launch, cubin per launch and ptxas's report where ptxas is installed, the weights and the launches file.
    Returns the files written, relative to `folder`, the launches file first."""
    (folder / KERNELS_DIR).mkdir(exist_ok=True)
    assemble = have_ptxas()
    written = []
    entries = {}
    for f in funcs:
        program = compile_func(f, arch)
        cubins: dict[str, dict] = {}
        for k in program.kernels:
            (folder / KERNELS_DIR / f"{k.name}.ptx").write_text(k.ptx)
            written.append(f"{KERNELS_DIR}/{k.name}.ptx")
        if assemble:
            for c in assemble_program(program):
                (folder / KERNELS_DIR / f"{c.kernel}.cubin").write_bytes(c.image)
                written.append(f"{KERNELS_DIR}/{c.kernel}.cubin")
                r = c.report
                cubins[c.kernel] = {
                    "cubin": f"{KERNELS_DIR}/{c.kernel}.cubin",
                    "ptxas": {"registers": r.registers, "shared_bytes": r.shared_bytes,
                              "spill_store_bytes": r.spill_store_bytes, "spill_load_bytes": r.spill_load_bytes},
                }  # fmt: skip
        entries[f.name] = program_entry(program, cubins)
    (folder / PARAMS_FILE).write_bytes(params)
    doc = {"arch": arch.name, "ptx_isa": arch.ptx_isa, "params": PARAMS_FILE, "kernels": entries}
    (folder / launches_file(name)).write_text(json.dumps(doc, indent=1))
    return [launches_file(name), PARAMS_FILE, *written]


def listed_files(folder: Path, name: str) -> list[str]:
    """The files the launches file in `folder` names (weights, each launch's PTX and cubin), relative to `folder`."""
    doc = json.loads((folder / launches_file(name)).read_text())
    launches = [launch for k in doc["kernels"].values() for launch in k["launches"]]
    return [doc["params"], *(launch[f] for launch in launches for f in ("ptx", "cubin") if f in launch)]


def tuned_for(records: Sequence[dict], n_tasks: int, gpus: Sequence[GpuFingerprint]) -> dict:
    """meta.json's "tuned_for": which GPU(s) timed the records the artifact applied (meta.json's "records", each
    naming its host class), each with its name, compute capability, SMs, CUDA and driver versions where it is one
    of `gpus` (this host's), else only its key; "untuned (no GPU)" where no record applied."""
    if not records:
        return {"summary": "untuned (no GPU): every kernel has its default GPU schedule", "gpus": []}
    known = {}
    for g in gpus:
        try:
            known[g.key()] = g
        except InvalidTarget:  # a GPU tilefarm has no code for timed nothing
            continue
    entries, said = [], []
    for host, n in Counter(r["host"] for r in records).items():
        g = known.get(host)
        if g is None:
            entries.append({"host": host, "tasks": n, "gpu": None})
            said.append(f"GPU {host} (not one of this host's: its name and driver are known where it runs)")
            continue
        entries.append(
            {
                "host": host,
                "tasks": n,
                "gpu": g.name,
                "compute_capability": list(g.compute_capability),
                "sm_count": g.sm_count,
                "cuda_version": g.cuda_version,
                "driver_release": g.driver_release,
            }
        )
        said.append(str(g))
    rest = n_tasks - len(records)
    summary = f"tuned on {'; '.join(said)}" + (f"; {rest} of {n_tasks} tasks untuned" if rest else "")
    return {"summary": summary, "gpus": entries}
