"""Task extraction: each fused group of the optimized graph becomes a ComputeDAG; identical ones are one task.

The model's execution plan is a list of `Call`s, one per group in dependency order, each naming its task and the
graph values it reads and writes in the order of the task's kernel parameters.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass

from compiler import ops, te
from compiler.dag import ComputeDAG, topological_tensors
from compiler.errors import TilefarmError, UnsupportedOp
from compiler.graph import Graph, Value
from compiler.passes import Group, fuse, optimize
from compiler.target import DEFAULT_L3_BYTES


@dataclass
class Task:
    """One distinct kernel to compile (and tune): `weight` is how many times the model calls it."""

    key: str
    dag: ComputeDAG
    name: str
    weight: int = 1
    # positions of the DAG inputs that are the model's constants (weights, biases) in every call: in a model whose
    # weights exceed the last-level cache they arrive cold, which a measurement can reproduce (LocalRunner)
    constants: tuple[int, ...] = ()

    @property
    def flop_count(self) -> int:
        return self.dag.flop_count


@dataclass
class Call:
    task: Task
    args: list[Value]  # the kernel's parameters: the DAG's inputs, then its outputs


def _ident(name: str, taken: set[str]) -> str:
    base = re.sub(r"\W", "_", name) or "v"
    out, k = base, 0
    while out in taken:
        k += 1
        out = f"{base}_{k}"
    taken.add(out)
    return out


def group_dag(group: Group) -> tuple[ComputeDAG, list[Value]]:
    """The group's computation as a ComputeDAG, and the values bound to its parameters."""
    missing = sorted({n.op for n in group.nodes if n.op not in ops.OPS})
    if missing:
        raise UnsupportedOp({op: [n.name for n in group.nodes if n.op == op] for op in missing})
    taken: set[str] = set()
    tensors: dict[int, te.Tensor] = {}
    for v in group.inputs:
        tensors[id(v)] = te.placeholder(v.shape, v.dtype, _ident(v.name, taken))
    for node in group.nodes:
        prefix = _ident(node.name or node.op.lower(), taken)
        ins = [tensors[id(v)] if v is not None else None for v in node.inputs]
        outs = ops.OPS[node.op](ins, node.attrs, prefix)
        for v, t in zip(node.outputs, outs):
            if t.shape != v.shape or t.dtype != v.dtype:
                # the graph's inferred type and the op's compute definition must agree, or buffers are misplanned
                raise TilefarmError(
                    f"node {node.name or node.op} ({node.op}): the compute definition gives {t.dtype}{list(t.shape)} "
                    f"but the graph expects {v.type} for {v.name}"
                )
            tensors[id(v)] = t
    outputs = []
    for v in group.outputs:
        t = tensors[id(v)]
        if not isinstance(t.op, te.ComputeOp) or t in outputs:
            # an output that is an input (Identity-like ops) or listed twice still needs its own buffer
            t = te.compute(t.shape, lambda *i, t=t: t[i], name=_ident(f"{v.name}_copy", taken))
        outputs.append(t)
    read = {id(t) for t in topological_tensors(outputs)}
    inputs = [(v, tensors[id(v)]) for v in group.inputs if id(tensors[id(v)]) in read]
    dag = ComputeDAG([t for _, t in inputs] + outputs)
    by_name = {t.name: v for v, t in inputs}
    return dag, [by_name[n] for n in dag.inputs] + list(group.outputs)


def extract_tasks(graph: Graph, disabled_passes: Collection[str] = ()) -> tuple[list[Task], list[Call], Graph]:
    """Optimize (without `disabled_passes`, see passes.OPTIONAL_PASSES) and fuse the graph; returns the distinct
    tasks, the call plan and the optimized graph."""
    optimized = optimize(graph, disabled_passes)
    unsupported: dict[str, list[str]] = {}
    for n in optimized.nodes:
        if n.op not in ops.OPS:
            unsupported.setdefault(n.op, []).append(n.name)
    if unsupported:
        raise UnsupportedOp(unsupported)
    tasks: dict[str, Task] = {}
    calls: list[Call] = []
    for group in fuse(optimized):
        dag, args = group_dag(group)
        key = dag.workload_key
        constants = tuple(i for i, v in enumerate(args[: len(dag.inputs)]) if v.const is not None)
        if key in tasks:
            t = tasks[key]
            t.weight += 1
            t.constants = tuple(i for i in t.constants if i in constants)
        else:
            tasks[key] = Task(key, dag, _task_name(group), constants=constants)
        calls.append(Call(tasks[key], args))
    return list(tasks.values()), calls, optimized


WEIGHT_MODES = ("auto", "cold", "warm")  # how tuning times a model's weights (`weights_timed_cold`)


def constant_bytes(calls: list[Call]) -> int:
    """Bytes of the model's constants (weights, biases) that its kernel calls read, each counted once."""
    return sum(v.nbytes for v in {id(v): v for c in calls for v in c.args if v.const is not None}.values())


def weights_arrive_cold(calls: list[Call], l3_bytes: int | None) -> bool:
    """Whether a run of the model evicts each kernel's weights before its next call: its constants exceed the
    last-level cache, so every inference streams them from memory (ResNet-18: 46.8 MB against a 32 MB L3)."""
    return weights_exceed_cache(constant_bytes(calls), l3_bytes)


def weights_exceed_cache(weights_bytes: int, l3_bytes: int | None) -> bool:
    """weights_arrive_cold on a model's constant bytes (`constant_bytes`) already counted."""
    return weights_bytes > (l3_bytes or DEFAULT_L3_BYTES)


def weights_timed_cold(mode: str, calls: list[Call], l3_bytes: int | None) -> bool:
    """A WEIGHT_MODES choice made: "cold" and "warm" as said, "auto" cold exactly when `weights_arrive_cold`."""
    return mode == "cold" or (mode == "auto" and weights_arrive_cold(calls, l3_bytes))


def _task_name(group: Group) -> str:
    ops_in = "_".join(dict.fromkeys(n.op.lower() for n in group.nodes))
    return f"fused_{ops_in}"[:60]
