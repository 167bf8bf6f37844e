"""Checks a model that `train_mnist --export-onnx` wrote: onnxruntime classifies the
2,000 test digits of data/mnist.bin (one at a time, standardised as the demo does) and
the accuracy must match the demo's own within half a percent.

usage: .venv/bin/python scripts/check_mnist_onnx.py model.onnx data/mnist.bin ACCURACY [cnn|mlp]
"""
import struct
import sys

import numpy as np
import onnxruntime as ort


def main():
    model, data, expect = sys.argv[1], sys.argv[2], float(sys.argv[3])
    cnn = len(sys.argv) > 4 and sys.argv[4] == "cnn"
    raw = open(data, "rb").read()
    assert raw[:8] == b"TMNIST01", "not a TMNIST01 file"
    n, rows, cols, _ = struct.unpack("<4I", raw[8:24])
    labels = np.frombuffer(raw, np.uint8, n, 24)
    px = np.frombuffer(raw, np.uint8, n * rows * cols, 24 + n).reshape(n, rows * cols)
    s = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    name = s.get_inputs()[0].name
    correct = 0
    test = range(8000, n)
    for i in test:
        x = (px[i].astype(np.float32) / 255.0 - 0.1307) / 0.3081
        x = x.reshape(1, 1, rows, cols) if cnn else x.reshape(1, rows * cols)
        correct += int(np.argmax(s.run(None, {name: x})[0]) == labels[i])
    acc = correct / len(test)
    print(f"onnxruntime {ort.__version__}: {model} classifies {acc:.4f} of {len(test)} test digits (Tessera: {expect:.4f})")
    if abs(acc - expect) > 0.005:
        sys.exit("the exported model disagrees with Tessera's own accuracy")


if __name__ == "__main__":
    main()
