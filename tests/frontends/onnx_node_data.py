"""Write ONNX's node test cases (``onnx.backend.test.case.node``) as test data, the layout the
backend test runner reads (``node/<case>/model.onnx``, ``test_data_set_0/input_*.pb``, ``output_*.pb``).

    python tests/frontends/onnx_node_data.py [DATA_DIR]    # default: the installed onnx package's data dir

The onnx wheel ships the model tests (simple, pytorch-*, light) but not the node tests; ONNX's
reference implementation computes their expected outputs here, once.
"""

from __future__ import annotations

import os
import sys

import onnx.backend.test.case.node as node_cases
from onnx import numpy_helper
from onnx.backend.test.loader import DATA_DIR


def write(data_dir: str = DATA_DIR) -> int:
    written = 0
    for case in node_cases.collect_testcases():
        folder = os.path.join(data_dir, case.kind, case.name)
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "model.onnx"), "wb") as f:
            f.write(case.model.SerializeToString())
        for i, (inputs, outputs) in enumerate(case.data_sets):
            sets = os.path.join(folder, f"test_data_set_{i}")
            os.makedirs(sets, exist_ok=True)
            for kind, values, infos in (("input", inputs, case.model.graph.input), ("output", outputs, case.model.graph.output)):
                for j, value in enumerate(values):
                    if not hasattr(value, "dtype"):  # sequences, maps, optionals: disc runs tensors only
                        continue
                    with open(os.path.join(sets, f"{kind}_{j}.pb"), "wb") as f:
                        f.write(numpy_helper.from_array(value, infos[j].name if j < len(infos) else "").SerializeToString())
        written += 1
    return written


def ensure(data_dir: str = DATA_DIR) -> None:
    """Write the node cases once into ``data_dir/node``: into a folder of this process's own,
    renamed into place, so test workers starting together never read a half-written case."""
    import shutil

    final = os.path.join(data_dir, "node")
    if os.path.isdir(final):
        return
    scratch = os.path.join(data_dir, f"node-writing-{os.getpid()}")
    write(scratch)
    try:
        os.rename(os.path.join(scratch, "node"), final)
    except OSError:  # another worker got there first
        pass
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    print(f"{write(*sys.argv[1:])} node test cases written")
