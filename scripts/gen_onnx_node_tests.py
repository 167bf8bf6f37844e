"""Writes onnx's node test cases (onnx.backend.test.case.node.collect_testcases())
in the official backend-test layout:

    OUT/<case_name>/model.onnx
    OUT/<case_name>/test_data_set_N/input_K.pb, output_K.pb

Values are serialized as onnx's own cmd_tools.generate_data does: TensorProto for
tensors, SequenceProto (numpy_helper.from_list) for sequences, OptionalProto
(numpy_helper.from_optional) for optionals, MapProto for maps.

Usage: gen_onnx_node_tests.py OUT
"""

from __future__ import annotations

import os
import shutil
import sys
import time
import warnings


def _serialize(value, type_proto, name: str) -> bytes:
    from onnx import TensorProto, numpy_helper

    if type_proto.HasField("map_type"):
        return numpy_helper.from_dict(value, name).SerializeToString()
    if type_proto.HasField("sequence_type"):
        return numpy_helper.from_list(value, name).SerializeToString()
    if type_proto.HasField("optional_type"):
        return numpy_helper.from_optional(value, name).SerializeToString()
    if isinstance(value, TensorProto):
        return value.SerializeToString()
    return numpy_helper.from_array(value, name).SerializeToString()


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = sys.argv[1]
    t0 = time.time()
    # The case generators compute some references with deliberate overflows/inf.
    warnings.filterwarnings("ignore", category=RuntimeWarning)
    import onnx
    from onnx.backend.test.case import node as node_cases

    cases = node_cases.collect_testcases()
    tmp = out + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    names = set()
    n_sets = 0
    for case in cases:
        if case.kind != "node" or case.model is None or not case.data_sets:
            continue
        if case.name in names:
            raise SystemExit(f"duplicate case name {case.name}")
        names.add(case.name)
        cdir = os.path.join(tmp, case.name)
        os.makedirs(cdir)
        with open(os.path.join(cdir, "model.onnx"), "wb") as f:
            f.write(case.model.SerializeToString())
        g = case.model.graph
        for i, (inputs, outputs) in enumerate(case.data_sets):
            ddir = os.path.join(cdir, f"test_data_set_{i}")
            os.makedirs(ddir)
            for j, v in enumerate(inputs):
                with open(os.path.join(ddir, f"input_{j}.pb"), "wb") as f:
                    f.write(_serialize(v, g.input[j].type, g.input[j].name))
            for j, v in enumerate(outputs):
                with open(os.path.join(ddir, f"output_{j}.pb"), "wb") as f:
                    f.write(_serialize(v, g.output[j].type, g.output[j].name))
            n_sets += 1
    # Swap in the finished tree only once it is complete.
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    print(
        f"[onnx-node-tests] wrote {len(names)} cases ({n_sets} data sets) "
        f"from onnx {onnx.__version__} to {out} in {time.time() - t0:.1f}s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
