"""Building artifacts: graph -> tasks -> scheduled kernels -> one shared library with an AOT entry point, the
weights embedded, a C header and meta.json, packed into a .tar (loaded by `compiler.artifact.runtime`)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import tempfile
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from compiler.artifact.entry import constants, entry_source, kernel_name, plan_layout
from compiler.base.errors import TilefarmError
from compiler.base.target import Target
from compiler.costs.records import (
    KERNEL_CONDITIONS,
    Database,
    best_replaying,
    cache_preference,
    judged_in_model,
    target_name,
)
from compiler.model.graph import Graph, Value
from compiler.model.optimize import check_disabled
from compiler.schedule.lower import lower
from compiler.targets import backend_for, host_target
from compiler.tensor.tasks import (
    Call,
    Control,
    Step,
    Task,
    chosen_form,
    constant_bytes,
    form_choices,
    kernel_calls,
    plan_tasks,
)


@dataclass
class BuildInfo:
    tasks: list[Task]
    calls: list[Step]
    forms: dict[str, int] = field(default_factory=dict)  # conv node -> its form, where records overrode the rule
    seconds: dict[str, float] = field(default_factory=dict)
    records_used: dict[str, dict] = field(default_factory=dict)  # task key -> the record applied


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
 * threads: set tilefarm_num_threads before calling (0 = all cores). Returns 0 on success.
 * an output whose leading dim is a bound (a loop's scan output the loop's condition may end early) holds
 * tilefarm_output_rows(workspace, k) rows after a run; for the others that is their leading dim. */
#ifndef TILEFARM_{name.upper()}_H
#define TILEFARM_{name.upper()}_H
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {{
#endif
extern int tilefarm_num_threads;
size_t tilefarm_workspace_bytes(void);
int64_t tilefarm_output_rows(const void* workspace, int output);
int tilefarm_run(void* const* inputs, void* const* outputs, void* workspace);
#ifdef __cplusplus
}}
#endif
#endif
"""


