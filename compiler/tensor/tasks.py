"""Task extraction: each fused group of the optimized graph becomes a ComputeDAG; identical ones are one task.

The model's execution plan is a list of steps in dependency order: a `Call` per fused group, naming its task and the
graph values it reads and writes in the order of the task's kernel parameters, and a `Control` per If or Loop node,
holding its subgraphs' own plans. `kernel_calls` lists every Call, subgraphs' too.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from compiler.base.errors import TilefarmError, UnsupportedOp
from compiler.base.target import DEFAULT_L3_BYTES
from compiler.model.fusion import Group, fuse
from compiler.model.graph import CONTROL_FLOW, Graph, Node, Value, node_subgraphs, subgraphs
from compiler.model.optimize import form_alternatives, optimize
from compiler.tensor import ops, te
from compiler.tensor.dag import ComputeDAG, topological_tensors


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
    nodes: tuple[str, ...] = ()  # the names of the graph nodes the call computes (its fused group's)


@dataclass
class Control:
    """An If or Loop node of the plan (its inputs and outputs are values of the enclosing graph) and the plans of its
    subgraphs (`graph.subgraphs` order: If: then, else; Loop: the body); or a Trap (no subgraph: it fails the run)."""

    node: Node
    blocks: tuple[list[Call | Control], ...]

    @property
    def graphs(self) -> list[Graph]:
        return node_subgraphs(self.node)

    @property
    def nodes(self) -> tuple[str, ...]:
        return (self.node.name,)


Step = Call | Control


def kernel_calls(steps: Sequence[Step]) -> list[Call]:
    """Every kernel call of a plan, those in If branches and Loop bodies too (each once, where it is written)."""
    out: list[Call] = []
    for s in steps:
        if isinstance(s, Call):
            out.append(s)
        else:
            out.extend(c for block in s.blocks for c in kernel_calls(block))
    return out


@dataclass
class FormChoice:
    """A conv that can be compiled in more than one form (passes.conv_forms): the task its fused group becomes in
    each form, the rule's first (`tasks[0]`: the task of the plan plan_tasks gives by default)."""

    node: str
    forms: tuple[int, ...]
    tasks: tuple[Task, ...]


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


def extract_tasks(optimized: Graph) -> tuple[list[Task], list[Step]]:
    """Fuse the optimized graph (model.optimize's result) into groups; returns the distinct tasks and the plan. A
    task's weight counts its calls per run, those in a Loop body of constant trip count that many times."""
    unsupported: dict[str, list[str]] = {}
    for g in _graphs(optimized):
        for n in g.nodes:
            if n.op not in ops.OPS and n.op not in (*CONTROL_FLOW, "Trap"):
                unsupported.setdefault(n.op, []).append(n.name)
    if unsupported:
        raise UnsupportedOp(unsupported)
    tasks: dict[str, Task] = {}
    steps = _extract(optimized, tasks, 1)
    return list(tasks.values()), steps


def _graphs(g: Graph) -> list[Graph]:
    """g and every graph nested in it."""
    return [g, *(inner for sub in subgraphs(g) for inner in _graphs(sub))]


def _extract(g: Graph, tasks: dict[str, Task], times: int) -> list[Step]:
    """The plan of one graph; `times`: how often a run calls it (a Loop body: the trip count when constant)."""
    steps: list[Step] = []
    for group in fuse(g):
        node = group.nodes[0]
        if node.op == "Trap":
            steps.append(Control(node, ()))
            continue
        if node.op == "If":
            steps.append(Control(node, tuple(_extract(b, tasks, times) for b in node.attrs["branches"])))
            continue
        if node.op == "Loop":
            trips = node.attrs["trips"] if node.attrs["trips"] is not None else 1
            steps.append(Control(node, (_extract(node.attrs["body"], tasks, times * max(1, trips)),)))
            continue
        dag, args = group_dag(group)
        key = dag.workload_key
        constants = tuple(i for i, v in enumerate(args[: len(dag.inputs)]) if v.const is not None)
        if key in tasks:
            t = tasks[key]
            t.weight += times
            t.constants = tuple(i for i in t.constants if i in constants)
        else:
            tasks[key] = Task(key, dag, _task_name(group), weight=times, constants=constants)
        steps.append(Call(tasks[key], args, tuple(n.name for n in group.nodes)))
    return steps


def plan_tasks(
    graph: Graph, disabled_passes: Collection[str] = (), forms: Mapping[str, int] | None = None
) -> tuple[list[Task], list[Step], Graph]:
    """The graph optimized (model.optimize, without `disabled_passes`; convs in the `forms` chosen by node name), then
    its tasks extracted: the distinct tasks, the plan and the optimized graph."""
    optimized = optimize(graph, disabled_passes, forms)
    return *extract_tasks(optimized), optimized


