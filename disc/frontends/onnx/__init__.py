"""The ONNX frontend: an ONNX model compiled once for all its shapes.

    import disc.onnx
    prog = disc.onnx.compile("bert.onnx")                  # a path, bytes or a ModelProto
    logits, = prog(ids, mask)                               # numpy arrays in, numpy arrays out
    logits, = prog(input_ids=ids, attention_mask=mask)     # or by input name

Dims named by a ``dim_param`` become symbols (one name, one symbol, wherever it appears);
unnamed unknown dims get a symbol of their own; ``dynamic={"ids": {0: "batch"}}`` names or
replaces dims (an int pins one); ``constraints`` as for ``disc.compile``. Import
(``importer.py``, op table ``ops.py``) builds disc's IR with the core's ``GraphBuilder``; an
op outside the table is an error naming the op type, the node and the opset before anything
runs. Where PyTorch is installed the program runs through the same driver and executors as the
PyTorch frontend's; where it is not, the native CPU program is built, written and opened through
``disc_runtime`` (numpy alone). Either way ``prog.save(folder)`` writes a program that
``disc_runtime`` runs with numpy alone.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from disc.errors import CompileError
from disc.frontends.arrays import NeedsValue, apply_constraints, bind_inputs, compile_array_graph, to_numpy
from disc.frontends.onnx import narrow
from disc.frontends.onnx.importer import OnnxImporter, add_inputs
from disc.frontends.onnx.ops import OPS
from disc.frontends.onnx.ops.sequence import EMPTY_OPTIONAL, SequenceValue
from disc.ir.builder import LoweringError

__all__ = ["OnnxProgram", "ValueSpecializedProgram", "compile", "import_model", "supported_ops"]


def supported_ops() -> list[str]:
    """The ONNX op types this frontend lowers."""
    return sorted(OPS)


def _load(model: Any) -> Any:
    import onnx

    if isinstance(model, (str, os.PathLike)):
        path = Path(model)
        if not path.is_file():
            raise CompileError(f"disc.onnx.compile: no ONNX file at {str(path)!r}")
        return onnx.load(str(path))
    if isinstance(model, (bytes, bytearray)):
        return onnx.load_from_string(bytes(model))
    if isinstance(model, onnx.ModelProto):
        return model
    raise CompileError(f"disc.onnx.compile takes a path, bytes or an onnx.ModelProto, not {type(model).__name__}")


def import_model(
    model: Any,
    dynamic: Mapping[str, Mapping[int, str | int]] | None = None,
    values: Mapping[str, Any] | None = None,
    sequences: Mapping[str, list[tuple[str, int]]] | None = None,
    optionals: Mapping[str, bool] | None = None,
) -> tuple[OnnxImporter, list[str], list[str]]:
    """``model``'s main graph as disc IR: the importer (its ``graph``), input names, output names.
    ``values``: inputs given at compile time (they are constants of the program, not its inputs).
    ``sequences``: each sequence input's elements' (dtype, rank); its elements become inputs. A
    sequence output becomes one program output per element (``imp.output_groups`` counts them).
    ``optionals``: whether each optional input is given; an empty optional output is None."""
    from onnx import numpy_helper

    proto = _load(model)
    opset = max((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), default=13)
    if opset < 9 and _uses(proto.graph, "Scan"):
        raise CompileError(f"opset {opset}: Scan before opset 9 (a batch axis and sequence_lens) has no later form onnx.version_converter keeps; disc takes opset 9's Scan on")
    if opset < 13:  # the table follows opset 13 on: older models are converted first
        from onnx import version_converter

        try:
            proto = version_converter.convert_version(proto, 13)
        except Exception as e:
            raise CompileError(f"opset {opset}: disc's ONNX frontend takes opset 13 or newer, and onnx.version_converter could not convert this model ({type(e).__name__}: {e})") from None
        opset = 13
    g = proto.graph
    imp = OnnxImporter(g.name or "onnx_model", opset)
    initializers = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    try:
        inputs = add_inputs(imp, g, set(initializers), dict(dynamic or {}), values, sequences, optionals)
    except LoweringError as e:
        raise CompileError(str(e)) from None
    imp.values.update(initializers)
    imp.run_nodes(g.node)
    outputs = [o.name for o in g.output]
    narrow.carry_edges(imp, inputs, outputs)  # ONNX's narrow types leave as their carriers (narrow.py)
    flat, imp.output_groups = [], []
    try:
        for name in outputs:
            v = imp.values[name]
            if v is EMPTY_OPTIONAL:
                imp.output_groups.append(0)  # given as None
                continue
            parts = list(v.items) if isinstance(v, SequenceValue) else [v]
            flat += [imp.tensor(p) for p in parts]
            imp.output_groups.append(len(parts) if isinstance(v, SequenceValue) else None)
    except LoweringError as e:
        raise CompileError(f"an output of the model: {e}") from None
    imp.graph.outputs = flat
    return imp, inputs, outputs


def _uses(graph: Any, op_type: str) -> bool:
    """Whether ``graph`` or a subgraph of its nodes holds an ``op_type`` node."""
    for node in graph.node:
        if node.op_type == op_type or any(_uses(a.g, op_type) for a in node.attribute if a.HasField("g")):
            return True
    return False


class OnnxProgram:
    """A compiled ONNX model: call it with the graph's inputs (positional, in the graph's order,
    or by name), numpy arrays or torch tensors; returns the outputs in the graph's order, as
    numpy arrays (torch tensors if the inputs were). Stateless: safe from several threads.

    Where PyTorch is installed the program runs through the same executors as the PyTorch
    frontend's (ops the code generator refuses can run in PyTorch between compiled segments);
    where it is not, the native CPU program runs through the standalone runtime (``disc_runtime``).

    ONNX's narrow types (float8, float4, int4, int2...) are ``ml_dtypes`` arrays here, in and out
    (torch's float8 dtypes for torch tensors, the integer ones as their carriers), and travel
    inside the program in a carrier dtype (u8 bits; the value in i8 or u8 for the integer ones,
    ``narrow.py``); a saved program takes and gives the carriers, as bf16 travels as uint16 bits."""

    def __init__(self, runner: Any, input_names: list[str], output_names: list[str], report: Any, output_groups: list[int | None] | None = None) -> None:
        self.runner = runner
        self.input_names = input_names
        self.output_names = output_names
        self.report = report
        self.output_groups = output_groups or [None] * len(output_names)  # a sequence output: its length (0: an empty optional)

    @property
    def graph(self) -> Any:
        return self.report.graph

    def __call__(self, *args: Any, **kwargs: Any) -> list[Any]:
        flat = self.runner.run(self.input_names, bind_inputs(self.input_names, args, kwargs))
        if all(k is None for k in self.output_groups):
            return flat
        out, at = [], 0
        for k in self.output_groups:  # a sequence output as a list of its elements; 0: an empty optional
            out.append(flat[at] if k is None else None if k == 0 else list(flat[at : at + k]))
            at += 1 if k is None else k
        return out

    def save(self, folder: str | os.PathLike) -> Path:
        """Write the program; ``disc.load`` (with PyTorch) or ``disc_runtime.load`` (numpy only) runs it."""
        return self.runner.save(folder)


class ValueSpecializedProgram:
    """An ONNX model compiled at its first call and again per new key (the last ``MAX_VERSIONS``
    versions are kept), the other inputs keeping their symbolic shapes:

    - a model that uses some inputs' *values* as shapes, axes or counts (a ``Reshape`` whose
      shape, a ``ReduceSum`` whose axes, a ``Trilu`` whose k the caller passes) is compiled for
      those values, as constants. Pass ``values={"shape": ...}`` to ``disc.onnx.compile`` to
      compile (and save) one version ahead;
    - a model that takes sequences is compiled per sequence length (and elements' dtypes and
      ranks): each element becomes an input of that version. Call it with a list of arrays;
    - a model that takes optionals is compiled per which of them are given (None: not given)."""

    MAX_VERSIONS = 8

    def __init__(self, proto: Any, input_names: list[str], output_names: list[str], needed: str | None, options: dict[str, Any]) -> None:
        self.proto = proto
        self.input_names = input_names
        self.output_names = output_names
        self.value_inputs = [needed] if needed else []  # grows when a version finds another such input
        self.optional_inputs = [i.name for i in proto.graph.input if i.type.HasField("optional_type")]
        self.sequence_inputs = [i.name for i in proto.graph.input if i.type.HasField("sequence_type") or (i.type.HasField("optional_type") and i.type.optional_type.elem_type.HasField("sequence_type"))]
        self.options = options
        self.versions: OrderedDict[tuple, OnnxProgram] = OrderedDict()
        self.compilations = 0
        self._lock = threading.Lock()

    def _version(self, bound: dict[str, Any]) -> OnnxProgram:
        from disc.errors import InputError
        from disc.ir.types import dtype_of_numpy

        given = {n: bound[n] is not None for n in self.optional_inputs}
        structure: dict[str, list[tuple[str, int]]] = {}
        for n in self.sequence_inputs:
            if bound[n] is None and n in given:
                continue  # an empty optional sequence
            if not isinstance(bound[n], (list, tuple)):
                raise InputError(f"input {n!r} is a sequence: give a list of arrays, not {type(bound[n]).__name__}")
            try:
                structure[n] = [(dtype_of_numpy(np.asarray(a).dtype), np.ndim(a)) for a in bound[n]]
            except TypeError as e:
                raise InputError(f"input {n!r}: {e}") from None
        with self._lock:
            while True:
                arrays = {n: to_numpy(bound[n]) if hasattr(bound[n], "detach") else np.asarray(bound[n]) for n in self.value_inputs}
                key = tuple((n, a.dtype.str, a.shape, a.tobytes()) for n, a in arrays.items()) + tuple(sorted((n, tuple(s)) for n, s in structure.items())) + tuple(sorted(given.items()))
                prog = self.versions.get(key)
                if prog is not None:
                    self.versions.move_to_end(key)
                    return prog
                try:
                    prog = _compile(self.proto, arrays, sequences=structure, optionals=given, **self.options)
                except NeedsValue as e:  # another input is used as a shape too
                    if e.input in self.value_inputs:  # given, yet not taken as a value: never loop
                        raise CompileError(str(e)) from None
                    self.value_inputs.append(e.input)
                    continue
                self.compilations += 1
                self.versions[key] = prog
                if len(self.versions) > self.MAX_VERSIONS:
                    self.versions.popitem(last=False)
                return prog

    def __call__(self, *args: Any, **kwargs: Any) -> list[Any]:
        bound = dict(zip(self.input_names, bind_inputs(self.input_names, args, kwargs)))
        prog = self._version(bound)
        for n in self.sequence_inputs:  # each element is an input of this version
            if bound[n] is not None:
                bound.update({f"{n}[{i}]": a for i, a in enumerate(bound.pop(n))})
        return prog(*(bound[n] for n in prog.input_names))

    def save(self, folder: str | os.PathLike) -> Path:
        if self.sequence_inputs or self.optional_inputs:
            raise CompileError(f"this model takes sequence or optional input(s) {self.sequence_inputs + self.optional_inputs}, so it is compiled per call structure; a saved program takes tensors")
        raise CompileError(
            f"this model uses the values of input(s) {self.value_inputs} as shapes, so it is compiled per value; "
            f"compile with disc.onnx.compile(model, values={{{self.value_inputs[0]!r}: ...}}) to save the program for those values"
        )


def compile(
    model: Any,
    dynamic: Mapping[str, Mapping[int, str | int]] | None = None,
    constraints: Any = None,
    backend: str | None = None,
    values: Mapping[str, Any] | None = None,
) -> OnnxProgram | ValueSpecializedProgram:
    """Compile an ONNX model (a path, bytes or ``onnx.ModelProto``) once for every shape.

    ``values``: inputs fixed at compile time (they leave the program's inputs). A model that
    uses an input's values as a shape compiles at its first call instead, for those values
    (``ValueSpecializedProgram``)."""
    proto = _load(model)
    names = [i.name for i in proto.graph.input if i.name not in {t.name for t in proto.graph.initializer}]
    options = {"dynamic": dynamic, "constraints": constraints, "backend": backend}
    if any(i.type.HasField("sequence_type") or i.type.HasField("optional_type") for i in proto.graph.input):  # compiled per structure, at the first call
        if values:
            raise CompileError(f"values= for a model that takes sequence or optional inputs: it is compiled per call structure, at each first call, from the inputs given then (given values {sorted(values)})")
        return ValueSpecializedProgram(proto, names, [o.name for o in proto.graph.output], None, options)
    try:
        return _compile(proto, values, dynamic, constraints, backend)
    except NeedsValue as e:
        if values:
            raise CompileError(f"{e}; give it in values= too") from None
        return ValueSpecializedProgram(proto, names, [o.name for o in proto.graph.output], e.input, options)


def _compile(
    proto: Any, values: Mapping[str, Any] | None, dynamic: Any, constraints: Any, backend: str | None,
    sequences: Mapping[str, list[tuple[str, int]]] | None = None, optionals: Mapping[str, bool] | None = None,
) -> OnnxProgram:
    """One program; NeedsValue where an input not in ``values`` is used as a shape."""
    from disc.shape.user import parse_user_constraints

    start = time.perf_counter()
    ranges, facts = parse_user_constraints(constraints)
    imp, inputs, outputs = import_model(proto, dynamic, values, sequences, optionals)
    apply_constraints(imp.graph, ranges, facts)
    runner, report = compile_array_graph(imp.graph, inputs, len(imp.graph.outputs), "disc.onnx", backend, start)
    runner = narrow.wrap_runner(runner, imp)
    return OnnxProgram(runner, inputs, outputs, report, imp.output_groups)
