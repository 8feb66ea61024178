"""Graph rewrites: pure Graph -> Graph functions (identity removal, BatchNorm folding, Gemm as MatMul, Winograd and
channel-blocked convs) and the op patterns fusion and layout propagation read. `optimize` runs them in order."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from compiler.model.graph import Graph, Node, TensorType, Value, toposort
from compiler.model.winograd import winograd_matrices, winograd_weight

# op patterns, weakest first (TVM's OpPatternKind)
ELEMWISE, BROADCAST, INJECTIVE, REDUCE, ANCHOR, OPAQUE = range(6)
_UNARY = (
    "Relu LeakyRelu Sigmoid HardSigmoid HardSwish Tanh Erf Gelu Exp Log Sqrt Reciprocal Neg Abs Floor Ceil Round"
    " Sign Not Cast Clip Elu Selu Softplus Sin Cos Identity Dropout"
)
_BINARY = "Add Sub Mul Div Pow Max Min Equal Less Greater LessOrEqual GreaterOrEqual Where And Or Mod PRelu Sum Mean"
_INJECTIVE = "NCHWcToNCHW Reshape Flatten Transpose Concat Split Slice Squeeze Unsqueeze Gather Expand Tile Pad Resize"
_REDUCE = "ReduceMean ReduceSum ReduceMax ReduceMin"
_ANCHOR = (
    "Conv BlockedConv WinogradConv ConvTranspose MatMul PackedMatMul Gemm Dense MaxPool AveragePool GlobalAveragePool"
    " GlobalMaxPool"
)
# quantized ops (onnx_import/quantized.py): elementwise with a per-tensor or per-axis scale, and int32 products
_QUANTIZED_BROADCAST = "QuantizeLinear DequantizeLinear Requantize QLinearAdd"
_QUANTIZED_ANCHOR = "MatMulInteger ConvInteger PackedMatMulInteger PackedConvInteger"
PATTERNS: dict[str, int] = {
    **dict.fromkeys(_UNARY.split(), ELEMWISE),
    **dict.fromkeys(_BINARY.split(), BROADCAST),
    **dict.fromkeys(_INJECTIVE.split(), INJECTIVE),
    **dict.fromkeys(_REDUCE.split(), REDUCE),
    **dict.fromkeys(_ANCHOR.split(), ANCHOR),
    **dict.fromkeys(_QUANTIZED_BROADCAST.split(), BROADCAST),
    **dict.fromkeys(_QUANTIZED_ANCHOR.split(), ANCHOR),
}  # anything else (Softmax, LayerNormalization, BatchNormalization, …) is OPAQUE: a task of its own


def pattern(node: Node) -> int:
    return PATTERNS.get(node.op, OPAQUE)


# ---------------------------------------------------------------------------------------------- simplification


def _rewire(g: Graph, mapping: dict[int, Value], nodes: list[Node]) -> Graph:
    """The graph with `nodes`, every input in `mapping` (by id) replaced."""

    def sub(v):
        while v is not None and id(v) in mapping:
            v = mapping[id(v)]
        return v

    new_nodes = [replace(n, inputs=tuple(sub(v) for v in n.inputs)) for n in nodes]
    outputs = [sub(v) for v in g.outputs]
    return Graph(g.inputs, outputs, toposort(new_nodes), g.name)


def remove_unused(g: Graph) -> Graph:
    """Nodes none of whose results reach a graph output are dropped (a converter's leftovers: a fused group of them
    would compute nothing anyone reads)."""
    live = {id(v) for v in g.outputs}
    keep = []
    for n in reversed(g.nodes):
        if any(id(o) in live for o in n.outputs if o is not None):
            keep.append(n)
            live.update(id(v) for v in n.inputs if v is not None)
    return Graph(g.inputs, g.outputs, keep[::-1], g.name)


def remove_identity(g: Graph) -> Graph:
    """Identity and (inference) Dropout forward their input; a graph output keeps its own name via a copy."""
    mapping: dict[int, Value] = {}
    keep = []
    outputs = {id(v) for v in g.outputs}
    for n in g.nodes:
        if n.op in ("Identity", "Dropout") and id(n.outputs[0]) not in outputs:
            mapping[id(n.outputs[0])] = n.inputs[0]
            if len(n.outputs) > 1 and n.outputs[1] is not None:
                keep.append(n)  # Dropout's mask output is used: leave it alone
                del mapping[id(n.outputs[0])]
        else:
            keep.append(n)
    return _rewire(g, mapping, keep)


def fold_batchnorm(g: Graph) -> Graph:
    """Conv followed by BatchNormalization with constant statistics becomes one Conv with rescaled weights, where
    the BatchNormalization is the only reader of the Conv's result (a graph output is read by the caller too)."""
    consumers = g.consumers()
    producers = g.producers()
    graph_outputs = {id(v) for v in g.outputs}
    mapping: dict[int, Value] = {}
    drop: set[int] = set()
    replaced: dict[int, Node] = {}
    for bn in g.nodes:
        if bn.op != "BatchNormalization" or any(v is None or v.const is None for v in bn.inputs[1:5]):
            continue
        conv = producers.get(id(bn.inputs[0]))
        if conv is None or conv.op != "Conv" or len(consumers.get(id(conv.outputs[0]), [])) != 1:
            continue
        if id(conv.outputs[0]) in graph_outputs:
            continue
        w = conv.inputs[1]
        if (
            w is None
            or w.const is None
            or (len(conv.inputs) > 2 and conv.inputs[2] is not None and conv.inputs[2].const is None)
        ):
            continue
        scale, shift, mean, var = (v.const.astype(np.float64) for v in bn.inputs[1:5])
        k = scale / np.sqrt(var + bn.attrs.get("epsilon", 1e-5))
        bias = conv.inputs[2].const.astype(np.float64) if len(conv.inputs) > 2 and conv.inputs[2] is not None else 0.0
        dt = w.const.dtype
        new_w = Value(f"{w.name}_bn", w.type, (w.const * k.reshape(-1, 1, 1, 1)).astype(dt))
        b_type = TensorType((w.shape[0],), w.dtype)
        new_b = Value(f"{bn.outputs[0].name}_bias", b_type, ((bias - mean) * k + shift).astype(dt))
        replaced[id(conv)] = replace(conv, inputs=(conv.inputs[0], new_w, new_b), outputs=(bn.outputs[0],))
        drop.add(id(bn))
    nodes = [replaced.get(id(n), n) for n in g.nodes if id(n) not in drop]
    return _rewire(g, mapping, nodes)


