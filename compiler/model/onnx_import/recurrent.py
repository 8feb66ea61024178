"""LSTM, GRU and RNN, unrolled over their sequence: once input shapes are fixed the sequence length is a constant,
so each time step becomes plain graph nodes (MatMul, Add, Slice, Sigmoid, Tanh, Mul) that fuse and schedule like any
other. Forward, reverse and bidirectional; initial states; batch-first layout; LSTM peepholes; clip. The weights must
be constants (they are pre-transposed per gate here); a sequence_lens input must give every batch entry the whole
sequence, since a shorter one would need masking this unrolling does not do.
"""

from __future__ import annotations

import numpy as np

from compiler.base.errors import InvalidModel
from compiler.model.graph import Node, Value
from compiler.model.onnx_import.converters import _CannotConvert, _Ctx

ACTIVATIONS = ("Sigmoid", "Tanh", "Relu")
# the gates of each op in the order its weights stack them, and its default activations (f, g, h)
GATES = {"LSTM": ("i", "o", "f", "c"), "GRU": ("z", "r", "h"), "RNN": ("i",)}
DEFAULT_ACTIVATIONS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"], "RNN": ["Tanh"]}


class _Unroller:
    """Builds one recurrent node's time steps as graph nodes."""

    def __init__(self, ctx: _Ctx):
        self.ctx, self.nodes = ctx, []
        self.dtype = ctx.inputs[0].dtype

    def emit(self, op: str, inputs: list[Value], shape: tuple[int, ...], attrs: dict | None = None, out=None) -> Value:
        out = out or self.ctx.temp(op.lower(), shape, self.dtype)
        self.nodes.append(self.ctx.node(op, inputs, attrs or {}, [out]))
        return out

    def const(self, suffix: str, a: np.ndarray) -> Value:
        return self.ctx.constant(suffix, np.ascontiguousarray(a.astype(self.dtype)))

    def activate(self, name: str, v: Value) -> Value:
        return self.emit(name, [v], v.shape)

    def take(self, v: Value, k: int, axis: int) -> Value:
        """Entry k of a 3-D value's `axis` (a time step, a direction's state), as 2-D."""
        part = self.emit("Slice", [v], tuple(1 if a == axis else n for a, n in enumerate(v.shape)),
                         {"starts": [k], "ends": [k + 1], "axes": [axis], "steps": [1]})  # fmt: skip
        rest = [n for a, n in enumerate(v.shape) if a != axis]
        return self.emit("Reshape", [part], tuple(rest), {"shape": rest})


def _weights(ctx: _Ctx, i: int, what: str) -> np.ndarray | None:
    v = ctx.input(i)
    if v is None:
        return None
    if v.const is None:
        raise _CannotConvert(f"{ctx.op} node {ctx.name!r}: its {what} ({v.name!r}) must be a compile-time constant")
    return v.const


