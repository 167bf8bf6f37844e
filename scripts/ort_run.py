"""Runs an ONNX model in onnxruntime (CPU, graph optimisations off) on the inputs in a
directory and writes its outputs beside them: DIR/input_K.pb -> DIR/output_K.pb
(serialized TensorProtos, the layout of ONNX's backend tests). The tests use it as the
oracle for models Tessera exports.

usage: .venv/bin/python scripts/ort_run.py model.onnx DIR
"""
import os
import sys

import onnx
import onnxruntime as ort
from onnx import numpy_helper


def main():
    model, d = sys.argv[1], sys.argv[2]
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    feeds = {}
    for i, inp in enumerate(s.get_inputs()):
        t = onnx.TensorProto()
        with open(os.path.join(d, f"input_{i}.pb"), "rb") as f:
            t.ParseFromString(f.read())
        feeds[inp.name] = numpy_helper.to_array(t)
    outs = s.run(None, feeds)
    for k, (o, v) in enumerate(zip(s.get_outputs(), outs)):
        with open(os.path.join(d, f"output_{k}.pb"), "wb") as f:
            f.write(numpy_helper.from_array(v, o.name).SerializeToString())


if __name__ == "__main__":
    main()
