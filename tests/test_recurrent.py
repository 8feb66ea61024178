"""Recurrent nets exported from PyTorch (LSTM, GRU, RNN: stacked, bidirectional, batch-first, with initial states)
compiled into artifacts, whose every time step is unrolled (compiler/model/onnx_import/recurrent.py), against
onnxruntime; and the sequence lengths tilefarm cannot unroll refused by name."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch  # the `models` extra: missing, these tests fail rather than skip (as tests/test_torch_models.py)
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from compiler.artifact.build import compile_model
from compiler.artifact.runtime import Artifact
from compiler.base.errors import UnsupportedOp
from compiler.model.onnx_import import load


class Speech(nn.Module):
    """A VAD-like net: a conv front end over features, a 2-layer bidirectional LSTM, a GRU, a per-frame score."""

    def __init__(self):
        super().__init__()
        self.front = nn.Conv1d(8, 16, 3, padding=1)
        self.lstm = nn.LSTM(16, 12, num_layers=2, bidirectional=True, batch_first=True)
        self.gru = nn.GRU(24, 8, batch_first=True)
        self.head = nn.Linear(8, 1)

    def forward(self, x, h0, c0):
        f = torch.relu(self.front(x)).transpose(1, 2)  # [batch, frames, 16]
        y, _ = self.lstm(f, (h0, c0))
        z, _ = self.gru(y)
        return torch.sigmoid(self.head(z)).squeeze(-1)


class Elman(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.RNN(6, 10, nonlinearity="relu")

    def forward(self, x):
        y, h = self.rnn(x)
        return y, h


def _export(model: nn.Module, args: tuple, names: list[str], path) -> onnx.ModelProto:
    torch.manual_seed(0)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model.eval(), args, str(path), input_names=names, opset_version=17, dynamo=False)
    return onnx.load(str(path))


def _compare(proto, feeds: dict[str, np.ndarray], tmp_path) -> None:
    want = ort.InferenceSession(proto.SerializeToString()).run(None, feeds)
    compile_model(proto, tmp_path / "m.tar")
    got = Artifact.load(tmp_path / "m.tar").run(feeds)
    for g, w in zip(got.values(), want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_a_speech_net_with_stacked_bidirectional_lstm_and_gru(tmp_path):
    torch.manual_seed(1)
    args = (torch.randn(1, 8, 20), torch.randn(4, 1, 12), torch.randn(4, 1, 12))
    proto = _export(Speech(), args, ["x", "h0", "c0"], tmp_path / "speech.onnx")
    assert {"LSTM", "GRU"} <= {n.op_type for n in proto.graph.node}
    _compare(proto, {n: a.numpy() for n, a in zip(["x", "h0", "c0"], args)}, tmp_path)


def test_an_elman_rnn_with_relu(tmp_path):
    torch.manual_seed(2)
    x = torch.randn(7, 3, 6)
    proto = _export(Elman(), (x,), ["x"], tmp_path / "rnn.onnx")
    assert "RNN" in {n.op_type for n in proto.graph.node}
    _compare(proto, {"x": x.numpy()}, tmp_path)


def test_sequences_shorter_than_the_input_are_refused_by_name():
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
             for n, s in [("w", (1, 12, 2)), ("r", (1, 12, 3))]]  # fmt: skip
    inits.append(numpy_helper.from_array(np.array([4, 2], np.int32), "lens"))
    node = helper.make_node("LSTM", ["x", "w", "r", "", "lens"], ["y"], hidden_size=3, name="enc")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 2, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)  # fmt: skip
    with pytest.raises(UnsupportedOp, match=r"enc.*sequence_lens \[4, 2\]"):
        load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