def recurrent(ctx: _Ctx) -> list[Node]:
    op, x = ctx.op, ctx.inputs[0]
    layout = ctx.attrs.get("layout", 0)
    w, r, bias = _weights(ctx, 1, "W"), _weights(ctx, 2, "R"), _weights(ctx, 3, "B")
    if len(x.shape) != 3 or w.ndim != 3 or x.shape[2] != w.shape[2]:
        # the model's declared types can hide this where shape inference gave up (onnxruntime fails at run time)
        raise InvalidModel(f"{op} node {ctx.name!r}: input X is {x.type}, but it must be 3-D (sequence, batch, "
                           f"input size {w.shape[-1]} as W {list(w.shape)} says)")  # fmt: skip
    seq, batch = (x.shape[1], x.shape[0]) if layout else (x.shape[0], x.shape[1])
    lens = _weights(ctx, 4, "sequence_lens")
    if lens is not None and (lens != seq).any():
        raise _CannotConvert(f"{op} node {ctx.name!r}: sequence_lens {lens.tolist()} leave some sequences shorter "
                             f"than {seq}; only whole sequences are unrolled")  # fmt: skip
    hidden, gates = r.shape[-1], GATES[op]
    direction = ctx.attrs.get("direction", "forward")
    dirs = 2 if direction == "bidirectional" else 1
    acts = [a.decode() if isinstance(a, bytes) else a for a in ctx.attrs.get("activations", [])]
    acts = acts or DEFAULT_ACTIVATIONS[op] * dirs
    if any(a not in ACTIVATIONS for a in acts):
        raise _CannotConvert(f"{op} node {ctx.name!r}: activations {acts} (supported: {', '.join(ACTIVATIONS)})")
    if ctx.attrs.get("input_forget", 0) or ctx.attrs.get("activation_alpha") or ctx.attrs.get("activation_beta"):
        raise _CannotConvert(f"{op} node {ctx.name!r}: input_forget and activation alpha/beta are not supported")
    u = _Unroller(ctx)
    h0 = _state(ctx, u, 5, dirs, batch, hidden, layout)
    c0 = _state(ctx, u, 6, dirs, batch, hidden, layout) if op == "LSTM" else [None] * dirs
    peep = _weights(ctx, 7, "P") if op == "LSTM" else None
    per_step = [u.take(x, t, 1 if layout else 0) for t in range(seq)]  # each [batch, input]
    ys, hs, cs = [], [], []
    for d in range(dirs):
        reverse = direction == "reverse" or d == 1
        n_act = len(DEFAULT_ACTIVATIONS[op])
        fns = acts[d * n_act : (d + 1) * n_act]
        wd = {g: u.const(f"w{d}{g}", w[d, k * hidden : (k + 1) * hidden].T) for k, g in enumerate(gates)}
        rd = {g: u.const(f"r{d}{g}", r[d, k * hidden : (k + 1) * hidden].T) for k, g in enumerate(gates)}
        bd = np.zeros(2 * len(gates) * hidden) if bias is None else bias[d]
        wb = {g: bd[k * hidden : (k + 1) * hidden] for k, g in enumerate(gates)}
        rb = {g: bd[(len(gates) + k) * hidden : (len(gates) + k + 1) * hidden] for k, g in enumerate(gates)}
        consts = {f"b{g}": u.const(f"b{d}{g}", wb[g] + rb[g]) for g in gates}
        if op == "GRU":  # linear_before_reset keeps the hidden gate's two biases apart
            consts.update(wbh=u.const(f"wb{d}h", wb["h"]), rbh=u.const(f"rb{d}h", rb["h"]))
        if peep is not None:
            consts.update({f"p{g}": u.const(f"p{d}{g}", peep[d, k * hidden : (k + 1) * hidden])
                           for k, g in enumerate(("i", "o", "f"))})  # fmt: skip
        h, c = h0[d], c0[d]
        outs: list[Value | None] = [None] * seq
        for t in reversed(range(seq)) if reverse else range(seq):
            step = _Step(u, per_step[t], h, wd, rd, consts, ctx.attrs.get("clip"), batch, hidden)
            if op == "LSTM":
                h, c = step.lstm(c, fns)
            elif op == "GRU":
                h = step.gru(fns, ctx.attrs.get("linear_before_reset", 0))
            else:
                h = step.rnn(fns)
            outs[t] = h
        ys.append(outs)
        hs.append(h)
        cs.append(c)
    _outputs(ctx, u, ys, hs, cs, layout, seq, batch, hidden)
    return u.nodes


def _state(ctx: _Ctx, u: _Unroller, i: int, dirs: int, batch: int, hidden: int, layout: int) -> list[Value]:
    """Each direction's initial state [batch, hidden]: the input's slice, or zeros."""
    v = ctx.input(i)
    if v is None:
        zero = u.const(f"zero{i}", np.zeros((batch, hidden)))
        return [zero] * dirs
    return [u.take(v, d, 1 if layout else 0) for d in range(dirs)]