def gemm_to_matmul(g: Graph) -> Graph:
    """Gemm with a constant B becomes MatMul with the weight laid out K x N at compile time (+ Add of C): the
    layout the vectorized inner loop wants, paid once instead of at every run."""
    nodes = []
    for n in g.nodes:
        if n.op != "Gemm":
            nodes.append(n)
            continue
        a, b = n.inputs[0], n.inputs[1] if len(n.inputs) > 1 else None
        if b is None or b.const is None or n.attrs.get("transA", 0):
            nodes.append(n)
            continue
        w = b.const.T if n.attrs.get("transB", 0) else b.const
        alpha = n.attrs.get("alpha", 1.0)
        if alpha != 1.0:  # scaled only when it scales: a weight can be hundreds of MiB, and a copy costs as much
            w = w * np.asarray(alpha, w.dtype)
        w = np.ascontiguousarray(w)
        weight = Value(f"{b.name}_kn", TensorType(w.shape, b.dtype), w)
        c = n.inputs[2] if len(n.inputs) > 2 else None
        if c is None:
            nodes.append(Node("MatMul", (a, weight), n.outputs, {}, n.name))
            continue
        mm = Value(f"{n.outputs[0].name}_mm", n.outputs[0].type)
        beta = n.attrs.get("beta", 1.0)
        if beta != 1.0:
            if c.const is None:
                nodes.append(n)
                continue
            c = Value(f"{c.name}_beta", c.type, (c.const * np.asarray(beta, c.const.dtype)).astype(c.const.dtype))
        nodes += [Node("MatMul", (a, weight), (mm,), {}, n.name), Node("Add", (mm, c), n.outputs, {}, f"{n.name}_bias")]
    return Graph(g.inputs, g.outputs, toposort(nodes), g.name)