def schedule_tasks(
    tasks: list[Task], database: Database | None, target: Target, prefer: Sequence[str] = KERNEL_CONDITIONS
) -> tuple[list, dict[str, dict]]:
    """The best record per task when the database has one that replays (best_replaying; where the tuner timed it
    inside the model beside the default schedule, the faster of those in the run: judged_in_model), else the
    default schedule; returns the States and, per task key, the record used."""
    states, used = [], {}
    for t in tasks:
        found = None
        if database is not None:
            found = judged_in_model(t, database, target, best_replaying(t, database, target, prefer, others=True))
        if found is None:
            states.append(backend_for(target).default_schedule(t.dag, target))
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
    calls: list[Step],
    database: Database,
    target: Target,
    prefer: Sequence[str] = KERNEL_CONDITIONS,
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
    on_phase: Callable[[str], None] | None = None,
) -> BuildInfo:
    """Compile `graph` into the artifact at `path` (a .tar) for `target` (default: this host), applying the best record
    per task from `records`; `disabled_passes` (of optimize.OPTIONAL_PASSES) are left out, as they were when the records
    were tuned. `on_phase` is called with each phase's name as it starts (the command line shows them)."""
    phase = on_phase or (lambda name: None)
    t0 = time.perf_counter()
    phase("optimize the graph, plan the tasks")
    disabled_passes = check_disabled(disabled_passes)
    host = target or host_target()
    backend = backend_for(host)
    tasks, calls, optimized, forms, prefer = _plan(graph, records, host, disabled_passes)
    t1 = time.perf_counter()
    phase(f"schedule and lower {len(tasks)} kernels")
    states, used = schedule_tasks(tasks, records, host, prefer)
    funcs = [lower(st, kernel_name(t)) for t, st in zip(tasks, states)]
    t2 = time.perf_counter()
    phase("generate code and link")
    blob, params = io.BytesIO(), {}
    for v in constants(optimized, calls):
        blob.write(b"\0" * (-blob.tell() % backend.alignment))
        params[id(v)] = blob.tell()
        blob.write(np.ascontiguousarray(v.const, dtype=v.dtype).tobytes())
    layout = plan_layout(optimized, calls, params)
    # kernels run one after another, so one scratch region past the planned values serves them all
    scratch = {f.name: backend.scratch_bytes(f) for f in funcs}
    workspace = layout.size + max(scratch.values(), default=0)
    flat = kernel_calls(calls)
    arity = {kernel_name(c.task): len(c.args) + bool(scratch[kernel_name(c.task)]) for c in flat}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        entry = entry_source(optimized, calls, layout, arity, scratch, workspace)
        library = backend.link_artifact(funcs, entry, blob.getvalue(), tmp, name, target=host).name
        t3 = time.perf_counter()
        phase("pack the artifact")
        (tmp / f"{name}.h").write_text(_header(optimized, name))
        # a kind whose code is more than one library (a GPU's kernels, its weights) names its other files
        extra = getattr(backend, "artifact_files", None)
        files = [library, f"{name}.h", *(extra(tmp, name) if extra else [])]
        target = host
        meta = {
            "name": name,
            "format": 1,
            "library": library,
            "header": f"{name}.h",
            "inputs": [{"name": v.name, "shape": list(v.shape), "dtype": v.dtype} for v in optimized.inputs],
            "outputs": [
                {"name": v.name, "shape": list(v.shape), "dtype": v.dtype}
                | ({"length_at": layout.lengths[id(v)]} if id(v) in layout.lengths else {})
                for v in optimized.outputs
            ],
            "workspace_bytes": workspace,
            "errors": {str(code): reason for code, reason in layout.errors.items()},
            "params_bytes": len(blob.getvalue()),
            "target": {
                # a kind other than the CPU's names its targets its own way ("cuda -arch=sm_90")
                "name": getattr(backend, "target_name", target_name)(target),
                "kind": target.kind,
                "mcpu": target.mcpu,
                "features": target.features,
            },
            "requires": backend.runtime_requirements(target),  # checked by the loader: runtime.Artifact.load
            "host": target.fingerprint(),
            "environment": dict(backend.library_env),
            "disabled_passes": list(disabled_passes),
            "conv_forms": forms,
            "tasks": [
                {
                    "key": t.key,
                    "name": t.name,
                    "weight": t.weight,
                    "flops": t.flop_count,
                    "record": t.key in used,
                    # the program the kernel runs (the record's, or the default schedule's), as records hold steps
                    "steps": [step.record() for step in st.steps],
                }
                for t, st in zip(tasks, states)
            ],
            "records": list(used.values()),
            "calls": [
                {
                    "kernel": kernel_name(c.task),
                    "task": c.task.key,
                    "nodes": list(c.nodes),
                    "args": [list(layout.loc[id(v)]) for v in c.args]
                    + ([["workspace", layout.size]] if scratch[kernel_name(c.task)] else []),
                }
                for c in flat
            ],
        }
        # a kind whose library needs the finished plan (a GPU's host entry, launching the kernels) builds it now
        finish = getattr(backend, "finish_artifact", None)
        if finish:
            files += finish(tmp, name, meta, any(not isinstance(s, Call) for s in calls))
        meta["sha256"] = {f: hashlib.sha256((tmp / f).read_bytes()).hexdigest() for f in files}
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
    graph: Graph,
    inputs: dict[str, np.ndarray],
    records: Database | None = None,
    disabled_passes: Collection[str] = (),
) -> dict[str, np.ndarray]:
    """Run a graph with JIT-compiled kernels and numpy buffers, no library or linker: the fast path for testing
    many small models (the conformance suite). Same tasks, schedules and plan as `build` (`disabled_passes` as
    there); If and Loop run here in Python as the entry runs them in C."""
    host = host_target()
    backend = backend_for(host)
    tasks, calls, optimized, _, prefer = _plan(graph, records, host, check_disabled(disabled_passes))
    states, _ = schedule_tasks(tasks, records, host, prefer)
    funcs = [lower(st, kernel_name(t)) for t, st in zip(tasks, states)]
    # a graph that folded to constants has no kernel to compile
    kernels = backend.compile_kernels(funcs) if funcs else {}
    arrays: dict[int, np.ndarray] = {}
    for v in optimized.inputs:
        if v.name not in inputs:
            raise TilefarmError(f"missing input {v.name!r}; the graph takes {[i.name for i in optimized.inputs]}")
        arrays[id(v)] = np.ascontiguousarray(inputs[v.name], dtype=v.dtype).reshape(v.shape)
    lengths = _run_steps(calls, arrays, kernels)
    out = {v.name: np.array(_array(v, arrays), v.dtype) for v in optimized.outputs}
    for v in optimized.outputs:
        if id(v) in lengths:
            out[v.name] = out[v.name][: lengths[id(v)]]
    return out