class _Step:
    """One time step of one direction: the gates' pre-activations and the new state."""

    def __init__(self, u: _Unroller, x, h, wd, rd, consts: dict[str, Value], clip, batch: int, hidden: int):
        self.u, self.x, self.h, self.wd, self.rd, self.consts = u, x, h, wd, rd, consts
        self.clip, self.shape = clip, (batch, hidden)

    def _clipped(self, v: Value) -> Value:
        if self.clip is None:
            return v
        return self.u.emit("Clip", [v], v.shape, {"min": -float(self.clip), "max": float(self.clip)})

    def _add(self, a: Value, b: Value) -> Value:
        return self.u.emit("Add", [a, b], self.shape)

    def _mul(self, a: Value, b: Value) -> Value:
        return self.u.emit("Mul", [a, b], self.shape)

    def _input_part(self, g: str) -> Value:
        """x W_g + Wb_g + Rb_g."""
        xw = self.u.emit("MatMul", [self.x, self.wd[g]], self.shape)
        return self.u.emit("Add", [xw, self.consts[f"b{g}"]], self.shape)

    def _gate(self, g: str, extra: Value | None = None) -> Value:
        """x W_g + h R_g + Wb_g + Rb_g (+ extra), clipped."""
        hr = self.u.emit("MatMul", [self.h, self.rd[g]], self.shape)
        v = self._add(self._input_part(g), hr)
        return self._clipped(self._add(v, extra) if extra is not None else v)

    def lstm(self, c: Value, fns: list[str]) -> tuple[Value, Value]:
        f_act, g_act, h_act = fns
        pi, po, pf = (self.consts.get(f"p{g}") for g in ("i", "o", "f"))
        i = self.u.activate(f_act, self._gate("i", None if pi is None else self._mul(c, pi)))
        f = self.u.activate(f_act, self._gate("f", None if pf is None else self._mul(c, pf)))
        cand = self.u.activate(g_act, self._gate("c"))
        c_new = self._add(self._mul(f, c), self._mul(i, cand))
        o = self.u.activate(f_act, self._gate("o", None if po is None else self._mul(c_new, po)))
        return self._mul(o, self.u.activate(h_act, c_new)), c_new

    def gru(self, fns: list[str], linear_before_reset: int) -> Value:
        f_act, g_act = fns
        z = self.u.activate(f_act, self._gate("z"))
        r = self.u.activate(f_act, self._gate("r"))
        if linear_before_reset:  # r * (h R_h + Rb_h), Wb_h with the input part
            hr = self.u.emit("MatMul", [self.h, self.rd["h"]], self.shape)
            hr = self._add(hr, self.consts["rbh"])
            xw = self.u.emit("MatMul", [self.x, self.wd["h"]], self.shape)
            pre = self._add(self._add(xw, self.consts["wbh"]), self._mul(r, hr))
        else:  # (r * h) R_h, both biases with the input part
            rh = self.u.emit("MatMul", [self._mul(r, self.h), self.rd["h"]], self.shape)
            pre = self._add(self._input_part("h"), rh)
        cand = self.u.activate(g_act, self._clipped(pre))
        # h' = (1 - z) * cand + z * h = cand + z * (h - cand)
        diff = self.u.emit("Sub", [self.h, cand], self.shape)
        return self._add(cand, self._mul(z, diff))

    def rnn(self, fns: list[str]) -> Value:
        return self.u.activate(fns[0], self._gate("i"))


def _outputs(ctx: _Ctx, u: _Unroller, ys, hs, cs, layout: int, seq: int, batch: int, hidden: int) -> None:
    """Y [seq, dirs, batch, hidden] (batch-first: [batch, seq, dirs, hidden]), Y_h and Y_c [dirs, batch, hidden]
    (batch-first: [batch, dirs, hidden]), each only where the model reads it."""
    dirs = len(ys)
    y, y_h, y_c = (list(ctx.outputs) + [None] * 3)[:3]

    def reshaped(v: Value, shape: tuple[int, ...]) -> Value:
        return u.emit("Reshape", [v], shape, {"shape": list(shape)})

    def concat(parts: list[Value], axis: int, out: Value | None = None) -> Value:
        if len(parts) == 1:
            return parts[0] if out is None else u.emit("Identity", parts, out.shape, out=out)
        shape = list(parts[0].shape)
        shape[axis] = sum(p.shape[axis] for p in parts)
        return u.emit("Concat", parts, tuple(shape), {"axis": axis}, out=out)

    if y is not None:
        one = (batch, 1, 1, hidden) if layout else (1, 1, batch, hidden)
        d_axis, t_axis = (2, 1) if layout else (1, 0)
        concat([concat([reshaped(ys[d][t], one) for d in range(dirs)], d_axis) for t in range(seq)], t_axis, y)
    for state, out in ((hs, y_h), (cs, y_c)):
        if out is not None and state[0] is not None:
            one = (batch, 1, hidden) if layout else (1, batch, hidden)
            concat([reshaped(s, one) for s in state], 1 if layout else 0, out)


RECURRENT = {"LSTM": recurrent, "GRU": recurrent, "RNN": recurrent}