def form_choices(
    graph: Graph, tasks: list[Task], calls: list[Step], disabled_passes: Collection[str] = ()
) -> tuple[list[Task], list[FormChoice]]:
    """For the plan `plan_tasks(graph, disabled_passes)` gave (`tasks`, `calls`), every conv that has another
    form (passes.form_alternatives) with the tasks of both, and the tasks of the other forms that the plan lacks
    (to tune beside it; the plan calls them 0 times). A conv offers no choice where its fused group is the same task
    in both forms, takes other nodes in one of them, or is not called under its name."""
    alternatives = form_alternatives(graph, disabled_passes)
    if not alternatives:
        return [], []
    other_forms = {name: forms[1] for name, forms in alternatives.items()}
    _, other_calls, _ = plan_tasks(graph, disabled_passes, other_forms)
    by_node = [{name: c for c in kernel_calls(plan) for name in c.nodes} for plan in (calls, other_calls)]
    known = {t.key: t for t in tasks}
    extra: dict[str, Task] = {}
    choices = []
    for name, forms in alternatives.items():
        rule_call, other_call = (plan.get(name) for plan in by_node)
        # only where the form changes the conv's task and nothing around it: a WinogradConv's result stays blocked,
        # so at a model output its ReLU moves to the layout conversion's task, which tuning could not weigh
        if rule_call is None or other_call is None or set(rule_call.nodes) != set(other_call.nodes):
            continue
        rule, other = rule_call.task, other_call.task
        if rule.key == other.key:
            continue
        # a task the plan lacks is called 0 times by it: only in place of the rule's form, if compile picks it
        other = known.get(other.key) or extra.setdefault(other.key, replace(other, weight=0))
        choices.append(FormChoice(name, forms, (known[rule.key], other)))
    return list(extra.values()), choices


CONV_FORM_MODES = ("measure", "rule")  # tune convs' other forms too (form_choices), or only the rule's
WEIGHT_MODES = ("auto", "cold", "warm")  # how tuning times a model's weights (`weights_timed_cold`)

# compile leaves a conv's rule form only for one at least this much faster by the records. Closer than that is a tie
# that the next tuning run may settle the other way: ResNet-18's 7x7-stage conv tuned with the model timed F(2x2)
# within 0.3-2% of direct on a Zen 5, and tuned alone F(2x2) 6% faster at 1 thread but direct 22% faster at 2
# (bench/results/winograd-f2-7x7-cold-zen5-2026-11-26.txt); a tie goes to the rule
FORM_MARGIN = 0.03


def chosen_form(costs: Sequence[float]) -> int:
    """Which of a conv's forms compile takes, given each one's best cost (the rule's first; inf: none valid): the
    fastest if it beats the rule's by more than FORM_MARGIN, else the rule's (0)."""
    fastest = min(range(len(costs)), key=costs.__getitem__)
    return fastest if costs[fastest] < costs[0] * (1 - FORM_MARGIN) else 0


def chosen_cost(costs: Sequence[float]) -> float:
    """The cost of the form compile takes (chosen_form): what a conv with these forms' best costs adds to the model."""
    return costs[chosen_form(costs)]


@dataclass
class TuningPlan:
    """What tuning a model covers: the tasks of its plan and its calls (plan_tasks), and with conv forms measured
    the tasks of its convs' other forms (weight 0: the plan does not call them) with those convs' choices."""

    tasks: list[Task]
    calls: list[Step]
    other_forms: list[Task]
    choices: list[FormChoice]

    @property
    def all_tasks(self) -> list[Task]:
        """Every task to tune, the plan's first: the order of a model's task positions in the service."""
        return [*self.tasks, *self.other_forms]


def tuning_plan(graph: Graph, disabled_passes: Collection[str] = (), conv_forms: str = "measure") -> TuningPlan:
    """The tasks to tune for `graph`: its plan's, and with `conv_forms` "measure" its convs' other forms too
    (form_choices), so that compile can take each conv's faster form on the host the records come from."""
    if conv_forms not in CONV_FORM_MODES:
        raise ValueError(f"conv_forms: expected one of {', '.join(CONV_FORM_MODES)}, got {conv_forms!r}")
    tasks, calls, _ = plan_tasks(graph, disabled_passes)
    other_forms, choices = form_choices(graph, tasks, calls, disabled_passes) if conv_forms == "measure" else ([], [])
    return TuningPlan(tasks, calls, other_forms, choices)


def constant_bytes(calls: Sequence[Step]) -> int:
    """Bytes of the model's constants (weights, biases) that its kernel calls read, each counted once."""
    args = (v for c in kernel_calls(calls) for v in c.args)
    return sum(v.nbytes for v in {id(v): v for v in args if v.const is not None}.values())


def weights_arrive_cold(calls: Sequence[Step], l3_bytes: int | None) -> bool:
    """Whether a run of the model evicts each kernel's weights before its next call: its constants exceed the
    last-level cache, so every inference streams them from memory (ResNet-18: 46.8 MB against a 32 MB L3)."""
    return weights_exceed_cache(constant_bytes(calls), l3_bytes)


def weights_exceed_cache(weights_bytes: int, l3_bytes: int | None) -> bool:
    """weights_arrive_cold on a model's constant bytes (`constant_bytes`) already counted."""
    return weights_bytes > (l3_bytes or DEFAULT_L3_BYTES)


def _task_name(group: Group) -> str:
    ops_in = "_".join(dict.fromkeys(n.op.lower() for n in group.nodes))
    return f"fused_{ops_in}"[:60]
