"""What one model may make the loader allocate, checked before it is allocated.

A model's numbers are not its size: 114 bytes of ONNX can ask for a ConstantOfShape of [2**28, 4], an initializer can
declare dims its few bytes do not hold (a sparse one is made dense), and a function called from a function inlines
to more nodes than the file has. A `Budget` bounds each of these, and the loader weighs what a step would allocate
against it before taking the step, refusing the model (`OverBudget`) with the limit and the setting that raises it:

- value_bytes: the most one value may take: an input, an initializer as declared, anything computed (an artifact
  would allocate it at run time);
- fold_bytes: the most constant folding may make in all, subgraphs included (a per-value limit would let many
  values each under it add up to any size);
- nodes: the most nodes, subgraphs' included and local functions counted as inlined.

The defaults admit real models generously (VGG-19 of onnx's light zoo, a 9 KB file whose weights are all made by
ConstantOfShape, folds 548 MiB); TILEFARM_MAX_VALUE_BYTES, TILEFARM_MAX_FOLD_BYTES and TILEFARM_MAX_NODES change them.
The service passes a tighter one of its own (server.catalog.model_budget), named by its own settings."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import onnx

from compiler.base.errors import InvalidModel

LIMITS = {"value_bytes": "VALUE_BYTES", "fold_bytes": "FOLD_BYTES", "nodes": "NODES"}  # field -> setting's suffix


class OverBudget(InvalidModel):
    """A model that would make the loader (or its artifact) allocate past a Budget; the message names the limit."""


@dataclass(frozen=True)
class Budget:
    value_bytes: int = 4 << 30
    fold_bytes: int = 1 << 30
    nodes: int = 1_000_000
    # the settings that set these limits are this prefix + LIMITS' suffixes: a refusal names the one to raise
    prefix: str = "TILEFARM_MAX_"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Budget:
        """The defaults, each replaced by its TILEFARM_MAX_* variable where one is set."""
        given = {
            name: int(environ[cls.prefix + suffix])
            for name, suffix in LIMITS.items()
            if environ.get(cls.prefix + suffix)
        }
        return cls(**given)

    def setting(self, limit: str) -> str:
        return self.prefix + LIMITS[limit]

    def refuse(self, what: str, amount: int, limit: str) -> OverBudget:
        """`what` refused, `amount` being more than the limit named by `limit` (a field): the message names its
        setting. `what` says what it is and, for bytes, ends where their size follows (`input 'x' is [2, 3]`)."""
        allowed, setting = getattr(self, limit), self.setting(limit)
        if limit == "nodes":
            return OverBudget(f"{what} has {amount:,} nodes, more than the {allowed:,} allowed ({setting})")
        kind = "one value may take" if limit == "value_bytes" else "constant folding may make in all"
        return OverBudget(f"{what}: {size(amount)}, more than the {size(allowed)} {kind} ({setting})")


def size(n: int) -> str:
    """Bytes for a message: 4 TiB, 1.5 GiB, 256 MiB, 12 KiB, 100 bytes."""
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            value = n / (1 << shift)
            return f"{value:.0f} {unit}" if value == int(value) or value >= 100 else f"{value:.1f} {unit}"
    return f"{n} bytes"


@dataclass
class Meter:
    """A model's spending against its budget while it loads: one for the model and every subgraph in it."""

    budget: Budget
    folded: int = 0  # bytes constant folding has made so far

    def fits(self, nbytes: int) -> bool:
        return self.folded + nbytes <= self.budget.fold_bytes

    def spend(self, nbytes: int) -> None:
        self.folded += nbytes

    def refuse(self, what: str, nbytes: int) -> OverBudget:
        """Folding `what` (`ConstantOfShape node 'c' would make 'y' of [8, 8]`), `nbytes` more, refused."""
        before = f" (with {size(self.folded)} folded before it)" if self.folded else ""
        return self.budget.refuse(f"{what} at compile time{before}", self.folded + nbytes, "fold_bytes")


def node_count(proto: onnx.ModelProto) -> int:
    """The nodes loading the model will go through: subgraphs' nodes included, and a call of a model-local function
    counted as the nodes inlining it makes (a function calling another ten times, called ten times, is 100), so a
    small file cannot inline to millions of nodes before it is counted."""
    functions = {(f.domain, f.name): f for f in proto.functions}
    inlined: dict[tuple[str, str], int] = {}

    def call(key: tuple[str, str], calling: frozenset) -> int:
        if key in calling:  # a recursive function: onnx's checker refuses it; one node until then
            return 1
        if key not in inlined:
            inlined[key] = nodes(functions[key].node, calling | {key})
        return inlined[key]

    def nodes(ns, calling: frozenset = frozenset()) -> int:
        n = 0
        for node in ns:
            key = (node.domain, node.op_type)
            n += call(key, calling) if key in functions else 1
            for a in node.attribute:
                for g in [a.g, *a.graphs] if a.HasField("g") else a.graphs:
                    n += nodes(g.node, calling)
        return n

    return nodes(proto.graph.node)
