"""`tilefarm quantize`: a float ONNX model quantized by onnxruntime's quantization tools (the `quantize` extra) —
static QDQ with calibration on the user's inputs, or dynamic — and its outputs compared with the float model's.

Static quantization writes uint8 activations and int8 weights (U8S8, what onnxruntime advises on x86, and the form
whose chains it and tilefarm's fold_qdq both run as integer ops), after onnxruntime's pre-processing (shape
inference, BatchNormalization folded into convs). Dynamic quantization writes DynamicQuantizeLinear + MatMulInteger
(transformers)."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from compiler.base.errors import InvalidModel, MissingExtra

METHODS = ("minmax", "entropy", "percentile")
EXTRA = "pip install 'tilefarm[quantize]' (onnxruntime's quantization tools)"


@dataclass(frozen=True)
class Agreement:
    """How one output of the quantized model compares with the float model's over the calibration samples."""

    output: str
    max_abs_diff: float
    step: float | None  # the output's quantization step (None: a dynamic model's float output has none)
    within_step: float | None  # fraction of elements within one step

    def __str__(self) -> str:
        if self.step is None:
            return f"{self.output}: max |diff| {self.max_abs_diff:.4g}"
        return (
            f"{self.output}: max |diff| {self.max_abs_diff:.4g}, {100 * self.within_step:.2f}% of elements within "
            f"one output step ({self.step:.4g})"
        )


def _ort():
    try:
        import onnxruntime
        import onnxruntime.quantization as quantization
    except ImportError:
        raise MissingExtra(f"tilefarm quantize needs onnxruntime, which is not installed: {EXTRA}") from None
    return onnxruntime, quantization


def _read_model(path: Path) -> onnx.ModelProto:
    if not path.is_file():
        raise InvalidModel(f"no such model file: {path}")
    try:
        return onnx.load(str(path))
    except Exception as e:
        raise InvalidModel(f"{path} is not an ONNX model ({type(e).__name__}: {e})") from None


def _graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    inits = {t.name for t in model.graph.initializer}
    return [vi for vi in model.graph.input if vi.name not in inits]


def read_calibration(path: Path, model: onnx.ModelProto) -> list[dict[str, np.ndarray]]:
    """The feeds of a .npz holding one array per model input, each N samples stacked along its first (batch) axis;
    one feed per sample, or per batch where the model fixes its batch size. Missing or unknown names, ranks, fixed
    dims and sample counts are checked."""
    if not path.is_file():
        raise InvalidModel(f"no such calibration file: {path}")
    try:
        with np.load(str(path), allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except Exception as e:
        raise InvalidModel(f"{path} is not a .npz of arrays ({type(e).__name__}: {e})") from None
    inputs = _graph_inputs(model)
    names = [vi.name for vi in inputs]
    missing = [n for n in names if n not in arrays]
    if missing:
        raise InvalidModel(
            f"{path.name} has no array for input {', '.join(map(repr, missing))}; it holds "
            f"{', '.join(map(repr, arrays)) or 'nothing'}, the model's inputs are {', '.join(map(repr, names))}"
        )
    unknown = [k for k in arrays if k not in names]
    if unknown:
        raise InvalidModel(f"{path.name} holds {', '.join(map(repr, unknown))}, which the model has no input of")
    counts, batches = set(), set()
    for vi in inputs:
        a = arrays[vi.name]
        dims = [
            d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in vi.type.tensor_type.shape.dim
        ]
        if a.ndim != len(dims) or any(d is not None and d != s for d, s in zip(dims[1:], a.shape[1:])):
            want = ", ".join("N" if i == 0 else str(d or "?") for i, d in enumerate(dims))
            raise InvalidModel(
                f"{path.name}: {vi.name!r} has shape {list(a.shape)}; the model takes [{want}] (N samples)"
            )
        if a.dtype.kind != "f":
            raise InvalidModel(f"{path.name}: {vi.name!r} is {a.dtype}; calibration inputs are float")
        if not np.isfinite(a).all():
            raise InvalidModel(f"{path.name}: {vi.name!r} holds NaN or inf")
        counts.add(a.shape[0])
        batches.add(dims[0] or 1)
    if len(counts) > 1 or 0 in counts:
        raise InvalidModel(f"{path.name}: every input needs the same number (> 0) of samples; got {sorted(counts)}")
    elem = {vi.name: onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type) for vi in inputs}
    n, batch = counts.pop(), max(batches)
    if n % batch:
        raise InvalidModel(f"{path.name}: the model takes batches of {batch}, so N must be a multiple of it; got {n}")
    return [{k: arrays[k][i : i + batch].astype(elem[k]) for k in names} for i in range(0, n, batch)]


