"""Fusion (TVM's FuseOps op patterns): an anchor (conv, matmul, pooling) absorbs the chain of elementwise and
broadcast ops after it, a diamond of them too (a GELU reads its GEMM's output twice); chains of injective ops fuse
with each other and into a reduction that reads them. Anchors fuse where a pass marked them: a depthwise conv into the
1x1 conv that reads it (passes.fuse_depthwise_pointwise); an attention's softmax into its scores' product and the
product with V into both (passes.fuse_attention)."""

from __future__ import annotations

from dataclasses import dataclass

from compiler.model.graph import Graph, Node, Value
from compiler.model.passes import ANCHOR, BROADCAST, INJECTIVE, REDUCE, pattern

MAX_GROUP = 32  # nodes per fused group, so one task never grows without bound


@dataclass
class Group:
    """Nodes that become one kernel: `inputs` come from outside (graph inputs, constants, other groups)."""

    nodes: list[Node]
    inputs: list[Value]
    outputs: list[Value]

    @property
    def pattern(self) -> int:
        return max(pattern(n) for n in self.nodes)


def fuse(g: Graph) -> list[Group]:
    """Partition the nodes into fused groups, in execution order."""
    consumers = g.consumers()
    producers = g.producers()
    graph_outputs = {id(v) for v in g.outputs}
    group_of: dict[int, int] = {id(n): i for i, n in enumerate(g.nodes)}
    members: dict[int, list[Node]] = {i: [n] for i, n in enumerate(g.nodes)}

    def kind(gid: int) -> int:
        return max(pattern(n) for n in members[gid])

    def merge(a: int, b: int) -> None:
        for n in members.pop(b):
            group_of[id(n)] = a
            members[a].append(n)

    for node in g.nodes:
        me = group_of[id(node)]
        for v in node.inputs:
            p = producers.get(id(v)) if v is not None else None
            if p is None:
                continue
            pg = group_of[id(p)]
            if pg == me or len(members[pg]) + len(members[me]) > MAX_GROUP:
                continue
            # the producer's value must be needed only here, so the fused kernel can keep it in registers; or only by
            # elementwise ops that an anchor absorbs, as a GELU's x * (1 + erf(x / sqrt 2)) reads its GEMM's output
            readers = consumers.get(id(v), [])
            shared = len(readers) > 1 and kind(pg) == ANCHOR and all(pattern(r) <= BROADCAST for r in readers)
            if (len(readers) != 1 and not shared) or id(v) in graph_outputs or len(p.outputs) != 1:
                continue
            pk, mk = kind(pg), pattern(node)
            if node.attrs.get("fuse_depthwise") and v is node.inputs[0] and len(readers) == 1 and pk == ANCHOR:
                merge(pg, me)  # passes.fuse_depthwise_pointwise: the depthwise conv computed in the 1x1 conv's tiles
                me = pg
                continue
            if node.attrs.get("fuse_attention") and v is node.inputs[0] and len(readers) == 1:
                merge(pg, me)  # passes.fuse_attention: the scores and their softmax computed in the ·V product's rows
                me = pg
                continue
            absorb = pk in (ANCHOR, REDUCE) and mk <= BROADCAST  # conv/matmul/reduce takes its elementwise consumer
            forward = pk <= INJECTIVE and mk <= REDUCE  # injective chains fuse into what reads them
            if not (absorb or forward) or (pk >= REDUCE and kind(me) >= REDUCE):
                continue  # at most one anchor or reduction per kernel; opaque ops stay alone
            merge(pg, me)
            me = pg
    order = {id(n): i for i, n in enumerate(g.nodes)}
    groups = []
    for nodes in members.values():
        nodes.sort(key=lambda n: order[id(n)])
        inside = {id(n) for n in nodes}
        produced = {id(o) for n in nodes for o in n.outputs}
        ins = list({id(v): v for n in nodes for v in n.inputs if v is not None and id(v) not in produced}.values())
        outs = [
            o
            for n in nodes
            for o in n.outputs
            if id(o) in graph_outputs or any(id(c) not in inside for c in consumers.get(id(o), []))
        ]
        groups.append(Group(nodes, ins, outs))
    ordered = _order_groups(groups)
    if ordered is None:  # fusion made two groups depend on each other: run every node on its own instead
        return [Group([n], [v for v in n.inputs if v is not None], list(n.outputs)) for n in g.nodes]
    return ordered


def _order_groups(groups: list[Group]) -> list[Group] | None:
    """Groups in dependency order, or None if they form a cycle."""
    maker = {id(o): i for i, grp in enumerate(groups) for n in grp.nodes for o in n.outputs}
    deps = [{maker[id(v)] for v in grp.inputs if id(v) in maker} for grp in groups]
    state = [0] * len(groups)  # 0 new, 1 visiting, 2 done
    out: list[Group] = []

    def visit(i: int) -> bool:
        stack = [(i, iter(sorted(deps[i])))]
        state[i] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[node] = 2
                out.append(groups[node])
                stack.pop()
            elif state[nxt] == 1:
                return False
            elif state[nxt] == 0:
                state[nxt] = 1
                stack.append((nxt, iter(sorted(deps[nxt]))))
        return True

    for i in range(len(groups)):
        if state[i] == 0 and not visit(i):
            return None
    return out
