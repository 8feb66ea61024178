"""ONNX conformance: every backend test case that onnx ships (node, pytorch-converted, pytorch-operator) whose ops the
frontend converts, compiled with the default schedules and run, against the outputs ONNX ships with it.

Only the cases in UNSUPPORTED are skipped, each with its reason; a per-op table is printed at the end (conftest.py)."""

from __future__ import annotations

import fnmatch

import numpy as np
import pytest
from onnx_cases import KINDS, as_array, case_data, case_model, conformance_cases, is_supported, load_case

from compiler.artifact.build import run_in_process

# test name (a glob, matched case-insensitively) → why tilefarm does not pass it
UNSUPPORTED: dict[str, str] = {
    **dict.fromkeys(
        ["*float16*", "*fp16*", "*bf16*", "test_attention_24_qk_matmul_output_mode3_softmax_precision*"],
        "dtype float16/bfloat16: not a tilefarm dtype (yet)",
    ),
    **dict.fromkeys(["*float8*", "*float4*"], "dtype float8/float4 (e4m3, e5m2, e8m0, e2m1): not a tilefarm dtype"),
    **dict.fromkeys(["*int4*", "*int2*"], "dtype (u)int4/(u)int2: packed sub-byte integers are not a tilefarm dtype"),
    "*_int16*": "dtype int16: not a tilefarm dtype",
    # [!b]: BitShift's cases (test_bitshift_*) do run: uint16/uint32/uint64 are dtypes for BitShift and data movement
    **dict.fromkeys(["test_[!b]*uint16*", "test_[!b]*uint32*", "test_[!b]*uint64*"],
                    "dtype uint16/uint32/uint64: the arithmetic ops take int8/uint8/int32/int64 (BitShift takes all)"),
    "*_string*": "dtype string: tilefarm computes numbers",
    **dict.fromkeys(["test_*quantizelinear_e4m3fn*", "test_*quantizelinear_e5m2"],
                    "dtype float8 (e4m3fn, e5m2) as the quantized type: tilefarm quantizes to int8/uint8"),
    "test_*quantizelinear_blocked*": "blocked quantization (block_size): tilefarm quantizes per tensor or per axis",
    "test_identity_sequence": "sequence input: tilefarm compiles tensors only",
    "test_identity_opt": "optional input: tilefarm compiles tensors only",
    "test_if_opt": "optional output: tilefarm compiles tensors only",
    **dict.fromkeys(["test_loop13_seq", "test_loop16_seq_none", "test_if_seq"],
                    "sequence values carried by a Loop or given by an If: tilefarm compiles tensors only"),
    "test_loop11": "Slice bounds computed from the iteration number (x[i:i+1]): a run-time slice position is not "
                   "compiled (a Gather of the iteration number is)",
    "test_scan_sum": "Scan-8 (a batch axis on every input): onnx's version converter does not upgrade it to Scan-9",
    "test_training_dropout*": "training mode: Dropout is compiled for inference (Identity)",
    "test_batchnorm_*_training_mode": "training mode: BatchNormalization's running statistics are not computed",
    "test_maxpool_with_argmax_*": "extra outputs: the test reads MaxPool's Indices; tilefarm computes only Y",
    "test_resize_downsample_*_antialias": "Resize antialias=1 (antialiased downscaling) is not implemented",
    **dict.fromkeys(["test_resize_downsample_scales_*_align_corners"],
                    "Resize align_corners by a scale whose output length rounds down: onnx's data divides by scale * n "
                    "- 1, onnxruntime and PyTorch by the output's length - 1, as tilefarm does"),
    **dict.fromkeys(["test_scatter_elements_with_reduction_mul", "test_scatternd_multiply"],
                    "Scatter reduction='mul': the tensor language has no product reduction"),
}  # fmt: skip


def unsupported_reason(name: str) -> str | None:
    return next((why for pat, why in UNSUPPORTED.items() if fnmatch.fnmatch(name.lower(), pat.lower())), None)


def cases():
    return [
        pytest.param(kind, case.name, id=case.name)
        for kind in KINDS
        for case in conformance_cases(kind)
        if is_supported(case_model(case))
    ]


def find(kind: str, name: str):
    return next(c for c in conformance_cases(kind) if c.name == name)


# each case's rtol and atol are the onnx backend runner's (1e-3 and 1e-7 unless the case says otherwise); integer and
# bool outputs are compared exactly
def check_output(name: str, got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> None:
    want = np.asarray(want)
    same = got.shape == want.shape and got.dtype == want.dtype
    assert same, f"{name}: {got.dtype}{list(got.shape)}, want {want.dtype}{list(want.shape)}"
    if want.dtype.kind == "f":
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True, err_msg=name)
    else:
        np.testing.assert_array_equal(got, want, err_msg=name)


@pytest.mark.parametrize("kind, name", cases())
def test_conformance(kind, name, record_property):
    case = find(kind, name)
    model = case_model(case)
    record_property("onnx_ops", sorted({n.op_type for n in model.graph.node}))
    reason = unsupported_reason(name)
    if reason:
        pytest.skip(reason)
    for inputs, expected in case_data(case):
        g, feeds = load_case(model, inputs)
        got = run_in_process(g, feeds)
        for out, want in zip(model.graph.output, expected):
            check_output(out.name, got[out.name], as_array(want), case.rtol, case.atol)


def test_every_unsupported_entry_names_a_case():
    """A pattern that matches nothing is stale: the case was renamed or removed."""
    names = [p.values[1] for p in cases()]
    assert [pat for pat in UNSUPPORTED if not any(fnmatch.fnmatch(n.lower(), pat.lower()) for n in names)] == []
