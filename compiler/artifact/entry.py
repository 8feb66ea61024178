"""The artifact's entry point: where every value of the plan lives, and the C function that runs the plan.

A value lives in one of four places (a `Loc`): a model input or output buffer, the embedded constants, or the
workspace at a byte offset. Each graph's values passed between its steps are planned by `plan_memory`; an If branch's
inputs are the If's inputs where they are, and its outputs are written straight into the If's outputs; a Loop body
gets its own slots for its formal inputs (iteration number, condition, loop-carried values) and for each of its
outputs, which the entry copies back into the carried inputs (and into the scan outputs, one slice per iteration)
after each iteration. Sibling branches share their region of the workspace; nested ones follow their parent's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from compiler.model.fusion import Group
from compiler.model.graph import Graph, Value
from compiler.model.memory_plan import plan_memory
from compiler.tensor.tasks import Call, Control, Step, Task

Loc = tuple[str, int]  # ("input" | "output" | "param" | "workspace", index or byte offset)
ALIGN = 64
TRAP_CODES = 16  # tilefarm_run returns 0 on success, and 16, 17, ... where it took a Trap (meta.json's "errors")


def _rounded(n: int) -> int:
    return -(-max(n, 1) // ALIGN) * ALIGN


@dataclass
class Layout:
    loc: dict[int, Loc]  # value id -> where it lives
    size: int = 0  # workspace bytes the values take (kernels' scratch goes after)
    slots: dict[int, list[Loc]] = field(default_factory=dict)  # Loop node id -> a slot per body output
    lengths: dict[int, int] = field(default_factory=dict)  # bounded scan output's value id -> its int64 length slot
    traps: dict[int, int] = field(default_factory=dict)  # Trap node id -> the code tilefarm_run returns there
    errors: dict[int, str] = field(default_factory=dict)  # that code -> the Trap's reason


def constants(graph: Graph, steps: Sequence[Step]) -> list[Value]:
    """The constants the entry reads: kernel arguments, control-flow nodes' inputs, and outputs of the graph or of a
    subgraph folded to constants (the entry copies those), each once."""
    found = [*graph.outputs]
    for s in steps:
        if isinstance(s, Call):
            found += s.args
        else:
            found += [v for v in s.node.inputs if v is not None]
            for sub, block in zip(s.graphs, s.blocks):
                found += constants(sub, block)
    return list({id(v): v for v in found if v.const is not None}.values())


def plan_layout(graph: Graph, steps: Sequence[Step], params: dict[int, int]) -> Layout:
    """Where each value of `graph`'s plan lives; `params`: the constants' offsets in the embedded blob. A constant or
    an input that is also an output lives where it is (the entry copies it into the output last)."""
    loc: dict[int, Loc] = {vid: ("param", off) for vid, off in params.items()}
    for kind, values in (("input", graph.inputs), ("output", graph.outputs)):
        for i, v in enumerate(values):
            loc.setdefault(id(v), (kind, i))
    layout = Layout(loc)
    end = _plan_block(layout, steps, 0)
    outputs = {id(v) for v in graph.outputs}
    for s in steps:  # the length run of each scan output a loop's condition may end early
        if isinstance(s, Control) and s.node.op == "Loop" and s.node.attrs["bounded"]:
            for v in s.node.outputs[s.node.attrs["carried"] :]:
                if id(v) in outputs:
                    layout.lengths[id(v)], end = end, end + ALIGN
    layout.size = end
    return layout


def _plan_block(layout: Layout, steps: Sequence[Step], base: int) -> int:
    """Place the values one graph's steps pass between them from `base` on, then its subgraphs' after them; returns
    the end of the region used."""
    groups = []
    for s in steps:
        if isinstance(s, Call):
            n = len(s.task.dag.inputs)
            groups.append(Group([], list(s.args[:n]), list(s.args[n:])))
        else:
            groups.append(Group([], [v for v in s.node.inputs if v is not None], list(s.node.outputs)))
    offsets, size = plan_memory(groups, set(layout.loc), ALIGN)
    layout.loc.update({vid: ("workspace", base + off) for vid, off in offsets.items()})
    end = base + size
    for s in steps:
        if isinstance(s, Control) and s.node.op == "Trap":
            code = layout.traps[id(s.node)] = TRAP_CODES + len(layout.traps)
            layout.errors[code] = s.node.attrs["reason"]
        elif isinstance(s, Control):
            end = (_plan_if if s.node.op == "If" else _plan_loop)(layout, s, end)
    return end


def _bind(layout: Layout, values: Sequence[Value], to: Sequence[Value | None]) -> None:
    for v, outer in zip(values, to):
        if outer is not None:
            layout.loc.setdefault(id(v), layout.loc[id(outer)])


def _plan_if(layout: Layout, s: Control, base: int) -> int:
    ends = [base]
    for graph, block in zip(s.graphs, s.blocks):
        _bind(layout, graph.inputs, s.node.inputs[1:])
        for v, out in zip(graph.outputs, s.node.outputs):  # a branch writes straight into the If's outputs
            if v.const is None:
                layout.loc.setdefault(id(v), layout.loc[id(out)])
        ends.append(_plan_block(layout, block, base))
    return max(ends)


def _plan_loop(layout: Layout, s: Control, base: int) -> int:
    (body,), (block,) = s.graphs, s.blocks
    formals = 2 + s.node.attrs["carried"]
    for v in body.inputs[:formals]:
        layout.loc[id(v)], base = ("workspace", base), base + _rounded(v.nbytes)
    _bind(layout, body.inputs[formals:], s.node.inputs[formals:])
    slots = []
    for v in body.outputs:
        slots.append(("workspace", base))
        base += _rounded(v.nbytes)
        if v.const is None:
            layout.loc.setdefault(id(v), slots[-1])
    layout.slots[id(s.node)] = slots
    return _plan_block(layout, block, base)


# ---------------------------------------------------------------------------------------------- C


def kernel_name(task: Task) -> str:
    return f"tf_{task.name}_{task.key[:8]}"


def _ptr(loc: Loc) -> str:
    kind, at = loc
    if kind == "param":
        return f"(void*)(tilefarm_params + {at})"
    if kind == "workspace":
        return f"(void*)(ws + {at})"
    return f"{kind}s[{at}]"


class _Emitter:
    def __init__(self, layout: Layout, scratch: dict[str, int], scratch_at: int):
        self.layout, self.scratch, self.scratch_at = layout, scratch, scratch_at
        self.lines: list[str] = []

    def ptr(self, v: Value) -> str:
        return _ptr(self.layout.loc[id(v)])

    def line(self, depth: int, text: str) -> None:
        self.lines.append("    " * depth + text)

    def copy(self, depth: int, dst: Loc, v: Value) -> None:
        if self.layout.loc[id(v)] != dst:
            self.line(depth, f"memcpy({_ptr(dst)}, {self.ptr(v)}, {v.nbytes});")

    def block(self, steps: Sequence[Step], depth: int) -> None:
        for s in steps:
            if isinstance(s, Call):
                name = kernel_name(s.task)
                args = [self.ptr(v) for v in s.args] + (
                    [f"(void*)(ws + {self.scratch_at})"] if self.scratch[name] else []
                )
                self.line(depth, f"{name}({', '.join(args)});")
            elif s.node.op == "Trap":
                self.line(depth, f"return {self.layout.traps[id(s.node)]};")
            elif s.node.op == "If":
                self.if_(s, depth)
            else:
                self.loop(s, depth)

    def if_(self, s: Control, depth: int) -> None:
        self.line(depth, f"if (*(const unsigned char*){self.ptr(s.node.inputs[0])}) {{")
        for k, (graph, block) in enumerate(zip(s.graphs, s.blocks)):
            if k:
                self.line(depth, "} else {")
            self.block(block, depth + 1)
            for v, out in zip(graph.outputs, s.node.outputs):
                self.copy(depth + 1, self.layout.loc[id(out)], v)
        self.line(depth, "}")

    def loop(self, s: Control, depth: int) -> None:
        node, (body,), (block,) = s.node, s.graphs, s.blocks
        carried, slots = node.attrs["carried"], self.layout.slots[id(node)]
        trips, cond = node.inputs[0], node.inputs[1]
        n, i, c = f"n{depth}", f"i{depth}", f"c{depth}"
        self.line(depth, "{")
        d = depth + 1
        self.line(
            d, f"const int64_t {n} = {f'*(const int64_t*){self.ptr(trips)}' if trips is not None else 'INT64_MAX'};"
        )
        self.line(d, f"unsigned char {c} = {f'*(const unsigned char*){self.ptr(cond)}' if cond is not None else '1'};")
        for k in range(carried):
            self.copy(d, self.layout.loc[id(body.inputs[2 + k])], node.inputs[2 + k])
        self.line(d, f"int64_t {i} = 0;")
        self.line(d, f"for (; {i} < {n} && {c}; ++{i}) {{")
        self.line(d + 1, f"*(int64_t*){self.ptr(body.inputs[0])} = {i};")
        self.line(d + 1, f"*(unsigned char*){self.ptr(body.inputs[1])} = {c};")
        self.block(block, d + 1)
        for v, slot in zip(body.outputs, slots):
            self.copy(d + 1, slot, v)
        self.line(d + 1, f"{c} = *(const unsigned char*){_ptr(slots[0])};")
        for k in range(carried):
            self.line(
                d + 1, f"memcpy({self.ptr(body.inputs[2 + k])}, {_ptr(slots[1 + k])}, {body.inputs[2 + k].nbytes});"
            )
        for out, slot, piece in zip(node.outputs[carried:], slots[1 + carried :], body.outputs[1 + carried :]):
            dst = f"(unsigned char*){self.ptr(out)} + {i} * {piece.nbytes}"
            self.line(d + 1, f"memcpy({dst}, {_ptr(slot)}, {piece.nbytes});")
        self.line(d, "}")
        for k in range(carried):
            self.line(
                d, f"memcpy({self.ptr(node.outputs[k])}, {self.ptr(body.inputs[2 + k])}, {node.outputs[k].nbytes});"
            )
        for out in node.outputs[carried:]:
            if id(out) in self.layout.lengths:
                self.line(d, f"*(int64_t*)(ws + {self.layout.lengths[id(out)]}) = {i};")
        self.line(depth, "}")


def entry_source(
    graph: Graph,
    steps: Sequence[Step],
    layout: Layout,
    kernels: dict[str, int],
    scratch: dict[str, int],
    workspace: int,
) -> str:
    """C for the AOT entry point: the plan's kernel calls in order, If and Loop as C control flow, with pointers into
    inputs/outputs/params/workspace (and, for a kernel that takes one, its scratch buffer: the workspace past the
    planned values, shared by all); `kernels`: each kernel's parameter count."""
    lines = [
        "#include <stddef.h>",
        "#include <stdint.h>",
        "#include <string.h>",
        "extern const unsigned char tilefarm_params[];",
    ]
    lines += [f"void {name}({', '.join(['void*'] * n)});" for name, n in sorted(kernels.items())]
    lengths = {i: layout.lengths[id(v)] for i, v in enumerate(graph.outputs) if id(v) in layout.lengths}
    cases = "".join(f" if (output == {i}) return *(const int64_t*)((const unsigned char*)workspace + {at});"
                    for i, at in lengths.items())  # fmt: skip
    rows = "{" + ", ".join(str(v.shape[0] if v.shape else 1) for v in graph.outputs) + "}"
    lines += [
        f"size_t tilefarm_workspace_bytes(void) {{ return {workspace}; }}",
        "int64_t tilefarm_output_rows(const void* workspace, int output) {",
        f"    static const int64_t rows[] = {rows if graph.outputs else '{0}'};{cases}",
        "    (void)workspace;",
        "    return rows[output];",
        "}",
        "int tilefarm_run(void* const* inputs, void* const* outputs, void* workspace) {",
        "    unsigned char* ws = (unsigned char*)workspace;",
        "    (void)ws; (void)inputs;",
    ]
    emit = _Emitter(layout, scratch, layout.size)
    emit.block(steps, 1)
    for i, v in enumerate(graph.outputs):  # outputs no step writes in place: inputs, constants, repeated values
        emit.copy(1, ("output", i), v)
    lines += [*emit.lines, "    return 0;", "}"]
    return "\n".join(lines) + "\n"
