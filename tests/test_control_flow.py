"""If, Loop and Scan run in the artifact's native entry (and in run_in_process), compared with onnxruntime: data-
dependent branches with captured values and nested control flow, loops with a run-time trip count, a greedy decoder
whose condition ends it early (its output's length is the one it ran), Scan in every direction and axis, a Keras LSTM
in the Loop form tf2onnx writes; and the clear errors where a shape would depend on the data."""

from __future__ import annotations

import ctypes

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from compiler.artifact.build import build, run_in_process
from compiler.artifact.runtime import Artifact, ArtifactError
from compiler.base.errors import InvalidModel, TilefarmError, UnsupportedOp
from compiler.model.onnx_import import load

F = T.FLOAT


def _model(nodes, inputs, outputs, inits=(), opset=17) -> onnx.ModelProto:
    g = h.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(a, n) for n, a in inits])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    onnx.checker.check_model(m)
    return m


def _check(model: onnx.ModelProto, feeds_list, tmp_path, shapes=None):
    """Artifact and run_in_process against onnxruntime for every feed; returns the artifact's outputs."""
    graph = load(model, shapes)
    build(graph, tmp_path / "m.tar")
    art = Artifact.load(tmp_path / "m.tar")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    results = []
    for feeds in feeds_list:
        want = sess.run(None, feeds)
        for got in (art.run(feeds), run_in_process(graph, feeds)):
            for (name, g), w in zip(got.items(), want):
                assert g.shape == w.shape and g.dtype == w.dtype, name
                if w.dtype.kind in "iub":
                    np.testing.assert_array_equal(g, w, err_msg=name)
                else:
                    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=name)
        results.append(art.run(feeds))
    return art, results


def _vi(name, elem, shape):
    return h.make_tensor_value_info(name, elem, shape)


def test_data_dependent_if_with_captured_values_nested_if_passthrough_and_constant(tmp_path):
    # then: relu(x) + y, and (nested If on c2) either x or a constant; else: y - x, and x itself
    inner = h.make_node(
        "If", ["c2"], ["t1"],
        then_branch=h.make_graph([h.make_node("Identity", ["x"], ["i1"])], "it", [], [_vi("i1", F, [2, 3])]),
        else_branch=h.make_graph([h.make_node("Constant", [], ["i2"], value=numpy_helper.from_array(
            np.full((2, 3), 7.0, np.float32)))], "ie", [], [_vi("i2", F, [2, 3])]),
    )  # fmt: skip
    then = h.make_graph([h.make_node("Relu", ["x"], ["r"]), h.make_node("Add", ["r", "y"], ["t0"]), inner], "then", [],
                        [_vi("t0", F, [2, 3]), _vi("t1", F, [2, 3])])  # fmt: skip
    other = h.make_graph([h.make_node("Sub", ["y", "x"], ["e0"]), h.make_node("Identity", ["x"], ["e1"])], "else", [],
                         [_vi("e0", F, [2, 3]), _vi("e1", F, [2, 3])])  # fmt: skip
    model = _model(
        [h.make_node("Mul", ["x", "x"], ["x2"]), h.make_node("If", ["c"], ["a", "b"], then_branch=then,
                                                             else_branch=other, name="top_if"),
         h.make_node("Add", ["a", "x2"], ["out"])],
        [_vi("x", F, [2, 3]), _vi("y", F, [2, 3]), _vi("c", T.BOOL, []), _vi("c2", T.BOOL, [])],
        [_vi("out", F, [2, 3]), _vi("b", F, [2, 3])],
    )  # fmt: skip
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal((2, 3)).astype(np.float32)
    feeds = [{"x": x, "y": y, "c": np.array(c), "c2": np.array(c2)} for c in (True, False) for c2 in (True, False)]
    _check(model, feeds, tmp_path)