def _array(v, arrays: dict[int, np.ndarray]) -> np.ndarray:
    if id(v) not in arrays:
        # np.array, not ascontiguousarray: that one makes a scalar 1-D
        arrays[id(v)] = np.array(v.const, v.dtype, order="C") if v.const is not None else np.empty(v.shape, v.dtype)
    return arrays[id(v)]


def _run_steps(steps: list[Step], arrays: dict[int, np.ndarray], kernels: dict) -> dict[int, int]:
    """Run a plan on numpy buffers (by value id); returns the length run of each bounded Loop scan output."""
    lengths = {}
    for s in steps:
        if isinstance(s, Call):
            kernels[kernel_name(s.task)](*(_array(v, arrays) for v in s.args))
        elif s.node.op == "Trap":
            raise TilefarmError(s.node.attrs["reason"])
        elif s.node.op == "If":
            k = 0 if _array(s.node.inputs[0], arrays).reshape(-1)[0] else 1
            graph, block = s.graphs[k], s.blocks[k]
            for v, outer in zip(graph.inputs, s.node.inputs[1:]):
                arrays[id(v)] = _array(outer, arrays)
            _run_steps(block, arrays, kernels)
            for v, out in zip(graph.outputs, s.node.outputs):
                arrays[id(out)] = _array(v, arrays).copy()
        else:
            lengths.update(_run_loop(s, arrays, kernels))
    return lengths


def _run_loop(s: Control, arrays: dict[int, np.ndarray], kernels: dict) -> dict[int, int]:
    node, (body,), (block,) = s.node, s.graphs, s.blocks
    carried = node.attrs["carried"]
    trips = int(_array(node.inputs[0], arrays).reshape(-1)[0]) if node.inputs[0] is not None else None
    cond = bool(_array(node.inputs[1], arrays).reshape(-1)[0]) if node.inputs[1] is not None else True
    state = [_array(v, arrays).copy() for v in node.inputs[2 : 2 + carried]]
    for v, outer in zip(body.inputs[2 + carried :], node.inputs[2 + carried :]):
        arrays[id(v)] = _array(outer, arrays)
    stacks = [_array(v, arrays) for v in node.outputs[carried:]]
    i = 0
    while (trips is None or i < trips) and cond:
        arrays[id(body.inputs[0])] = np.full(body.inputs[0].shape, i, np.int64)
        arrays[id(body.inputs[1])] = np.full(body.inputs[1].shape, cond, np.bool_)
        for v, a in zip(body.inputs[2 : 2 + carried], state):
            arrays[id(v)] = a
        _run_steps(block, arrays, kernels)
        results = [_array(v, arrays).copy() for v in body.outputs]
        cond, state = bool(results[0].reshape(-1)[0]), results[1 : 1 + carried]
        for stack, piece in zip(stacks, results[1 + carried :]):
            stack[i] = piece
        i += 1
    for v, a in zip(node.outputs[:carried], state):
        arrays[id(v)] = a
    return {id(v): i for v in node.outputs[carried:]} if node.attrs["bounded"] else {}
