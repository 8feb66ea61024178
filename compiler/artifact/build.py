"""Building artifacts: graph -> tasks -> scheduled kernels -> one shared library with an AOT entry point, the
weights embedded, a C header and meta.json, packed into a .tar (loaded by `compiler.artifact.runtime`)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import tempfile
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from compiler.base.errors import TilefarmError
from compiler.base.target import Target
from compiler.costs.records import CACHE_CONDITIONS, Database, best_replaying, cache_preference, target_name
from compiler.model.fusion import Group
from compiler.model.graph import Graph, Value
from compiler.model.memory_plan import plan_memory
from compiler.model.optimize import check_disabled
from compiler.schedule.lower import lower
from compiler.targets import backend_for, host_target
from compiler.tensor.tasks import Call, Task, chosen_form, constant_bytes, form_choices, plan_tasks


@dataclass
class BuildInfo:
    tasks: list[Task]
    calls: list[Call]
    forms: dict[str, int] = field(default_factory=dict)  # conv node -> its form, where records overrode the rule
    seconds: dict[str, float] = field(default_factory=dict)
    records_used: dict[str, dict] = field(default_factory=dict)  # task key -> the record applied


def _kernel_name(task: Task) -> str:
    return f"tf_{task.name}_{task.key[:8]}"


def _entry_source(
    graph: Graph,
    calls: list[Call],
    params: dict[int, int],
    offsets: dict[int, int],
    workspace: int,
    scratch: dict[str, int],
    scratch_at: int,
) -> str:
    """C for the AOT entry point: every kernel call in order, with pointers into inputs/outputs/params/workspace
    (and, for a kernel that takes one, its scratch buffer: the workspace from `scratch_at` on, shared by all)."""
    inputs = {id(v): i for i, v in enumerate(graph.inputs)}
    outputs = {id(v): i for i, v in enumerate(graph.outputs)}

    def ptr(v: Value) -> str:
        # a constant or an input that is also an output is read where it is, not from the output buffer, which the
        # entry fills with it only after the kernels ran
        if id(v) in params:
            return f"(void*)(tilefarm_params + {params[id(v)]})"
        if id(v) in inputs:
            return f"inputs[{inputs[id(v)]}]"
        if id(v) in outputs:
            return f"outputs[{outputs[id(v)]}]"
        return f"(void*)(ws + {offsets[id(v)]})"

    kernels = sorted({_kernel_name(c.task): len(c.args) + bool(scratch[_kernel_name(c.task)]) for c in calls}.items())
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
        name = _kernel_name(c.task)
        args = [ptr(v) for v in c.args] + ([f"(void*)(ws + {scratch_at})"] if scratch[name] else [])
        lines.append(f"    {name}({', '.join(args)});")
    written = {id(v) for c in calls for v in c.args[len(c.task.dag.inputs) :]}
    for i, v in enumerate(graph.outputs):  # outputs no kernel writes are copies of an input or a constant
        if id(v) not in written and (id(v) in inputs or id(v) in params):
            src = ptr(v)
            lines.append(f"    memcpy(outputs[{i}], {src}, {v.nbytes});")
    lines += ["    return 0;", "}"]
    return "\n".join(lines) + "\n"


def _where(v: Value, graph: Graph, params: dict[int, int], offsets: dict[int, int]) -> list:
    """Where a kernel argument lives, for profiling calls one by one: [kind, index or byte offset] (as the entry's
    `ptr` finds it: a constant or an input that is also an output where it is)."""
    if id(v) in params:
        return ["param", params[id(v)]]
    for kind, vs in (("input", graph.inputs), ("output", graph.outputs)):
        for i, x in enumerate(vs):
            if x is v:
                return [kind, i]
    return ["workspace", offsets[id(v)]]


def _header(graph: Graph, name: str) -> str:
    def describe(vs: list[Value]) -> str:
        # names are the model's own (any text): one holding "*/" must not end the comment early
        lines = (f" *   [{i}] {v.name.replace('*/', '* /')}: {v.dtype}{list(v.shape)}" for i, v in enumerate(vs))
        return "\n".join(lines)

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


def schedule_tasks(
    tasks: list[Task], database: Database | None, target: Target, prefer: Sequence[str] = CACHE_CONDITIONS
) -> tuple[list, dict[str, dict]]:
    """The best record per task when the database has one that replays (best_replaying), else the default
    schedule; returns the States and, per task key, the record used."""
    states, used = [], {}
    for t in tasks:
        found = best_replaying(t, database, target, prefer) if database is not None else None
        if found is None:
            states.append(backend_for(target).default_schedule(t.dag))
            continue
        rec, state = found
        used[t.key] = {
            "workload_key": t.key,
            "host": rec.host,
            "mean_seconds": rec.mean_cost,
            "cache": rec.cache,
            "timestamp": rec.timestamp,
            "version": rec.version,
        }
        states.append(state)
    return states, used


def choose_forms(
    graph: Graph,
    tasks: list[Task],
    calls: list[Call],
    database: Database,
    target: Target,
    prefer: Sequence[str] = CACHE_CONDITIONS,
    disabled_passes: Collection[str] = (),
) -> dict[str, int]:
    """The convs of the plan (`tasks`, `calls` from plan_tasks) to compile in their other form
    (tasks.form_choices), by node name: those where both forms' tasks have a record here that replays in the same
    cache condition (the first of `prefer` in which both have one) and the other form's is faster by more than
    tasks.FORM_MARGIN. The rest keep the rule's form, as without records. The choice is made per host by what was
    measured on it: which form is faster depends on the caches against the transformed weight and on the thread
    count."""
    _, choices = form_choices(graph, tasks, calls, disabled_passes)
    chosen = {}
    for c in choices:
        for cache in prefer:
            found = [best_replaying(t, database, target, (cache,)) for t in c.tasks]
            if all(found):
                form = chosen_form([rec.mean_cost for rec, _ in found])
                if form:
                    chosen[c.node] = c.forms[form]
                break
    return chosen


def _plan(graph: Graph, records: Database | None, host: Target, disabled_passes: Collection[str] = ()) -> tuple:
    """The tasks, call plan and optimized graph to compile, the convs' forms chosen by `records` (choose_forms) and
    the cache conditions whose records to apply, in order."""
    tasks, calls, optimized = plan_tasks(graph, disabled_passes)
    prefer = cache_preference(constant_bytes(calls), host)
    forms = choose_forms(graph, tasks, calls, records, host, prefer, disabled_passes) if records is not None else {}
    if forms:
        tasks, calls, optimized = plan_tasks(graph, disabled_passes, forms)
    return tasks, calls, optimized, forms, prefer


def build(
    graph: Graph,
    path: str | Path,
    name: str = "model",
    records: Database | None = None,
    disabled_passes: Collection[str] = (),
    target: Target | None = None,
) -> BuildInfo:
    """Compile `graph` into the artifact at `path` (a .tar) for `target` (default: this host), applying the best record
    per task from `records`; `disabled_passes` (of optimize.OPTIONAL_PASSES) are left out, as they were when the records
    were tuned."""
    t0 = time.perf_counter()
    disabled_passes = check_disabled(disabled_passes)
    host = target or host_target()
    backend = backend_for(host)
    tasks, calls, optimized, forms, prefer = _plan(graph, records, host, disabled_passes)
    t1 = time.perf_counter()
    states, used = schedule_tasks(tasks, records, host, prefer)
    funcs = [lower(st, _kernel_name(t)) for t, st in zip(tasks, states)]
    t2 = time.perf_counter()
    # the constants the kernels read, and the outputs folded to constants at compile time (the entry copies those)
    consts = {id(v): v for v in [*(v for c in calls for v in c.args), *optimized.outputs] if v.const is not None}
    blob, params = io.BytesIO(), {}
    for vid, v in consts.items():
        blob.write(b"\0" * (-blob.tell() % backend.alignment))
        params[vid] = blob.tell()
        blob.write(np.ascontiguousarray(v.const, dtype=v.dtype).tobytes())
    keep = {id(v) for v in optimized.inputs} | {id(v) for v in optimized.outputs} | set(params)
    groups = [Group([], list(c.args[: len(c.task.dag.inputs)]), list(c.args[len(c.task.dag.inputs) :])) for c in calls]
    offsets, planned = plan_memory(groups, keep)
    # kernels run one after another, so one scratch region past the planned values serves them all
    scratch = {f.name: backend.scratch_bytes(f) for f in funcs}
    workspace = planned + max(scratch.values(), default=0)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        entry = _entry_source(optimized, calls, params, offsets, workspace, scratch, planned)
        backend.link_artifact(funcs, entry, blob.getvalue(), tmp, name)
        t3 = time.perf_counter()
        (tmp / f"{name}.h").write_text(_header(optimized, name))
        files = [f"{name}.so", f"{name}.h"]
        target = host
        meta = {
            "name": name,
            "format": 1,
            "library": f"{name}.so",
            "header": f"{name}.h",
            "inputs": [{"name": v.name, "shape": list(v.shape), "dtype": v.dtype} for v in optimized.inputs],
            "outputs": [{"name": v.name, "shape": list(v.shape), "dtype": v.dtype} for v in optimized.outputs],
            "workspace_bytes": workspace,
            "params_bytes": len(blob.getvalue()),
            "target": {
                "name": target_name(target),
                "kind": target.kind,
                "mcpu": target.mcpu,
                "features": target.features,
            },
            "host": target.fingerprint(),
            "environment": dict(backend.library_env),
            "disabled_passes": list(disabled_passes),
            "conv_forms": forms,
            "tasks": [
                {"key": t.key, "name": t.name, "weight": t.weight, "flops": t.flop_count, "record": t.key in used}
                for t in tasks
            ],
            "records": list(used.values()),
            "calls": [
                {
                    "kernel": _kernel_name(c.task),
                    "task": c.task.key,
                    "args": [_where(v, optimized, params, offsets) for v in c.args]
                    + ([["workspace", planned]] if scratch[_kernel_name(c.task)] else []),
                }
                for c in calls
            ],
            "sha256": {f: hashlib.sha256((tmp / f).read_bytes()).hexdigest() for f in files},
        }
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        with tarfile.open(path, "w") as tar:
            for f in ["meta.json", *files]:
                tar.add(tmp / f, arcname=f)
    return BuildInfo(tasks, calls, forms, {"extract": t1 - t0, "lower": t2 - t1, "codegen": t3 - t2}, used)


def compile_model(
    model,
    output: str | Path,
    input_shapes: dict[str, list[int]] | None = None,
    name: str | None = None,
    records: Database | None = None,
    disabled_passes: Collection[str] = (),
) -> BuildInfo:
    """ONNX model (path, bytes or ModelProto) -> artifact at `output`, using the best of `records` per task, without
    `disabled_passes` (see `build`)."""
    from compiler.model.onnx_import import load

    graph = load(model, input_shapes)
    name = name or Path(output).stem.replace("-", "_").replace(".", "_") or "model"
    return build(graph, output, name=name, records=records, disabled_passes=disabled_passes)


def run_in_process(
    graph: Graph, inputs: dict[str, np.ndarray], records: Database | None = None
) -> dict[str, np.ndarray]:
    """Run a graph with JIT-compiled kernels and numpy buffers, no library or linker: the fast path for testing
    many small models (the conformance suite). Same tasks, schedules and call plan as `build`."""
    host = host_target()
    backend = backend_for(host)
    tasks, calls, optimized, _, prefer = _plan(graph, records, host)
    states, _ = schedule_tasks(tasks, records, host, prefer)
    funcs = [lower(st, _kernel_name(t)) for t, st in zip(tasks, states)]
    # a graph that folded to constants has no kernel to compile
    kernels = backend.compile_kernels(funcs) if funcs else {}
    arrays: dict[int, np.ndarray] = {}
    for v in optimized.inputs:
        if v.name not in inputs:
            raise TilefarmError(f"missing input {v.name!r}; the graph takes {[i.name for i in optimized.inputs]}")
        arrays[id(v)] = np.ascontiguousarray(inputs[v.name], dtype=v.dtype).reshape(v.shape)
    for c in calls:
        for v in c.args:
            if id(v) not in arrays:
                arrays[id(v)] = (
                    np.ascontiguousarray(v.const, v.dtype) if v.const is not None else np.empty(v.shape, v.dtype)
                )
        kernels[_kernel_name(c.task)](*(arrays[id(v)] for v in c.args))
    out = {}
    for v in optimized.outputs:
        a = arrays.get(id(v))
        # np.array, not ascontiguousarray: that one makes a scalar output 1-D
        out[v.name] = a.copy() if a is not None else np.array(v.const, v.dtype)
    return out
