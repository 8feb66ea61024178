"""Artifacts: one .tar holding a shared library (every kernel, the weights, and an AOT entry point that runs the
whole graph in one native call over a planned workspace), its C header, and meta.json (inputs, outputs, target,
host, records used, sha256 of every file). Loading needs only ctypes and numpy.
"""

from __future__ import annotations

import ctypes
import hashlib
import io
import json
import os
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from compiler import codegen
from compiler.default_schedule import default_schedule
from compiler.errors import TilefarmError
from compiler.graph import Graph, Value
from compiler.lower import lower
from compiler.passes import Group, plan_memory
from compiler.target import Target
from compiler.tasks import Call, Task, extract_tasks

ALIGN = 64
C_TYPES = {
    "float32": "float",
    "float64": "double",
    "int64": "int64_t",
    "int32": "int32_t",
    "int8": "int8_t",
    "uint8": "uint8_t",
    "bool": "uint8_t",
}


class ArtifactError(TilefarmError):
    """An artifact that is missing a file, was tampered with, or was given the wrong inputs."""


@dataclass
class BuildInfo:
    tasks: list[Task]
    calls: list[Call]
    seconds: dict[str, float] = field(default_factory=dict)


def _kernel_name(task: Task) -> str:
    return f"tf_{task.name}_{task.key[:8]}"


def _nbytes(v: Value) -> int:
    return int(np.prod(v.shape, dtype=np.int64)) * np.dtype(v.dtype).itemsize


def _entry_source(
    graph: Graph, calls: list[Call], params: dict[int, int], offsets: dict[int, int], workspace: int
) -> str:
    """C for the AOT entry point: every kernel call in order, with pointers into inputs/outputs/params/workspace."""
    inputs = {id(v): i for i, v in enumerate(graph.inputs)}
    outputs = {id(v): i for i, v in enumerate(graph.outputs)}

    def ptr(v: Value) -> str:
        if id(v) in outputs:
            return f"outputs[{outputs[id(v)]}]"
        if id(v) in inputs:
            return f"inputs[{inputs[id(v)]}]"
        if id(v) in params:
            return f"(void*)(tilefarm_params + {params[id(v)]})"
        return f"(void*)(ws + {offsets[id(v)]})"

    kernels = sorted({_kernel_name(c.task): len(c.args) for c in calls}.items())
    lines = [
        "#include <stddef.h>",
        "#include <stdint.h>",
        "#include <string.h>",
        "extern const unsigned char tilefarm_params[];",
    ]
    lines += [f"void {name}({', '.join(['void*'] * n)});" for name, n in kernels]
    lines += [
        f"size_t tilefarm_workspace_bytes(void) {{ return {workspace}; }}",
        "int tilefarm_run(void* const* inputs, void* const* outputs, void* workspace) {",
        "    unsigned char* ws = (unsigned char*)workspace;",
        "    (void)ws; (void)inputs;",
    ]
    for c in calls:
        lines.append(f"    {_kernel_name(c.task)}({', '.join(ptr(v) for v in c.args)});")
    written = {id(v) for c in calls for v in c.args[len(c.task.dag.inputs) :]}
    for i, v in enumerate(graph.outputs):  # outputs no kernel writes are copies of an input or a constant
        if id(v) not in written and (id(v) in inputs or id(v) in params):
            src = f"inputs[{inputs[id(v)]}]" if id(v) in inputs else ptr(v)
            lines.append(f"    memcpy(outputs[{i}], {src}, {_nbytes(v)});")
    lines += ["    return 0;", "}"]
    return "\n".join(lines) + "\n"


def _header(graph: Graph, name: str) -> str:
    def describe(vs: list[Value]) -> str:
        return "\n".join(f" *   [{i}] {v.name}: {v.dtype}[{', '.join(map(str, v.shape))}]" for i, v in enumerate(vs))

    return f"""/* tilefarm artifact {name}: run the whole model with one call.
 * inputs (C-contiguous, in this order):
{describe(graph.inputs)}
 * outputs:
{describe(graph.outputs)}
 * workspace: tilefarm_workspace_bytes() bytes, 64-byte aligned, reusable across calls (not concurrently).
 * threads: set tilefarm_num_threads before calling (0 = all cores). Returns 0 on success. */
#ifndef TILEFARM_{name.upper()}_H
#define TILEFARM_{name.upper()}_H
#include <stddef.h>
#ifdef __cplusplus
extern "C" {{
#endif
extern int tilefarm_num_threads;
size_t tilefarm_workspace_bytes(void);
int tilefarm_run(void* const* inputs, void* const* outputs, void* workspace);
#ifdef __cplusplus
}}
#endif
#endif
"""


