"""One-node-family ONNX models for onnxruntime-web's side of web/tests/bench_peers.mjs
(issue #21's browser cases), every input a graph input so the bench can hand them over
already on the GPU:
  chain.onnx   y = relu(tanh(exp(x * 2 + 1)) * x) over x [N]
  conv.onnx    y = conv2d(x [N, C, H, W], w [O, C, 3, 3]), padding 1, stride 1
  tiny.onnx    y = x + 1 over x [1]
Run with the project's venv (scripts/setup_python.sh installs onnx):
  .venv/bin/python web/tests/make_peer_models.py web/tests/fixtures/peers
"""
import sys
from pathlib import Path

import onnx
from onnx import TensorProto, helper


def save(graph, path):
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="tessera-bench")
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)


def const(name, value):
    return helper.make_tensor(name, TensorProto.FLOAT, [], [value])


def main(out):
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    f = TensorProto.FLOAT
    x = helper.make_tensor_value_info("x", f, ["n"])
    y = helper.make_tensor_value_info("y", f, ["n"])
    nodes = [
        helper.make_node("Mul", ["x", "two"], ["a"]),
        helper.make_node("Add", ["a", "one"], ["b"]),
        helper.make_node("Exp", ["b"], ["c"]),
        helper.make_node("Tanh", ["c"], ["d"]),
        helper.make_node("Mul", ["d", "x"], ["e"]),
        helper.make_node("Relu", ["e"], ["y"]),
    ]
    save(helper.make_graph(nodes, "chain", [x], [y], [const("two", 2.0), const("one", 1.0)]), out / "chain.onnx")

    xs = helper.make_tensor_value_info("x", f, ["n", "c", "h", "w"])
    ws = helper.make_tensor_value_info("w", f, ["o", "c", 3, 3])
    ys = helper.make_tensor_value_info("y", f, ["n", "o", "h", "w"])
    conv = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], kernel_shape=[3, 3])
    save(helper.make_graph([conv], "conv", [xs, ws], [ys]), out / "conv.onnx")

    x1 = helper.make_tensor_value_info("x", f, [1])
    y1 = helper.make_tensor_value_info("y", f, [1])
    save(helper.make_graph([helper.make_node("Add", ["x", "one"], ["y"])], "tiny", [x1], [y1], [const("one", 1.0)]),
         out / "tiny.onnx")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "web/tests/fixtures/peers")
