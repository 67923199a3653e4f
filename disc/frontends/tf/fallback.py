"""TensorFlow ops disc does not lower, run in TensorFlow between compiled segments.

An op outside the table (or one whose operands the table refuses, say a ``Cumsum`` with
``exclusive``) becomes one ``host_call`` per output, ``host="tensorflow"``; its result types
come from TensorFlow's own shape inference on the traced graph (a dim TensorFlow does not know
is a fresh symbol, read from the result at run time). ``TfCall`` runs the NodeDef alone, as a
concrete function of its operands, once per execution for all its outputs. The executors hold
PyTorch tensors, so a program with such calls runs where PyTorch is installed; it cannot be saved
(a saved program runs without TensorFlow).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from disc.frontends.arrays import to_numpy, to_torch
from disc.frontends.tf.importer import TF_DTYPES, TfImporter
from disc.ir.builder import LoweringError
from disc.ir.graph import Node

_DISC_TO_TF = {v: k for k, v in TF_DTYPES.items()}


class TfCall:
    """One output of one TensorFlow op, run by TensorFlow on the executor's tensors."""

    def __init__(self, node_def: Any, operand_dtypes: Sequence[str], output_index: int, n_outputs: int, shared: dict) -> None:
        self.op_name = node_def.name
        self.op = node_def.op
        self.output_index = output_index
        key = node_def.name
        if key not in shared:  # the outputs of one op share one function
            shared[key] = _single_op_function(node_def, operand_dtypes, n_outputs)
        self.fn = shared[key]

    def call(self, values: Sequence[Any], results: dict | None = None) -> Any:
        if results is not None and self.op_name in results:
            outs = results[self.op_name]
        else:
            import tensorflow as tf

            outs = self.fn(*[tf.convert_to_tensor(to_numpy(v)) for v in values])
            outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
            if results is not None:
                results[self.op_name] = outs
        return to_torch(np.array(outs[self.output_index].numpy()))  # a writable copy: TensorFlow's buffer is its own

    def to_json(self) -> dict[str, Any]:
        raise ValueError(f"{self.op_name} ({self.op}) runs in TensorFlow, and a saved program runs without TensorFlow")


def _single_op_function(node_def: Any, operand_dtypes: Sequence[str], n_outputs: int) -> Any:
    """``node_def`` alone as a concrete function of one placeholder per operand."""
    import tensorflow as tf

    gd = tf.compat.v1.GraphDef()
    names = []
    for i, dtype in enumerate(operand_dtypes):
        ph = gd.node.add()
        ph.name, ph.op = f"disc_operand_{i}", "Placeholder"
        ph.attr["dtype"].type = _DISC_TO_TF[dtype]
        names.append(ph.name)
    op = gd.node.add()
    op.CopyFrom(node_def)
    op.device = ""
    del op.input[:]
    op.input.extend(names)

    def build() -> None:
        tf.graph_util.import_graph_def(gd, name="")

    wrapped = tf.compat.v1.wrap_function(build, [])
    g = wrapped.graph
    return wrapped.prune(
        [g.get_tensor_by_name(f"{n}:0") for n in names], [g.get_tensor_by_name(f"{op.name}:{k}") for k in range(n_outputs)]
    )


def host_calls(
    imp: TfImporter, node: Any, operands: Sequence[Any], outputs: Sequence[tuple[str, tuple[int | None, ...] | None]], reason: str
) -> list[Node]:
    """``node`` as ``host_call`` nodes, one per output: ``outputs`` are TensorFlow's (dtype, dims)."""
    tensors = [imp.tensor(v) for v in operands]
    shared: dict = imp.host_functions
    results = []
    for k, (dtype, dims) in enumerate(outputs):
        if dtype not in _DISC_TO_TF:
            raise LoweringError(f"output {k} is {dtype}, which disc does not hold")
        if dims is None:
            raise LoweringError(f"TensorFlow does not know the rank of output {k}")
        key = f"{node.name}#{k}"
        imp.host_calls[key] = TfCall(node, [t.dtype for t in tensors], k, len(outputs), shared)
        c = imp.graph.constraints
        shape = [
            d if d is not None else c.new_symbol("t", source=f"output {k} of {node.name} ({node.op}), run in TensorFlow") for d in dims
        ]
        attrs = {
            "host": "tensorflow",
            "call": key,
            "target": node.op,
            "reason": reason,
            "dtype": dtype,
            "shape": tuple(str(d) for d in shape),
        }
        out = imp.graph.add("host_call", tensors, attrs)
        imp.register_dims(out)
        results.append(out)
    imp.host_counts[node.op] = imp.host_counts.get(node.op, 0) + 1
    return results