def build(graph: Graph, path: str | Path, name: str = "model", records: dict | None = None) -> BuildInfo:
    """Compile `graph` into the artifact at `path` (a .tar); `records` maps workload key -> State to use."""
    t0 = time.perf_counter()
    tasks, calls, optimized = extract_tasks(graph)
    t1 = time.perf_counter()
    records = records or {}
    funcs = [lower(records.get(t.key) or default_schedule(t.dag), _kernel_name(t)) for t in tasks]
    t2 = time.perf_counter()
    consts = {id(v): v for c in calls for v in c.args if v.const is not None}
    blob, params = io.BytesIO(), {}
    for vid, v in consts.items():
        blob.write(b"\0" * (-blob.tell() % ALIGN))
        params[vid] = blob.tell()
        blob.write(np.ascontiguousarray(v.const, dtype=v.dtype).tobytes())
    keep = {id(v) for v in optimized.inputs} | {id(v) for v in optimized.outputs} | set(params)
    groups = [Group([], list(c.args[: len(c.task.dag.inputs)]), list(c.args[len(c.task.dag.inputs) :])) for c in calls]
    offsets, workspace = plan_memory(groups, keep)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "params.bin").write_bytes(blob.getvalue() or b"\0")
        (tmp / "params.S").write_text(
            '.section .rodata\n.balign 64\n.globl tilefarm_params\ntilefarm_params:\n.incbin "params.bin"\n'
            '.section .note.GNU-stack,"",@progbits\n'
        )
        (tmp / "entry.c").write_text(_entry_source(optimized, calls, params, offsets, workspace))
        cwd = os.getcwd()
        os.chdir(tmp)  # .incbin resolves params.bin relative to the assembler's working directory
        try:
            codegen.emit_shared_library(funcs, tmp / f"{name}.so", extra_sources=[tmp / "entry.c", tmp / "params.S"])
        finally:
            os.chdir(cwd)
        t3 = time.perf_counter()
        (tmp / f"{name}.h").write_text(_header(optimized, name))
        files = [f"{name}.so", f"{name}.h"]
        target = Target.host()
        meta = {
            "name": name,
            "format": 1,
            "library": f"{name}.so",
            "header": f"{name}.h",
            "inputs": [{"name": v.name, "shape": list(v.shape), "dtype": v.dtype} for v in optimized.inputs],
            "outputs": [{"name": v.name, "shape": list(v.shape), "dtype": v.dtype} for v in optimized.outputs],
            "workspace_bytes": workspace,
            "params_bytes": len(blob.getvalue()),
            "target": {"kind": target.kind, "mcpu": target.mcpu, "features": target.features},
            "host": target.fingerprint(),
            "tasks": [
                {"key": t.key, "name": t.name, "weight": t.weight, "flops": t.flop_count, "record": t.key in records}
                for t in tasks
            ],
            "records": [t.key for t in tasks if t.key in records],
            "sha256": {f: hashlib.sha256((tmp / f).read_bytes()).hexdigest() for f in files},
        }
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        with tarfile.open(path, "w") as tar:
            for f in ["meta.json", *files]:
                tar.add(tmp / f, arcname=f)
    return BuildInfo(tasks, calls, {"extract": t1 - t0, "lower": t2 - t1, "codegen": t3 - t2})


class Artifact:
    """A compiled model: `Artifact.load(path).run({"x": array}) -> {"y": array}`."""

    def __init__(self, meta: dict, lib: ctypes.CDLL, tmpdir: tempfile.TemporaryDirectory):
        self.meta, self._lib, self._tmp = meta, lib, tmpdir
        self._lib.tilefarm_run.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        self._lib.tilefarm_run.restype = ctypes.c_int
        self._threads = ctypes.c_int.in_dll(lib, "tilefarm_num_threads")
        self._workspace = np.empty(max(1, meta["workspace_bytes"]) + ALIGN, np.uint8)

    @staticmethod
    def load(path: str | Path) -> Artifact:
        tmp = tempfile.TemporaryDirectory(prefix="tilefarm-")
        try:
            with tarfile.open(path) as tar:
                tar.extractall(tmp.name, filter="data")
        except (OSError, tarfile.TarError) as e:
            raise ArtifactError(f"cannot read artifact {path}: {e}") from None
        root = Path(tmp.name)
        try:
            meta = json.loads((root / "meta.json").read_text())
        except (OSError, ValueError) as e:
            raise ArtifactError(f"artifact {path} has no readable meta.json: {e}") from None
        for f, digest in meta["sha256"].items():
            if not (root / f).exists() or hashlib.sha256((root / f).read_bytes()).hexdigest() != digest:
                raise ArtifactError(f"artifact {path}: {f} is missing or does not match its sha256 in meta.json")
        return Artifact(meta, ctypes.CDLL(str(root / meta["library"])), tmp)

    @property
    def input_names(self) -> list[str]:
        return [i["name"] for i in self.meta["inputs"]]

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        args = []
        for spec in self.meta["inputs"]:
            if spec["name"] not in inputs:
                raise ArtifactError(f"missing input {spec['name']!r}; the model takes {self.input_names}")
            a = np.ascontiguousarray(inputs[spec["name"]], dtype=spec["dtype"])
            if list(a.shape) != spec["shape"]:
                raise ArtifactError(f"input {spec['name']!r} must have shape {spec['shape']}, got {list(a.shape)}")
            args.append(a)
        outs = [np.empty(o["shape"], o["dtype"]) for o in self.meta["outputs"]]
        self._threads.value = int(os.environ.get("TILEFARM_NUM_THREADS", "0") or 0)
        ins_p = (ctypes.c_void_p * max(1, len(args)))(*[a.ctypes.data for a in args])
        outs_p = (ctypes.c_void_p * max(1, len(outs)))(*[o.ctypes.data for o in outs])
        base = self._workspace.ctypes.data
        ws = base + (-base % ALIGN)
        rc = self._lib.tilefarm_run(ins_p, outs_p, ctypes.c_void_p(ws))
        if rc != 0:
            raise ArtifactError(f"tilefarm_run returned {rc}")
        return {o["name"]: a for o, a in zip(self.meta["outputs"], outs)}