CONV_BLOCK = 16  # output channels per weight block: one AVX-512 vector of fp32, two AVX2 ones
# a conv of more than one block whose filters are a multiple of this but not of CONV_BLOCK is blocked with its last
# block padded (MobileNet's 24 channels as 32, EfficientNet's 40 as 48): at most a third computed for nothing, where
# the NCHW conv it replaces vectorizes over pixels and breaks the blocked layout between layers. 8 filters stay NCHW:
# padded, half the work would be zeros
PADDED_BLOCK_MULTIPLE = 8


def blockable_channels(c: int) -> bool:
    """Whether `c` channels travel in CONV_BLOCK blocks: whole ones, or padded ones as PADDED_BLOCK_MULTIPLE says."""
    return c % CONV_BLOCK == 0 or c > CONV_BLOCK and c % PADDED_BLOCK_MULTIPLE == 0


def pack_conv_weight(w: np.ndarray, block: int = CONV_BLOCK) -> np.ndarray:
    """An F x C x KH x KW conv weight laid out ceil(F/block) x C x KH x KW x block, the last block padded with zero
    filters."""
    w = pad_channels(w, 0, block)
    F, C, KH, KW = w.shape
    return np.ascontiguousarray(w.reshape(F // block, block, C, KH, KW).transpose(0, 2, 3, 4, 1))


def pad_channels(a: np.ndarray, axis: int, block: int = CONV_BLOCK) -> np.ndarray:
    """`a` with zeros appended along `axis` up to a multiple of `block`."""
    extra = -a.shape[axis] % block
    if not extra:
        return a
    widths = [(0, 0)] * a.ndim
    widths[axis] = (0, extra)
    return np.pad(a, widths)


def pack_depthwise_weight(w: np.ndarray, block: int = CONV_BLOCK) -> np.ndarray:
    """A depthwise conv weight C x 1 x KH x KW laid out C/block x KH x KW x block."""
    C, _, KH, KW = w.shape
    return np.ascontiguousarray(w.reshape(C // block, block, KH, KW).transpose(0, 2, 3, 1))


def block_conv_input_channels(w: np.ndarray, block: int = CONV_BLOCK) -> np.ndarray:
    """A blocked weight F/b x C x KH x KW x b laid out F/b x C/block x KH x KW x block x b, for NCHWc data (C padded
    with zero channels up to the data's blocks: its padding lanes then add nothing)."""
    w = pad_channels(w, 1, block)
    Fb, C, KH, KW, b = w.shape
    return np.ascontiguousarray(w.reshape(Fb, C // block, block, KH, KW, b).transpose(0, 1, 3, 4, 2, 5))


WINOGRAD_TILE = 4  # output tile m of F(m x m, 3 x 3): 36 multiplies for 16 outputs instead of 144
WINOGRAD_SMALL_TILE = 2  # F(2 x 2, 3 x 3): 16 multiplies for 4 outputs, for images too small for 4x4 tiles
WINOGRAD_MIN_TILES = 16  # fewer tiles per image leave each transformed weight too little reuse
DIRECT = 0  # the form of a conv left direct; a form m > 0 is Winograd F(m x m, 3 x 3)


def winograd_tiles(n: Node, tile: int = WINOGRAD_TILE) -> int:
    """How many output tiles `n` would split into as a WinogradConv, or 0 if it cannot be one: a 2-D Conv with a
    constant 3x3 weight, stride 1, dilation 1, one group, and input and output channels in CONV_BLOCK blocks."""
    if n.op != "Conv" or len(n.inputs) < 2 or n.inputs[1] is None or n.inputs[1].const is None:
        return 0
    x, w = n.inputs[0], n.inputs[1]
    if x is None or len(x.shape) != 4 or len(w.shape) != 4 or tuple(w.shape[2:]) != (3, 3):
        return 0
    a = n.attrs
    if a.get("group", 1) != 1 or tuple(a.get("strides") or (1, 1)) != (1, 1):
        return 0
    if tuple(a.get("dilations") or (1, 1)) != (1, 1) or w.shape[0] % CONV_BLOCK or w.shape[1] % CONV_BLOCK:
        return 0
    pt, pl, pb, pr = a.get("pads") or (0, 0, 0, 0)
    oh, ow = x.shape[2] + pt + pb - 2, x.shape[3] + pl + pr - 2
    return x.shape[0] * -(-oh // tile) * -(-ow // tile) if oh > 0 and ow > 0 else 0


def conv_forms(n: Node) -> tuple[int, ...]:
    """The forms node `n` can be compiled in, the rule's choice first, () for a node that is not such a conv: a
    conv with WINOGRAD_MIN_TILES 4x4 output tiles is F(4x4) by rule, or direct; a smaller one (ResNet's 7x7 stage)
    is direct by rule, or F(2x2) if that gives the tiles. Which is faster depends on the host (its caches against
    the transformed weight's size) and the thread count, so tuning may measure both (`tasks.form_choices`) and
    compile take the faster (`build.choose_forms`); without records the rule decides."""
    if not winograd_tiles(n):
        return ()
    if winograd_tiles(n, WINOGRAD_TILE) >= WINOGRAD_MIN_TILES:
        return (WINOGRAD_TILE, DIRECT)
    if winograd_tiles(n, WINOGRAD_SMALL_TILE) >= WINOGRAD_MIN_TILES:
        return (DIRECT, WINOGRAD_SMALL_TILE)
    return (DIRECT,)


def describe_forms(forms: Mapping[str, int]) -> str:
    """Convs' forms by node name, as text: "conv_151 Winograd F(2x2), conv_9 direct"."""
    return ", ".join(f"{node} {'direct' if m == DIRECT else f'Winograd F({m}x{m})'}" for node, m in forms.items())


def winograd_convs(g: Graph, forms: Mapping[str, int] | None = None) -> Graph:
    """A 3x3 stride-1 Conv with a constant weight becomes a WinogradConv (compiler.tensor.ops.winograd) with its weight
    transformed at compile time in the form `conv_forms` gives first (F(4x4) where the image has at least
    WINOGRAD_MIN_TILES 4x4 tiles: a quarter of the direct conv's multiplies; smaller images, ResNet's 7x7 stage,
    stay direct), or in the form `forms` names for the node (by node name) if it is one of its `conv_forms`.
    onnxruntime's CPU convs are all direct; TVM's auto-scheduler tunes the same Winograd form for x86."""
    nodes, transforms = [], {}
    for n in g.nodes:
        options = conv_forms(n)
        m = options[0] if options else DIRECT
        if forms and forms.get(n.name) in options:
            m = forms[n.name]
        if m == DIRECT:
            nodes.append(n)
            continue
        w = n.inputs[1]
        if (w.dtype, m) not in transforms:  # B^T and A^T: one pair of constants that every such conv reads
            at, _, bt = winograd_matrices(m)
            transforms[w.dtype, m] = tuple(
                Value(f"winograd{m}_{t}_{w.dtype}", TensorType(c.shape, w.dtype), c.astype(w.dtype))
                for t, c in (("bt", bt), ("at", at))
            )
        u = winograd_weight(w.const, m, CONV_BLOCK)
        weight = Value(f"{w.name}_winograd{m}", TensorType(u.shape, w.dtype), u)
        bias = n.inputs[2] if len(n.inputs) > 2 else None
        attrs = {"pads": tuple(n.attrs.get("pads") or (0, 0, 0, 0))}
        inputs = (n.inputs[0], weight, bias, *transforms[w.dtype, m])
        nodes.append(replace(n, op="WinogradConv", inputs=inputs, attrs=attrs))
    return Graph(g.inputs, g.outputs, nodes, g.name)


MATMUL_PANEL = 32  # columns per packed weight panel: two AVX-512 vectors, four AVX2 ones (the default tile's width)


def pack_matmul_weights(g: Graph) -> Graph:
    """A MatMul of activations with more than one row by a constant 2-D float weight K x N (N a multiple of
    MATMUL_PANEL) becomes a PackedMatMul with the weight laid out in panels N/P x K x P at compile time
    (compiler.tensor.ops.linalg.packed_matmul). BERT's FFN GEMM (128 x 768 by 768 x 3072) ran 2.76 ms with its
    weight flushed and packed, 5.2 unpacked, under default schedules (Zen 5, 1 thread). A one-row MatMul (a
    classifier's GEMV) keeps its rows, which its default tile reads 200 floats at a time."""
    nodes = []
    for n in g.nodes:
        a, b = (n.inputs + (None, None))[:2] if n.op == "MatMul" else (None, None)
        if (
            a is None
            or b is None
            or b.const is None
            or len(b.shape) != 2
            or len(a.shape) < 2
            or b.dtype not in ("float32", "float64")
            or b.shape[1] % MATMUL_PANEL
            or int(np.prod(a.shape[:-1])) < 2
        ):
            nodes.append(n)
            continue
        k, cols = b.shape
        panels = np.ascontiguousarray(b.const.reshape(k, cols // MATMUL_PANEL, MATMUL_PANEL).transpose(1, 0, 2))
        packed = Value(f"{b.name}_panels", TensorType(panels.shape, b.dtype), panels)
        nodes.append(replace(n, op="PackedMatMul", inputs=(a, packed)))
    return Graph(g.inputs, g.outputs, nodes, g.name)


def block_conv_weights(g: Graph) -> Graph:
    """A 2-D Conv (one group) with a constant weight whose output channels divide into CONV_BLOCK blocks becomes a
    BlockedConv with the weight laid out F/16 x C x KH x KW x 16 at compile time, so its kernel vectorizes over
    output channels (compiler.tensor.ops.nn.conv2d_nchw_blocked); a depthwise one (group = channels) likewise, its
    weight C/16 x KH x KW x 16 (depthwise_conv2d_nchwc), so the layout pass keeps MobileNet's blocks in NCHWc."""
    nodes = []
    for n in g.nodes:
        w = n.inputs[1] if n.op == "Conv" else None
        if w is None or w.const is None or len(w.shape) != 4 or not blockable_channels(w.shape[0]):
            nodes.append(n)
            continue
        group, attrs = n.attrs.get("group", 1), n.attrs
        if group == 1:
            packed = pack_conv_weight(w.const)
            if w.shape[0] % CONV_BLOCK:
                attrs = {**attrs, "channels": w.shape[0]}
        elif group == w.shape[0] and w.shape[1] == 1 and w.shape[0] % CONV_BLOCK == 0:  # depthwise
            packed = pack_depthwise_weight(w.const)
        else:
            nodes.append(n)
            continue
        blocked = Value(f"{w.name}_blocked", TensorType(packed.shape, w.dtype), packed)
        nodes.append(replace(n, op="BlockedConv", inputs=(n.inputs[0], blocked, *n.inputs[2:]), attrs=attrs))
    return Graph(g.inputs, g.outputs, nodes, g.name)


def fuse_depthwise_pointwise(g: Graph) -> Graph:
    """A 1x1, stride-1, unpadded BlockedConv reading NCHWc data that a depthwise BlockedConv (and its elementwise
    epilogue, a ReLU6) makes for it alone is marked `fuse_depthwise`, so fusion makes the two one task: MobileNet's
    depthwise-then-project pair, whose kernel computes the depthwise rows each tile of the projection needs just
    before it, where they are still in cache, instead of writing the expanded tensor out and reading it back."""
    readers = g.consumers()
    makers = g.producers()
    outputs = {id(v) for v in g.outputs}
    nodes = []
    for n in g.nodes:
        if _pointwise_nchwc(n) and _depthwise_feeds(n.inputs[0], makers, readers, outputs):
            n = replace(n, attrs={**n.attrs, "fuse_depthwise": True})
        nodes.append(n)
    return Graph(g.inputs, g.outputs, nodes, g.name)


def _pointwise_nchwc(n: Node) -> bool:
    """A BlockedConv with a 1x1 window, stride 1 and no padding, reading and writing NCHWc data."""
    if n.op != "BlockedConv" or n.attrs.get("group", 1) != 1:
        return False
    if n.attrs.get("data_layout") != "NCHWc" or n.attrs.get("out_layout") != "NCHWc":
        return False
    w = n.inputs[1]
    return (
        w is not None
        and tuple(w.shape[2:4]) == (1, 1)
        and tuple(n.attrs.get("strides") or (1, 1)) == (1, 1)
        and not any(n.attrs.get("pads") or ())
        and tuple(n.attrs.get("dilations") or (1, 1)) == (1, 1)
    )


def _depthwise_feeds(v: Value | None, makers: Mapping, readers: Mapping, outputs: set[int]) -> bool:
    """Whether `v` comes from a depthwise BlockedConv writing NCHWc, through elementwise ops only, every value on the
    way read by one node and no graph output."""
    while v is not None and id(v) not in outputs and len(readers.get(id(v), [])) == 1:
        p = makers.get(id(v))
        if p is None or len(p.outputs) != 1:
            return False
        if p.op == "BlockedConv":
            return p.attrs.get("group", 1) > 1 and p.attrs.get("out_layout") == "NCHWc"
        if PATTERNS.get(p.op) != ELEMWISE or len([i for i in p.inputs if i is not None and i.const is None]) != 1:
            return False
        v = next(i for i in p.inputs if i is not None and i.const is None)
    return False


# a head's score matrix (queries x keys) up to this many bytes makes its attention one task (fuse_attention): the
# fused kernel computes whole score rows for a block of queries, so every block re-reads the head's K and V, and a
# sequence up to 512 (1 MiB of fp32 scores) keeps them (2 x 512 x 64 floats, 256 KiB) in a 1-2 MiB L2 beside the
# rows; longer sequences need the key axis tiled as well (an online softmax), which this schedule does not do
ATTENTION_SCORE_BYTES = 1 << 20


def fuse_attention(g: Graph) -> Graph:
    """Attention per head batch, softmax(Q·Kᵀ · scale + mask) · V (batched MatMuls of rank 3 or more, the softmax
    over the last axis, elementwise ops between the product and it), is marked `fuse_attention` on its Softmax and
    its second MatMul, so fusion makes it one task where a head's score matrix fits ATTENTION_SCORE_BYTES: its
    default schedule computes a block of query rows' scores and their softmax inside the ·V product's row tile,
    while they are in cache, instead of writing the scores and the probabilities out and reading them back."""
    readers = g.consumers()
    makers = g.producers()
    outputs = {id(v) for v in g.outputs}
    marked: set[int] = set()
    for n in g.nodes:
        if n.op == "Softmax" and _attention_scores(n, makers, readers, outputs):
            probabilities = n.outputs[0]
            pv = readers.get(id(probabilities), [])
            if id(probabilities) in outputs or len(pv) != 1 or not _batched_matmul(pv[0]):
                continue
            if pv[0].inputs[0] is probabilities and pv[0].inputs[1] is not probabilities:
                marked |= {id(n), id(pv[0])}
    nodes = [replace(n, attrs={**n.attrs, "fuse_attention": True}) if id(n) in marked else n for n in g.nodes]
    return _rewire(g, {}, nodes) if marked else g


def _batched_matmul(n: Node) -> bool:
    """A MatMul of two computed operands of the same rank, 3 or more (a batch of heads)."""
    if n.op != "MatMul" or len(n.inputs) != 2 or any(v is None or v.const is not None for v in n.inputs):
        return False
    a, b = n.inputs
    return len(a.shape) == len(b.shape) >= 3 and a.dtype == b.dtype == "float32"


def _attention_scores(softmax: Node, makers: Mapping, readers: Mapping, outputs: set[int]) -> bool:
    """Whether the softmax runs over the last axis of a batched MatMul's product, through elementwise ops alone (the
    scale, a mask), every value on the way read by one node and no graph output, the scores of one head at most
    ATTENTION_SCORE_BYTES."""
    v = softmax.inputs[0]
    if v is None or softmax.attrs.get("axis", -1) not in (-1, len(v.shape) - 1):
        return False
    if len(v.shape) < 3 or v.shape[-1] * v.shape[-2] * 4 > ATTENTION_SCORE_BYTES:
        return False
    while v is not None and id(v) not in outputs and len(readers.get(id(v), [])) == 1:
        p = makers.get(id(v))
        if p is None or len(p.outputs) != 1:
            return False
        if p.op == "MatMul":
            return _batched_matmul(p)
        if PATTERNS.get(p.op, OPAQUE) > BROADCAST:
            return False
        on_chain = [i for i in p.inputs if i is not None and makers.get(id(i)) is not None and i.shape == v.shape]
        if len(on_chain) != 1:
            return False
        v = on_chain[0]
    return False