def _power_loop(trips_input: bool) -> onnx.ModelProto:
    """v <- v * 0.5 + w (w captured from outside), M times; no scan output."""
    body = h.make_graph(
        [h.make_node("Mul", ["v_in", "half"], ["m"]), h.make_node("Add", ["m", "w"], ["v_out"]),
         h.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [_vi("i", T.INT64, []), _vi("cond_in", T.BOOL, []), _vi("v_in", F, [4])],
        [_vi("cond_out", T.BOOL, []), _vi("v_out", F, [4])],
        [numpy_helper.from_array(np.array(0.5, np.float32), "half")],
    )  # fmt: skip
    inputs = [_vi("v0", F, [4]), _vi("w", F, [4])] + ([_vi("M", T.INT64, [])] if trips_input else [])
    inits = [] if trips_input else [("M", np.array(5, np.int64))]
    return _model([h.make_node("Loop", ["M", "", "v0"], ["v"], body=body)], inputs, [_vi("v", F, [4])], inits)


def test_loop_with_a_run_time_trip_count_and_a_captured_value(tmp_path):
    rng = np.random.default_rng(1)
    v0, w = rng.standard_normal(4).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    _check(_power_loop(True), [{"v0": v0, "w": w, "M": np.array(m, np.int64)} for m in (0, 1, 7)], tmp_path)


def test_loop_with_a_constant_trip_count(tmp_path):
    rng = np.random.default_rng(2)
    v0, w = rng.standard_normal(4).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    _check(_power_loop(False), [{"v0": v0, "w": w}], tmp_path)


def _greedy_decoder(max_len=8, hidden=6, vocab=5, eos=3) -> onnx.ModelProto:
    """A greedy RNN decoder: h <- tanh(h Wh + E[token]); token <- argmax(h Wo); stops after emitting `eos`; the
    tokens are the scan output (at most max_len of them)."""
    rng = np.random.default_rng(3)
    wh = (rng.standard_normal((hidden, hidden)) * 0.8).astype(np.float32)
    emb = rng.standard_normal((vocab, hidden)).astype(np.float32)
    wo = rng.standard_normal((hidden, vocab)).astype(np.float32)
    body = h.make_graph(
        [
            h.make_node("MatMul", ["h_in", "wh"], ["hw"]),
            h.make_node("Gather", ["emb", "tok_in"], ["e"], axis=0),
            h.make_node("Add", ["hw", "e"], ["pre"]),
            h.make_node("Tanh", ["pre"], ["h_out"]),
            h.make_node("MatMul", ["h_out", "wo"], ["logits"]),
            h.make_node("ArgMax", ["logits"], ["tok_out"], axis=1, keepdims=0),
            h.make_node("Identity", ["tok_out"], ["emitted"]),
            h.make_node("Equal", ["tok_out", "eos"], ["done"]),
            h.make_node("Not", ["done"], ["go1"]),
            h.make_node("Squeeze", ["go1"], ["cond_out"]),
        ],
        "body",
        [_vi("i", T.INT64, []), _vi("cond_in", T.BOOL, []), _vi("h_in", F, [1, hidden]), _vi("tok_in", T.INT64, [1])],
        [_vi("cond_out", T.BOOL, []), _vi("h_out", F, [1, hidden]), _vi("tok_out", T.INT64, [1]),
         _vi("emitted", T.INT64, [1])],
        [numpy_helper.from_array(a, n) for n, a in (("wh", wh), ("emb", emb), ("wo", wo),
                                                     ("eos", np.array([eos], np.int64)))],
    )  # fmt: skip
    return _model(
        [h.make_node("Loop", ["M", "go", "h0", "bos"], ["h", "last", "tokens"], body=body, name="decode")],
        [_vi("h0", F, [1, hidden]), _vi("bos", T.INT64, [1])],
        [_vi("h", F, [1, hidden]), _vi("last", T.INT64, [1]), _vi("tokens", T.INT64, ["n", 1])],
        [("M", np.array(max_len, np.int64)), ("go", np.array(True))],
    )


def test_greedy_decoder_loop_ends_early_and_reports_the_length_it_ran(tmp_path):
    model = _greedy_decoder()
    rng = np.random.default_rng(4)
    feeds = [{"h0": rng.standard_normal((1, 6)).astype(np.float32) * 2, "bos": np.array([t], np.int64)}
             for t in range(1, 5) for _ in range(3)]  # fmt: skip
    art, results = _check(model, feeds, tmp_path)
    lengths = {len(r["tokens"]) for r in results}
    assert min(lengths) < 8 and max(lengths) == 8, lengths  # the condition ended some runs early, not all
    assert art.meta["outputs"][2]["shape"] == [8, 1] and "length_at" in art.meta["outputs"][2]
    # a C caller reads the same length from the workspace
    rows = art._lib.tilefarm_output_rows
    rows.restype, rows.argtypes = ctypes.c_int64, [ctypes.c_void_p, ctypes.c_int]
    art.run(feeds[0])
    assert rows(art._workspace.ctypes.data, 2) == len(results[0]["tokens"])
    assert rows(art._workspace.ctypes.data, 0) == 1


@pytest.mark.parametrize("in_axis,in_dir,out_axis,out_dir", [(0, 0, 0, 0), (1, 1, 1, 0), (1, 0, 0, 1), (0, 1, 1, 1)])
def test_scan_in_every_direction_and_axis(tmp_path, in_axis, in_dir, out_axis, out_dir):
    """A running sum (state) and a scaled copy of each slice (scan output), over 3 slices of 2."""
    body = h.make_graph(
        [h.make_node("Add", ["s_in", "piece"], ["s_out"]), h.make_node("Mul", ["piece", "k"], ["scaled"])],
        "body", [_vi("s_in", F, [2]), _vi("piece", F, [2])], [_vi("s_out", F, [2]), _vi("scaled", F, [2])],
    )  # fmt: skip
    x_shape = [2, 3] if in_axis == 1 else [3, 2]
    model = _model(
        [h.make_node("Scan", ["s0", "x"], ["s", "ys"], body=body, num_scan_inputs=1, scan_input_axes=[in_axis],
                     scan_input_directions=[in_dir], scan_output_axes=[out_axis], scan_output_directions=[out_dir])],
        [_vi("s0", F, [2]), _vi("x", F, x_shape), _vi("k", F, [2])], [_vi("s", F, [2]), _vi("ys", F, ["a", "b"])],
    )  # fmt: skip
    rng = np.random.default_rng(5)
    feeds = {"s0": rng.standard_normal(2).astype(np.float32), "x": rng.standard_normal(x_shape).astype(np.float32),
             "k": rng.standard_normal(2).astype(np.float32)}  # fmt: skip
    _check(model, [feeds], tmp_path)


def _keras_lstm_as_tf2onnx_loop(seq=5, batch=2, feat=3, units=4) -> onnx.ModelProto:
    """A Keras LSTM (return_sequences) in the form tf2onnx writes one its LSTM rewriter does not match: a Loop over
    time whose body gathers step i of the time-major input, computes the gates (i, f, c, o, Keras' order) with
    MatMuls, and carries h and c; the scan output is h per step."""
    rng = np.random.default_rng(6)
    kernel = (rng.standard_normal((feat, 4 * units)) * 0.5).astype(np.float32)
    recurrent = (rng.standard_normal((units, 4 * units)) * 0.5).astype(np.float32)
    bias = (rng.standard_normal(4 * units) * 0.1).astype(np.float32)
    body = h.make_graph(
        [
            h.make_node("Gather", ["x_tm", "i"], ["x_t"], axis=0),
            h.make_node("MatMul", ["x_t", "kernel"], ["xk"]),
            h.make_node("MatMul", ["h_in", "recurrent"], ["hr"]),
            h.make_node("Add", ["xk", "hr"], ["z0"]),
            h.make_node("Add", ["z0", "bias"], ["z"]),
            h.make_node("Split", ["z", "split"], ["zi", "zf", "zc", "zo"], axis=1),
            h.make_node("Sigmoid", ["zi"], ["gi"]),
            h.make_node("Sigmoid", ["zf"], ["gf"]),
            h.make_node("Tanh", ["zc"], ["gc"]),
            h.make_node("Sigmoid", ["zo"], ["go"]),
            h.make_node("Mul", ["gf", "c_in"], ["fc"]),
            h.make_node("Mul", ["gi", "gc"], ["ic"]),
            h.make_node("Add", ["fc", "ic"], ["c_out"]),
            h.make_node("Tanh", ["c_out"], ["tc"]),
            h.make_node("Mul", ["go", "tc"], ["h_out"]),
            h.make_node("Identity", ["h_out"], ["h_seq"]),
            h.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "lstm_body",
        [_vi("i", T.INT64, []), _vi("cond_in", T.BOOL, []), _vi("h_in", F, [batch, units]),
         _vi("c_in", F, [batch, units])],
        [_vi("cond_out", T.BOOL, []), _vi("h_out", F, [batch, units]), _vi("c_out", F, [batch, units]),
         _vi("h_seq", F, [batch, units])],
        [numpy_helper.from_array(a, n) for n, a in (("kernel", kernel), ("recurrent", recurrent), ("bias", bias),
                                                     ("split", np.array([units] * 4, np.int64)))],
    )  # fmt: skip
    zeros = np.zeros((batch, units), np.float32)
    return _model(
        [h.make_node("Transpose", ["x"], ["x_tm"], perm=[1, 0, 2]),
         h.make_node("Loop", ["M", "true", "h0", "c0"], ["h", "c", "hs"], body=body, name="lstm_loop"),
         h.make_node("Transpose", ["hs"], ["y"], perm=[1, 0, 2])],
        [_vi("x", F, [batch, seq, feat])], [_vi("y", F, [batch, seq, units]), _vi("h", F, [batch, units])],
        [("M", np.array(seq, np.int64)), ("true", np.array(True)), ("h0", zeros), ("c0", zeros)], opset=13,
    )  # fmt: skip


def test_keras_lstm_in_tf2onnx_loop_form(tmp_path):
    x = np.random.default_rng(7).standard_normal((2, 5, 3)).astype(np.float32)
    art, _ = _check(_keras_lstm_as_tf2onnx_loop(), [{"x": x}], tmp_path)
    assert "length_at" not in art.meta["outputs"][0]  # a loop that always runs M times has a static output


# ---------------------------------------------------------------------------------------------- errors


def test_branches_that_disagree_on_a_shape_are_refused_naming_the_node():
    then = h.make_graph([h.make_node("Identity", ["x"], ["t"])], "t", [], [_vi("t", F, [2, 3])])
    other = h.make_graph([h.make_node("ReduceSum", ["x"], ["e"], keepdims=0)], "e", [], [_vi("e", F, [])])
    model = _model([h.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other, name="shape_if")],
                   [_vi("x", F, [2, 3]), _vi("c", T.BOOL, [])], [_vi("y", F, ["d"])])  # fmt: skip
    with pytest.raises(InvalidModel, match="If node 'shape_if'.*depends on the data"):
        load(model)


def test_a_loop_carried_value_that_changes_shape_is_refused():
    body = h.make_graph(
        [h.make_node("Concat", ["v_in", "v_in"], ["v_out"], axis=0),
         h.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [_vi("i", T.INT64, []), _vi("cond_in", T.BOOL, []), _vi("v_in", F, [None])],
        [_vi("cond_out", T.BOOL, []), _vi("v_out", F, [None])],
    )  # fmt: skip
    model = _model([h.make_node("Loop", ["M", "", "v0"], ["v"], body=body, name="grow")],
                   [_vi("v0", F, [2]), _vi("M", T.INT64, [])], [_vi("v", F, ["n"])])  # fmt: skip
    with pytest.raises(InvalidModel, match="Loop node 'grow'.*'v0' from float32\\[2\\] into float32\\[4\\]"):
        load(model)


def test_a_scan_output_needs_a_constant_trip_count():
    model = _greedy_decoder()
    model.graph.initializer.pop(0)  # M becomes an input
    model.graph.input.append(_vi("M", T.INT64, []))
    with pytest.raises(InvalidModel, match="Loop node 'decode': scan output 'tokens'.*constant M"):
        load(model)


def test_a_bounded_scan_output_read_by_another_node_is_refused():
    model = _greedy_decoder()
    model.graph.node.append(h.make_node("Add", ["tokens", "bos"], ["plus"], name="after"))
    model.graph.output.append(_vi("plus", T.INT64, ["n", 1]))
    with pytest.raises(InvalidModel, match="Add node 'after' reads 'tokens'.*only as a graph output"):
        load(model)


def test_an_unsupported_op_inside_a_branch_is_listed_with_the_rest():
    then = h.make_graph([h.make_node("Det", ["x"], ["t"], name="det_in_then")], "t", [], [_vi("t", F, [])])
    other = h.make_graph([h.make_node("ReduceSum", ["x"], ["e"], keepdims=0)], "e", [], [_vi("e", F, [])])
    model = _model(
        [h.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other),
         h.make_node("Unique", ["x"], ["u"], name="top_unique")],
        [_vi("x", F, [3, 3]), _vi("c", T.BOOL, [])], [_vi("y", F, []), _vi("u", F, ["n"])],
    )  # fmt: skip
    with pytest.raises(UnsupportedOp) as e:
        load(model)
    assert e.value.ops == {"Det": ["det_in_then"], "Unique": ["top_unique"]}


def test_a_branch_that_cannot_compile_for_these_shapes_fails_the_run_that_takes_it(tmp_path):
    # else reshapes x (2 x 3) to 4 x 2: impossible for these shapes, so only a run that takes it fails
    other = h.make_graph([h.make_node("Reshape", ["x", "shape"], ["e"])], "e", [], [_vi("e", F, [2, 3])],
                         [numpy_helper.from_array(np.array([4, 2], np.int64), "shape")])  # fmt: skip
    then = h.make_graph([h.make_node("Neg", ["x"], ["t"])], "t", [], [_vi("t", F, [2, 3])])
    model = h.make_model(h.make_graph(
        [h.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other, name="guarded")],
        "g", [_vi("x", F, [2, 3]), _vi("c", T.BOOL, [])], [_vi("y", F, [2, 3])]),
        opset_imports=[h.make_opsetid("", 17)])  # fmt: skip
    graph = load(model)
    build(graph, tmp_path / "m.tar")
    art = Artifact.load(tmp_path / "m.tar")
    x = np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(art.run({"x": x, "c": np.array(True)})["y"], -x)
    with pytest.raises(ArtifactError, match="If node 'guarded' took a branch that was not compiled"):
        art.run({"x": x, "c": np.array(False)})
    with pytest.raises(TilefarmError, match="If node 'guarded'"):
        run_in_process(graph, {"x": x, "c": np.array(False)})
