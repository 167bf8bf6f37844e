"""Builds an ONNX file of the BERT encoder in model.safetensors + config.json
(sentence-transformers' all-MiniLM-L6-v2, as cached by scripts/fetch_minilm.sh), laid
out the way PyTorch's TorchScript exporter (torch.onnx.export, opset 17) writes a
transformers BertModel:

  inputs  input_ids, attention_mask, token_type_ids: int64 [batch, sequence]
  output  last_hidden_state: float32 [batch, sequence, hidden]

  embeddings   Gather(word) + Gather(token_type) + Gather(position, Slice of the
               position_ids buffer by Shape) -> LayerNormalization
  mask         Unsqueeze(1), Unsqueeze(2), Cast(float), Sub(1, m), Mul(float32 min)
  per layer    MatMul+Add (Q, K, V; weights stored pre-transposed as onnx::MatMul_N),
               Reshape (shape from Shape/Gather/Unsqueeze/Concat) + Transpose into heads,
               MatMul, Div(sqrt(head_dim)), Add(mask), Softmax(-1), MatMul,
               Transpose + Reshape back, MatMul+Add, Add residual, LayerNormalization,
               MatMul+Add, GELU as Div(sqrt 2), Erf, Add(1), Mul(x), Mul(0.5),
               MatMul+Add, Add residual, LayerNormalization

No PyTorch is needed: the graph is written with onnx.helper from the safetensors
(parsed by hand). The result is checked with onnxruntime against a numpy forward
pass on a padded batch. The pooler is left out (the sentence embedding is the
masked mean of last_hidden_state).

Usage: make_minilm_onnx.py [--dir DIR] [--out FILE] [--force]
  DIR defaults to ${TESSERA_DATA:-~/.cache/tessera}/minilm, FILE to DIR/model.onnx.
  A stamp (FILE.stamp: hashes of the inputs and of this script) makes reruns instant.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import struct
import sys
import time

import numpy as np

OPSET = 17
F32_MIN = float(np.finfo(np.float32).min)


def load_safetensors(path: str) -> dict[str, np.ndarray]:
    dtypes = {"F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32}
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, v in header.items():
        if name == "__metadata__":
            continue
        s, e = v["data_offsets"]
        out[name] = np.frombuffer(data[base + s:base + e], dtype=dtypes[v["dtype"]]).reshape(v["shape"])
    return out


class Builder:
    def __init__(self):
        self.nodes = []
        self.inits = []
        self.n = 0

    def name(self, prefix: str) -> str:
        self.n += 1
        return f"/{prefix}_{self.n}"

    def node(self, op, inputs, prefix=None, **attrs):
        from onnx import helper

        out = self.name(prefix or op)
        self.nodes.append(helper.make_node(op, inputs, [out], name=out.replace("_", "/", 1) + "/" + op, **attrs))
        return out

    def const(self, value, dtype=None):
        """A Constant node, as the exporter writes scalars and shape pieces."""
        from onnx import helper, numpy_helper

        arr = np.asarray(value, dtype=dtype)
        out = self.name("Constant")
        self.nodes.append(helper.make_node("Constant", [], [out], name=out + "/Constant",
                                           value=numpy_helper.from_array(arr, out)))
        return out

    def init(self, name, arr):
        from onnx import numpy_helper

        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), name))
        return name


def build(W: dict[str, np.ndarray], cfg: dict):
    import onnx
    from onnx import TensorProto, helper

    hidden = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    head_dim = hidden // heads
    eps = float(cfg.get("layer_norm_eps", 1e-12))
    if cfg.get("hidden_act", "gelu") != "gelu":
        raise SystemExit(f"hidden_act {cfg['hidden_act']} not supported")
    b = Builder()
    mm = [0]

    def linear(x, prefix):
        # torch.nn.Linear on a 3-D input: MatMul with the transposed weight, then Add bias.
        mm[0] += 1
        w = b.init(f"onnx::MatMul_{1000 + mm[0]}", W[prefix + ".weight"].T)
        bias = b.init(prefix + ".bias", W[prefix + ".bias"])
        return b.node("Add", [bias, b.node("MatMul", [x, w])])

    def layer_norm(x, prefix):
        g = b.init(prefix + ".weight", W[prefix + ".weight"])
        beta = b.init(prefix + ".bias", W[prefix + ".bias"])
        return b.node("LayerNormalization", [x, g, beta], axis=-1, epsilon=eps)

    def dim(x, i):
        # Shape -> Gather(i) -> Unsqueeze(0): a 1-element int64 tensor, as the exporter does.
        s = b.node("Shape", [x])
        g = b.node("Gather", [s, b.const(i, np.int64)], axis=0)
        return b.node("Unsqueeze", [g, b.const([0], np.int64)])

    # Embeddings.
    word = b.node("Gather", [b.init("embeddings.word_embeddings.weight", W["embeddings.word_embeddings.weight"]),
                             "input_ids"])
    tt = b.node("Gather", [b.init("embeddings.token_type_embeddings.weight",
                                  W["embeddings.token_type_embeddings.weight"]), "token_type_ids"])
    emb = b.node("Add", [word, tt])
    pos_ids_buf = b.init("embeddings.position_ids",
                         W.get("embeddings.position_ids",
                               np.arange(cfg["max_position_embeddings"], dtype=np.int64)[None]).astype(np.int64))
    seq = dim("input_ids", 1)
    pos_ids = b.node("Slice", [pos_ids_buf, b.const([0], np.int64), seq, b.const([1], np.int64),
                               b.const([1], np.int64)])
    pos = b.node("Gather", [b.init("embeddings.position_embeddings.weight",
                                   W["embeddings.position_embeddings.weight"]), pos_ids])
    h = layer_norm(b.node("Add", [emb, pos]), "embeddings.LayerNorm")

    # Extended attention mask: (1 - mask[:, None, None, :]) * finfo(float32).min
    m = b.node("Unsqueeze", ["attention_mask", b.const([1], np.int64)])
    m = b.node("Unsqueeze", [m, b.const([2], np.int64)])
    m = b.node("Cast", [m], to=TensorProto.FLOAT)
    m = b.node("Sub", [b.const(1.0, np.float32), m])
    mask = b.node("Mul", [m, b.const(F32_MIN, np.float32)])

    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}"

        def heads_of(x, perm):
            shape = b.node("Concat", [dim(x, 0), dim(x, 1), b.const([heads], np.int64),
                                      b.const([head_dim], np.int64)], axis=0)
            return b.node("Transpose", [b.node("Reshape", [x, shape])], perm=perm)

        q = heads_of(linear(h, p + ".attention.self.query"), [0, 2, 1, 3])
        k = heads_of(linear(h, p + ".attention.self.key"), [0, 2, 3, 1])
        v = heads_of(linear(h, p + ".attention.self.value"), [0, 2, 1, 3])
        scores = b.node("Div", [b.node("MatMul", [q, k]), b.const(np.sqrt(head_dim), np.float32)])
        probs = b.node("Softmax", [b.node("Add", [scores, mask])], axis=-1)
        ctx = b.node("Transpose", [b.node("MatMul", [probs, v])], perm=[0, 2, 1, 3])
        shape = b.node("Concat", [dim(ctx, 0), dim(ctx, 1), b.const([hidden], np.int64)], axis=0)
        ctx = b.node("Reshape", [ctx, shape])
        a = linear(ctx, p + ".attention.output.dense")
        h = layer_norm(b.node("Add", [a, h]), p + ".attention.output.LayerNorm")
        x = linear(h, p + ".intermediate.dense")
        e = b.node("Erf", [b.node("Div", [x, b.const(np.sqrt(2.0), np.float32)])])
        g = b.node("Mul", [b.node("Mul", [x, b.node("Add", [e, b.const(1.0, np.float32)])]),
                           b.const(0.5, np.float32)])
        o = linear(g, p + ".output.dense")
        h = layer_norm(b.node("Add", [o, h]), p + ".output.LayerNorm")

    b.nodes.append(helper.make_node("Identity", [h], ["last_hidden_state"], name="/Identity_out"))
    dims = ["batch", "sequence"]
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, dims)
              for n in ("input_ids", "attention_mask", "token_type_ids")]
    outputs = [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, dims + [hidden])]
    graph = helper.make_graph(b.nodes, "main_graph", inputs, outputs, b.inits)
    model = helper.make_model(graph, producer_name="tessera make_minilm_onnx.py",
                              opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def numpy_forward(W, cfg, ids, mask, tt):
    """Straight BERT forward in float64 (the oracle for the ORT check)."""
    from math import erf

    W = {k: v.astype(np.float64) if v.dtype == np.float32 else v for k, v in W.items()}
    hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    hd = hidden // heads
    eps = cfg.get("layer_norm_eps", 1e-12)
    verf = np.vectorize(erf)

    def ln(x, p):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * W[p + ".weight"] + W[p + ".bias"]

    def lin(x, p):
        return x @ W[p + ".weight"].T + W[p + ".bias"]

    B, S = ids.shape
    x = (W["embeddings.word_embeddings.weight"][ids] + W["embeddings.token_type_embeddings.weight"][tt]
         + W["embeddings.position_embeddings.weight"][np.arange(S)][None])
    h = ln(x, "embeddings.LayerNorm")
    add_mask = (1.0 - mask[:, None, None, :].astype(np.float64)) * F32_MIN
    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}"

        def split(t):
            return t.reshape(B, S, heads, hd).transpose(0, 2, 1, 3)

        q, k, v = (split(lin(h, p + ".attention.self." + n)) for n in ("query", "key", "value"))
        s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd) + add_mask
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        ctx = (s @ v).transpose(0, 2, 1, 3).reshape(B, S, hidden)
        h = ln(lin(ctx, p + ".attention.output.dense") + h, p + ".attention.output.LayerNorm")
        x = lin(h, p + ".intermediate.dense")
        x = 0.5 * x * (1.0 + verf(x / np.sqrt(2.0)))
        h = ln(lin(x, p + ".output.dense") + h, p + ".output.LayerNorm")
    return h


def verify(path, W, cfg) -> float:
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    B, S = 2, 24
    ids = rng.integers(1000, cfg["vocab_size"], size=(B, S)).astype(np.int64)
    ids[:, 0] = 101  # [CLS]
    mask = np.ones((B, S), np.int64)
    mask[1, 15:] = 0  # second row padded
    ids[1, 15:] = 0
    tt = np.zeros((B, S), np.int64)
    ref = numpy_forward(W, cfg, ids, mask, tt)
    worst = 0.0
    for level in (ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_ALL):
        so = ort.SessionOptions()
        so.graph_optimization_level = level
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        (got,) = sess.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": tt})
        assert got.shape == (B, S, cfg["hidden_size"]) and got.dtype == np.float32
        worst = max(worst, float(np.abs(got - ref).max()))
    # A second shape, to exercise the dynamic dims.
    (got1,) = sess.run(None, {"input_ids": ids[:1, :7], "attention_mask": mask[:1, :7],
                              "token_type_ids": tt[:1, :7]})
    worst = max(worst, float(np.abs(got1 - numpy_forward(W, cfg, ids[:1, :7], mask[:1, :7], tt[:1, :7])).max()))
    return worst


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=os.path.join(os.environ.get("TESSERA_DATA") or
                                                  os.path.expanduser("~/.cache/tessera"), "minilm"))
    ap.add_argument("--out", default=None)
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args()
    out = args.out or os.path.join(args.dir, "model.onnx")
    st_path, cfg_path = os.path.join(args.dir, "model.safetensors"), os.path.join(args.dir, "config.json")
    for p in (st_path, cfg_path):
        if not os.path.exists(p):
            raise SystemExit(f"{p} missing: run scripts/fetch_minilm.sh first")
    h = hashlib.sha256()
    for p in (st_path, cfg_path, os.path.abspath(__file__)):
        with open(p, "rb") as f:
            h.update(hashlib.sha256(f.read()).digest())
    import onnx

    want = f"{h.hexdigest()} onnx=={onnx.__version__}"
    stamp = out + ".stamp"
    if not args.force and os.path.exists(out) and os.path.exists(stamp) and open(stamp).read().strip() == want:
        print(f"[minilm-onnx] {out} is up to date")
        return 0
    t0 = time.time()
    W = load_safetensors(st_path)
    with open(cfg_path) as f:
        cfg = json.load(f)
    model = build(W, cfg)
    data = model.SerializeToString()
    tmp = out + ".part"
    with open(tmp, "wb") as f:
        f.write(data)
    worst = verify(tmp, W, cfg)
    tol = 1e-4
    if not worst < tol:
        raise SystemExit(f"[minilm-onnx] onnxruntime vs numpy max|diff| {worst:.3g} >= {tol}")
    os.replace(tmp, out)
    with open(stamp, "w") as f:
        f.write(want + "\n")
    print(f"[minilm-onnx] wrote {out} ({len(data) / 1e6:.1f} MB, {len(model.graph.node)} nodes, "
          f"sha256 {hashlib.sha256(data).hexdigest()[:16]}...); onnxruntime vs numpy "
          f"max|diff| {worst:.2e} in {time.time() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