class _Reader:
    """onnxruntime's CalibrationDataReader over the samples."""

    def __init__(self, samples: list[dict[str, np.ndarray]]):
        self.feeds = iter(samples)

    def get_next(self):
        return next(self.feeds, None)

    def rewind(self):  # onnxruntime's readers may be rewound by some calibrators
        pass


def quantize(
    model_path: Path,
    output: Path,
    calibration: Path | None,
    per_channel: bool = False,
    method: str = "minmax",
    dynamic: bool = False,
) -> list[Agreement]:
    """Quantize the model at `model_path` to `output`; its agreement with the float model on the calibration
    samples (none when dynamic without them)."""
    ort, q = _ort()
    if method not in METHODS:
        raise InvalidModel(f"unknown calibration method {method!r}; choose from {', '.join(METHODS)}")
    if not dynamic and calibration is None:
        raise InvalidModel("static quantization needs --calibration data.npz (or use --dynamic)")
    model = _read_model(model_path)
    samples = read_calibration(calibration, model) if calibration is not None else []
    try:
        if dynamic:
            q.quantize_dynamic(str(model_path), str(output), per_channel=per_channel, weight_type=q.QuantType.QInt8)
        else:
            _static(q, model_path, output, samples, per_channel, method)
    except (ValueError, RuntimeError, onnx.checker.ValidationError) as e:
        raise InvalidModel(f"onnxruntime could not quantize {model_path.name}: {e}") from None
    return agreement(ort, model_path, output, samples)


def _static(q, model_path: Path, output: Path, samples, per_channel: bool, method: str) -> None:
    methods = {"minmax": q.CalibrationMethod.MinMax, "entropy": q.CalibrationMethod.Entropy,
               "percentile": q.CalibrationMethod.Percentile}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "pre.onnx"
        try:
            q.quant_pre_process(str(model_path), str(source), skip_symbolic_shape=True)
        except Exception:  # pre-processing only helps (BatchNormalization folded); the model quantizes without it
            source = model_path
        q.quantize_static(str(source), str(output), _Reader(samples), quant_format=q.QuantFormat.QDQ,
                          per_channel=per_channel, activation_type=q.QuantType.QUInt8,
                          weight_type=q.QuantType.QInt8, calibrate_method=methods[method])  # fmt: skip


def _output_steps(model: onnx.ModelProto) -> dict[str, float]:
    """Each graph output given by a DequantizeLinear with a constant one-value scale: that scale."""
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    steps = {}
    for n in model.graph.node:
        if n.op_type == "DequantizeLinear" and n.input[1] in inits and inits[n.input[1]].size == 1:
            steps[n.output[0]] = float(inits[n.input[1]].reshape(()))
    return {o.name: steps[o.name] for o in model.graph.output if o.name in steps}


def agreement(ort, float_path: Path, int8_path: Path, samples) -> list[Agreement]:
    if not samples:
        return []
    float_sess = ort.InferenceSession(str(float_path), providers=["CPUExecutionProvider"])
    int8_sess = ort.InferenceSession(str(int8_path), providers=["CPUExecutionProvider"])
    steps = _output_steps(onnx.load(str(int8_path)))
    names = [o.name for o in float_sess.get_outputs()]
    diffs: dict[str, list[np.ndarray]] = {n: [] for n in names}
    for feed in samples:
        for n, f, i in zip(names, float_sess.run(None, feed), int8_sess.run(None, feed)):
            diffs[n].append(np.abs(np.asarray(i, np.float64) - np.asarray(f, np.float64)).reshape(-1))
    out = []
    for n in names:
        d = np.concatenate(diffs[n])
        step = steps.get(n)
        within = float((d <= step * (1 + 1e-6)).mean()) if step is not None else None
        out.append(Agreement(n, float(d.max()) if d.size else 0.0, step, within))
    return out
