"""The graph optimizer: the passes in one ordered list (PASSES), run by `optimize` before task extraction; the
optional ones a user may turn off (`--disable-pass`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Mapping
from dataclasses import replace

from compiler.base.errors import UnknownPass
from compiler.model.graph import Graph, subgraphs
from compiler.model.int8_layout import pack_integer_convs, pack_integer_matmuls, propagate_int8_nchwc
from compiler.model.layout import propagate_nchwc
from compiler.model.passes import (
    block_conv_weights,
    conv_forms,
    fold_batchnorm,
    fuse_attention,
    fuse_depthwise_pointwise,
    gemm_to_matmul,
    pack_matmul_weights,
    remove_identity,
    remove_unused,
    winograd_convs,
)
from compiler.model.quant_fold import fold_qdq

PASSES: list[tuple[str, Callable[[Graph], Graph]]] = [
    ("remove_unused", remove_unused),
    ("remove_identity", remove_identity),
    ("fold_qdq", fold_qdq),
    ("pack_integer_matmuls", pack_integer_matmuls),
    ("pack_integer_convs", pack_integer_convs),
    ("propagate_int8_nchwc", propagate_int8_nchwc),
    ("fold_batchnorm", fold_batchnorm),
    ("gemm_to_matmul", gemm_to_matmul),
    ("pack_matmul_weights", pack_matmul_weights),
    ("winograd_convs", winograd_convs),
    ("block_conv_weights", block_conv_weights),
    ("propagate_nchwc", propagate_nchwc),
    ("fuse_depthwise_pointwise", fuse_depthwise_pointwise),
    ("fuse_attention", fuse_attention),
]


# the passes a user may turn off (`--disable-pass`): the graph runs without them, only slower (or, without
# winograd_convs, with the direct conv's rounding); the others turn ops into the forms the kernels exist for
OPTIONAL_PASSES = (
    "pack_integer_matmuls",
    "pack_integer_convs",
    "propagate_int8_nchwc",
    "pack_matmul_weights",
    "winograd_convs",
    "block_conv_weights",
    "propagate_nchwc",
    "fuse_depthwise_pointwise",
    "fuse_attention",
)


def check_disabled(disabled: Collection[str]) -> tuple[str, ...]:
    """`disabled` as a sorted tuple of distinct pass names; UnknownPass names any that cannot be turned off."""
    wrong = sorted(set(disabled) - set(OPTIONAL_PASSES))
    if wrong:
        raise UnknownPass(
            f"cannot disable {', '.join(map(repr, wrong))}: the passes that can be turned off are "
            f"{', '.join(OPTIONAL_PASSES)}"
        )
    return tuple(sorted(set(disabled)))


def optimize(g: Graph, disabled: Collection[str] = (), forms: Mapping[str, int] | None = None) -> Graph:
    """Run PASSES in order, but those named in `disabled` (a subset of OPTIONAL_PASSES); `forms` picks convs' forms
    by node name (winograd_convs). The subgraphs of If and Loop nodes are optimized alike, their convs in the rule's
    form (`forms` names the top graph's nodes)."""
    off = check_disabled(disabled)
    for name, fn in PASSES:
        if name not in off:
            g = winograd_convs(g, forms) if fn is winograd_convs else fn(g)
    if not subgraphs(g):
        return g
    nodes = []
    for n in g.nodes:
        if n.op == "If":
            n = replace(n, attrs={**n.attrs, "branches": tuple(optimize(b, off) for b in n.attrs["branches"])})
        elif n.op == "Loop":
            n = replace(n, attrs={**n.attrs, "body": optimize(n.attrs["body"], off)})
        nodes.append(n)
    return Graph(g.inputs, g.outputs, nodes, g.name)


def form_alternatives(g: Graph, disabled: Collection[str] = ()) -> dict[str, tuple[int, ...]]:
    """The convs of `g` that can be compiled in more than one form, by node name: their `conv_forms`, the rule's
    first, as the winograd_convs pass meets them (after the passes before it). A conv whose name another node shares
    is left to the rule, since `forms` could not pick it alone; none if winograd_convs is disabled."""
    off = check_disabled(disabled)
    if "winograd_convs" in off:
        return {}
    for name, fn in PASSES:
        if fn is winograd_convs:
            break
        if name not in off:
            g = fn(g)
    names = Counter(n.name for n in g.nodes)
    return {n.name: f for n in g.nodes if len(f := conv_forms(n)) > 1 and names[n.name] == 1}
