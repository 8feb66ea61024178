"""The model-loader fuzzer: broken models (tests/model_mutants.py) through compile and, where they compile, run. Each
must end in a TilefarmError (one clear message) or in an artifact that matches onnxruntime wherever onnxruntime runs
the model (non-finite where it is; a NaN or inf weight may come out as the other) or that onnx's full check accepts
where onnxruntime refuses it; never another exception, a hang, or memory the model's numbers drive.

CI runs 150 mutants, the same ones every run (tests/fuzzing.py); `TILEFARM_FUZZ_EXAMPLES=20000` runs more by hand."""

from __future__ import annotations

import resource
import signal
from contextlib import contextmanager

import numpy as np
import onnx
import onnxruntime as ort
from hypothesis import event, given

from compiler.artifact.build import compile_model
from compiler.artifact.runtime import Artifact
from compiler.base.errors import TilefarmError
from tests.fuzzing import fuzz_settings
from tests.model_mutants import mutants

HANG_SECONDS = 120
MAX_GROWTH_BYTES = 1 << 30  # how much one case may raise the process's peak memory


@contextmanager
def _deadline(seconds: int, what: str):
    def expired(*_):
        raise AssertionError(f"hang: still running after {seconds} s ({what})")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _peak_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _onnxruntime(data: bytes, feeds: dict[str, np.ndarray]) -> list[np.ndarray] | str:
    """onnxruntime's outputs, or why it refuses the model (then it is not one to compare on)."""
    try:
        return ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    except Exception as e:  # noqa: BLE001
        return str(e).splitlines()[0]


def _standard_refuses(data: bytes) -> str | None:
    """Why onnx's full check rejects the model, if it does."""
    try:
        onnx.checker.check_model(onnx.load_model_from_string(data), full_check=True)
        return None
    except Exception as e:  # noqa: BLE001
        return str(e).splitlines()[0]


def _as_compiled(data: bytes, inputs: list[dict]) -> bytes:
    """The model with its inputs' dims as the artifact took them: a dim of 0 or -1 is dynamic to tilefarm (paddle2onnx
    and keras2onnx write them so), which onnx's checker and onnxruntime would read as a size."""
    model = onnx.load_model_from_string(data)
    shapes = {i["name"]: i["shape"] for i in inputs}
    for vi in model.graph.input:
        if vi.name in shapes and vi.type.tensor_type.HasField("shape"):
            for d, size in zip(vi.type.tensor_type.shape.dim, shapes[vi.name]):
                d.Clear()
                d.dim_value = size
    return model.SerializeToString()


@fuzz_settings(150)
@given(mutants())
def test_mutated_models_are_refused_clearly_or_compile_right(tmp_path_factory, case):
    data, what, _ = case
    folder = tmp_path_factory.mktemp("mutant") / "model"
    folder.mkdir()
    (folder.parent / "outside.bin").write_bytes(b"\0" * 64)  # what a location outside the model's folder would find
    (folder / "m.onnx").write_bytes(data)
    peak = _peak_bytes()
    with _deadline(HANG_SECONDS, what):
        try:
            compile_model(folder / "m.onnx", folder / "m.tar")
        except TilefarmError as e:
            event(f"refused: {type(e).__name__}")
            assert "Traceback" not in str(e), what
            return
        except Exception as e:
            raise AssertionError(f"{what}: {type(e).__name__}: {e}") from e
        art = Artifact.load(folder / "m.tar")
        rng = np.random.default_rng(0)
        feeds = {i["name"]: rng.standard_normal(i["shape"]).astype(i["dtype"]) for i in art.meta["inputs"]}
        try:
            got = art.run(feeds)
        except TilefarmError as e:
            event(f"run refused: {type(e).__name__}")
            return
    assert _peak_bytes() - peak <= MAX_GROWTH_BYTES, f"{what}: peak memory grew by {(_peak_bytes() - peak) >> 20} MiB"
    data = _as_compiled(data, art.meta["inputs"])
    want = _onnxruntime(data, feeds)
    if isinstance(want, str):  # compiled: the standard must accept what onnxruntime refuses (exporters' wrong output
        # shapes make the reverse common: onnxruntime runs what onnx's full check rejects)
        why = _standard_refuses(data)
        assert why is None, f"{what}: compiled a model onnxruntime ({want}) and onnx's full check ({why}) reject"
        event("compiled; onnxruntime refuses")
        return
    event("compiled and compared")
    for (name, g), w in zip(got.items(), want):
        assert g.shape == w.shape and g.dtype == w.dtype, (
            f"{what}: {name} {g.dtype}{g.shape}, onnxruntime {w.dtype}{w.shape}"
        )
        if w.dtype.kind != "f":
            np.testing.assert_array_equal(g, w, err_msg=f"{what}: {name}")
            continue
        # a NaN or inf weight gives non-finite results at the same places, but which of NaN and ±inf depends on the
        # order of the arithmetic (BatchNormalization folded into a scale and a shift meets inf - inf where
        # onnxruntime's (x - mean) * scale does not): the places must agree, the finite values within tolerance
        finite = np.isfinite(w)
        np.testing.assert_array_equal(np.isfinite(g), finite, err_msg=f"{what}: {name}: non-finite elsewhere")
        scale = max(1.0, float(np.max(np.abs(w[finite])))) if finite.any() else 1.0
        np.testing.assert_allclose(g[finite], w[finite], rtol=0, atol=1e-4 * scale, err_msg=f"{what}: {name}")
