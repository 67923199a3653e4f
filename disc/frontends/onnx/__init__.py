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
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from disc.errors import CompileError, InputError
from disc.frontends.onnx.importer import OnnxImporter, add_inputs
from disc.frontends.onnx.ops import OPS
from disc.ir.builder import LoweringError

__all__ = ["OnnxProgram", "compile", "import_model", "supported_ops"]


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


def _attributes(node: Any) -> dict[str, Any]:
    from onnx import AttributeProto, helper, numpy_helper

    out = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        if a.type == AttributeProto.TENSOR:
            v = numpy_helper.to_array(v)
        elif isinstance(v, bytes):
            v = v.decode()
        elif isinstance(v, list) and v and isinstance(v[0], bytes):
            v = [x.decode() for x in v]
        out[a.name] = v
    return out


def import_model(model: Any, dynamic: Mapping[str, Mapping[int, str | int]] | None = None) -> tuple[OnnxImporter, list[str], list[str]]:
    """``model``'s main graph as disc IR: the importer (its ``graph``), input names, output names."""
    from onnx import numpy_helper

    proto = _load(model)
    opset = max((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), default=13)
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
        inputs = add_inputs(imp, g, set(initializers), dict(dynamic or {}))
    except LoweringError as e:
        raise CompileError(str(e)) from None
    imp.values.update(initializers)
    for k, node in enumerate(g.node):
        where = f"node {node.name or k!r} ({node.op_type}, opset {opset})"
        if node.domain not in ("", "ai.onnx"):
            raise CompileError(f"{where}: operator domain {node.domain!r} is not supported")
        fn = OPS.get(node.op_type)
        if fn is None:
            raise CompileError(f"{where}: {node.op_type} is not supported by disc's ONNX frontend (supported: {', '.join(supported_ops())})")
        operands = [imp.values[name] if name else None for name in node.input]
        try:
            result = fn(imp, node, *operands, **_attributes(node))
        except (LoweringError, ValueError, TypeError, KeyError) as e:
            raise CompileError(f"{where}: {type(e).__name__}: {e}") from None
        results = result if isinstance(result, list) else [result]
        for name, value in zip(node.output, results):
            if name:
                imp.values[name] = value
    outputs = [o.name for o in g.output]
    imp.graph.outputs = [imp.tensor(imp.values[name]) for name in outputs]
    return imp, inputs, outputs


def _to_torch(a: np.ndarray) -> Any:
    import torch

    if a.dtype.name == "bfloat16":  # ml_dtypes' bfloat16 (what onnx uses): the same bits
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _to_numpy(t: Any) -> np.ndarray:
    import torch

    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        import ml_dtypes  # installed with onnx

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _has_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


class OnnxProgram:
    """A compiled ONNX model: call it with the graph's inputs (positional, in the graph's order,
    or by name), numpy arrays or torch tensors; returns the outputs in the graph's order, as
    numpy arrays (torch tensors if the inputs were). Stateless: safe from several threads.

    Where PyTorch is installed the program runs through the same executors as the PyTorch
    frontend's (ops the code generator refuses can run in PyTorch between compiled segments);
    where it is not, the native CPU program runs through the standalone runtime (``disc_runtime``)."""

    def __init__(self, runner: Any, input_names: list[str], output_names: list[str], report: Any) -> None:
        self.runner = runner
        self.input_names = input_names
        self.output_names = output_names
        self.report = report

    @property
    def graph(self) -> Any:
        return self.report.graph

    def __call__(self, *args: Any, **kwargs: Any) -> list[Any]:
        values = list(args)
        for name in self.input_names[len(values) :]:
            if name not in kwargs:
                raise InputError(f"missing input {name!r}; the model's inputs are {self.input_names}")
            values.append(kwargs.pop(name))
        if kwargs:
            raise InputError(f"unexpected input(s) {sorted(kwargs)}; the model's inputs are {self.input_names}")
        if len(values) > len(self.input_names):
            raise InputError(f"{len(values)} inputs given; the model takes {len(self.input_names)} ({self.input_names})")
        return self.runner.run(self.input_names, values)

    def save(self, folder: str | os.PathLike) -> Path:
        """Write the program; ``disc.load`` (with PyTorch) or ``disc_runtime.load`` (numpy only) runs it."""
        return self.runner.save(folder)


def _array(name: str, v: Any) -> np.ndarray:
    try:
        a = np.require(v, requirements=["C", "W"])  # a read-only array is copied: torch tensors are writable
    except Exception as e:
        raise InputError(f"input {name!r}: not an array ({type(v).__name__}: {e})") from None
    if a.dtype == object:
        raise InputError(f"input {name!r}: an array of Python objects, not numbers")
    return a


