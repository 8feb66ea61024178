"""Hypothesis strategies: random legal transform-step sequences on any ComputeDAG."""

from __future__ import annotations

from hypothesis import strategies as st

from compiler.base.errors import IllegalStep
from compiler.schedule.state import (
    ANNOTATIONS,
    Annotate,
    CacheRead,
    CacheWrite,
    ComputeAt,
    ComputeInline,
    ComputeRoot,
    Fuse,
    Pragma,
    Reorder,
    Rfactor,
    Split,
    State,
    apply_steps,
    initial_state,
)
from compiler.tensor.dag import ComputeDAG

KINDS = (
    "split",
    "split",
    "split",
    "fuse",
    "reorder",
    "annotate",
    "annotate",
    "compute_at",
    "compute_at",
    "compute_inline",
    "compute_root",
    "cache_write",
    "cache_read",
    "rfactor",
    "pragma",
)


def _draw_step(draw, state: State, kind: str):
    computes = [i for i, s in enumerate(state.stages) if not s.op.is_placeholder]
    sid = draw(st.sampled_from(computes))
    s = state.stages[sid]
    n = len(s.iters)
    if kind == "split":
        lengths = tuple(draw(st.lists(st.integers(1, 8), min_size=1, max_size=3)))
        return Split(sid, draw(st.integers(0, n - 1)), lengths, draw(st.booleans()))
    if kind == "fuse":
        a = draw(st.integers(0, n - 1))
        return Fuse(sid, tuple(range(a, draw(st.integers(a, n - 1)) + 1)))
    if kind == "reorder":
        return Reorder(sid, tuple(draw(st.permutations(range(n)))))
    if kind == "annotate":
        return Annotate(sid, draw(st.integers(0, n - 1)), draw(st.sampled_from(ANNOTATIONS[1:])))
    if kind == "compute_at":
        consumers = [state.stage_id(c) for c in state.consumers(s.name)]
        if not consumers:
            return None
        target = draw(st.sampled_from(consumers))
        return ComputeAt(sid, target, draw(st.integers(0, len(state.stages[target].iters) - 1)))
    if kind == "compute_inline":
        return ComputeInline(sid)
    if kind == "compute_root":
        return ComputeRoot(sid)
    if kind == "cache_write":
        return CacheWrite(sid, "local")
    if kind == "cache_read":
        src = draw(st.sampled_from(range(len(state.stages))))
        readers = [i for i, r in enumerate(state.stages) if state.stages[src].name in r.op.reads]
        if not readers:
            return None
        return CacheRead(src, "shared", (draw(st.sampled_from(readers)),))
    if kind == "rfactor":
        reduce_ids = [i for i, it in enumerate(s.iters) if it.kind == "reduce"]
        if not reduce_ids:
            return None
        return Rfactor(sid, draw(st.sampled_from(reduce_ids)), draw(st.integers(0, len(s.op.axes))))
    return Pragma(sid, 0, "auto_unroll_max_step", draw(st.sampled_from((0, 16, 64, 512))))


@st.composite
def legal_steps(draw, dag: ComputeDAG, max_steps: int = 10):
    """A step list that applies without error; illegal draws are dropped, as a search would drop them."""
    state = initial_state(dag)
    steps = []
    for _ in range(draw(st.integers(0, max_steps))):
        step = _draw_step(draw, state, draw(st.sampled_from(KINDS)))
        if step is None:
            continue
        try:
            state = apply_steps(dag, [step], state)
        except IllegalStep:
            continue
        steps.append(step)
    return steps
