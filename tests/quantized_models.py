"""Float ONNX models quantized as onnxruntime's quantizer does it, for the int8 tests: `quantize_qdq`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quant_pre_process, quantize_static


class Calibration(CalibrationDataReader):
    """onnxruntime's calibration reader over a list of arrays for one input."""

    def __init__(self, name: str, arrays: list[np.ndarray]):
        self.feeds = iter([{name: a} for a in arrays])

    def get_next(self):
        return next(self.feeds, None)


def quantize_qdq(
    tmp_path: Path,
    model: onnx.ModelProto,
    shape,
    rng: np.random.Generator,
    per_channel: bool = True,
    act: QuantType = QuantType.QInt8,
    weight: QuantType = QuantType.QInt8,
) -> onnx.ModelProto:
    """`model` (one input, of `shape`) quantized by quantize_static in QDQ form, after onnxruntime's pre-processing
    (BatchNormalization folded into the convs), calibrated on 4 standard normal inputs drawn from `rng`."""
    name = model.graph.input[0].name
    src, pre, out = tmp_path / "f.onnx", tmp_path / "pre.onnx", tmp_path / "q.onnx"
    onnx.save(model, str(src))
    quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)
    calib = [rng.standard_normal(shape).astype(np.float32) for _ in range(4)]
    quantize_static(str(pre), str(out), Calibration(name, calib), quant_format=QuantFormat.QDQ,
                    per_channel=per_channel, activation_type=act, weight_type=weight)  # fmt: skip
    return onnx.load(str(out))


def small_input(model: onnx.ModelProto, size: int) -> onnx.ModelProto:
    """An example model on size x size images (its convs and global pool take any size)."""
    for d in model.graph.input[0].type.tensor_type.shape.dim[2:]:
        d.dim_value = size
    return model