class _TorchRunner:
    """Runs a ``CompiledModule`` (PyTorch installed): arrays become tensors without a copy."""

    def __init__(self, compiled: Any) -> None:
        self.compiled = compiled

    def run(self, names: list[str], values: list[Any]) -> list[Any]:
        import torch

        as_torch = any(isinstance(v, torch.Tensor) for v in values)
        tensors = [v if isinstance(v, torch.Tensor) else _to_torch(_array(name, v)) for name, v in zip(names, values)]
        outs = self.compiled(*tensors)
        outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
        return outs if as_torch else [_to_numpy(o) for o in outs]

    def save(self, folder: str | os.PathLike) -> Path:
        return self.compiled.save(folder)


class _StandaloneRunner:
    """Runs the native program through ``disc_runtime`` (no PyTorch): loaded from a folder written
    once, which is removed again as soon as the runtime holds the library and the constants."""

    def __init__(self, graph: Any, native: Any, input_names: list[str]) -> None:
        import disc_runtime

        self.graph, self.native, self.input_names = graph, native, input_names
        scratch = Path(tempfile.mkdtemp(prefix="disc-onnx-"))
        try:
            self.model = disc_runtime.load(self.save(scratch / "program"))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        self._bf16 = [t.dtype == "bf16" for t in self.model.outputs]

    def run(self, names: list[str], values: list[Any]) -> list[Any]:
        outs = self.model.run(*[_array(name, v) for name, v in zip(names, values)])
        if any(self._bf16):
            import ml_dtypes  # installed with onnx

            outs = [o.view(ml_dtypes.bfloat16) if bf16 else o for o, bf16 in zip(outs, self._bf16)]
        return outs

    def save(self, folder: str | os.PathLike) -> Path:
        from disc.runtime.program_files import constant_order, raw_constant, write_program
        from disc.runtime.ral_build import build_ral

        g = self.graph
        return write_program(
            folder,
            name=g.name,
            graph=g,
            input_names=self.input_names,
            constants={k: raw_constant(g.constants[k]) for k in constant_order(g)},
            backend="native-cpu",
            native=self.native,
            ral_library=build_ral().path,
        )


def compile(
    model: Any,
    dynamic: Mapping[str, Mapping[int, str | int]] | None = None,
    constraints: Any = None,
    backend: str | None = None,
) -> OnnxProgram:
    """Compile an ONNX model (a path, bytes or ``onnx.ModelProto``) once for every shape."""
    from disc.report import CompileReport, record_report
    from disc.shape.user import apply_user_facts, parse_user_constraints

    start = time.perf_counter()
    ranges, facts = parse_user_constraints(constraints)
    imp, inputs, outputs = import_model(model, dynamic)
    graph = imp.graph
    apply_user_facts(graph.constraints, facts, ranges)
    for name, (lo, hi) in ranges.items():
        graph.constraints.set_range(name, lo, hi)
    with_torch = _has_torch()
    if with_torch:
        from disc.driver import compile_graph

        # The executors hold tensors as PyTorch's (the model's weights are not copied).
        graph.constants = {k: _to_torch(np.require(v, requirements=["C", "W"])) if isinstance(v, np.ndarray) else v for k, v in graph.constants.items()}
        program = compile_graph(graph, {}, backend=backend, device="cpu")
        graph, choice = program.graph, program.choice
    else:
        graph, choice = _native_program(graph, backend)
    report = CompileReport(name=graph.name, source="disc.onnx", graph=graph, fallbacks={}, compile_seconds=time.perf_counter() - start, backend=choice)
    record_report(report)
    if with_torch:
        import torch.utils._pytree as pytree

        from disc.compiled import CompiledModule

        spec = pytree.tree_flatten(list(range(len(outputs))))[1]
        runner: Any = _TorchRunner(CompiledModule(report, program.executor, inputs, spec))
    else:
        runner = _StandaloneRunner(graph, choice.native, inputs)
    return OnnxProgram(runner, inputs, outputs, report)


def _native_program(graph: Any, backend: str | None) -> tuple[Any, Any]:
    """Without PyTorch: the optimised graph and its native CPU program, or a CompileError saying what it lacks."""
    from disc.codegen.cpu.build import build_native
    from disc.codegen.lowering import Unsupported
    from disc.passes.pipeline import run_pipeline
    from disc.report import BackendChoice

    backend = backend or os.environ.get("DISC_BACKEND", "auto")
    if backend not in ("auto", "native"):
        raise CompileError(f"backend={backend!r} needs PyTorch, which is not installed here; without it an ONNX model compiles to the native CPU program (backend='native')")
    graph = run_pipeline(graph)
    try:
        native = build_native(graph)
    except Unsupported as e:
        raise CompileError(f"{graph.name}: the native CPU program cannot hold this graph ({e}); with PyTorch installed such ops run in PyTorch between compiled segments") from e
    return graph, BackendChoice("native-cpu", native=native)
