"""What the array-graph frontends (ONNX, TensorFlow) share: compile-time shape values, and the
program that runs a graph whose weights are numpy arrays.

Both frontends import a graph of named values where a model's shape subgraph
(``Shape -> Gather/StridedSlice -> Concat/Pack -> Reshape``) computes on integers. Such
values are held at compile time, as a ``ShapeValue`` (a 1-d integer tensor known as
symbolic dims) or a ``DimValue`` (one symbolic dim), so the shape computation becomes the IR's
index ops instead of per-call work. ``ArrayBuilder.tensor`` turns any held value into a graph
value where an op computes with it.

``compile_array_graph`` compiles such a graph: through the PyTorch driver and executors where
PyTorch is installed, else to the native CPU program run through ``disc_runtime`` (numpy alone).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from disc.errors import CompileError, InputError
from disc.ir.builder import GraphBuilder, LoweringError, convert, dim_value, elementwise, floor_divide
from disc.ir.graph import Node
from disc.ir.types import numpy_dtype
from disc.shape.expr import DimLike, SymExpr, as_expr, exact_divide, product


@dataclass
class ShapeValue:
    """A 1-d integer tensor known at compile time as symbolic dims (what ``Shape`` returns)."""

    dims: list[DimLike]
    dtype: str = "i64"  # the dtype it has where it is used as data


@dataclass
class DimValue:
    """A 0-d integer known at compile time as one symbolic dim (one element of a shape value)."""

    dim: DimLike
    dtype: str = "i64"


class ArrayBuilder(GraphBuilder):
    """A graph under import whose values are Nodes, numpy constants, ShapeValues or DimValues."""

    def tensor(self, value: Any) -> Node:
        """``value`` as a graph value: constants and shape values become constants or index ops."""
        if isinstance(value, Node):
            return value
        if isinstance(value, ShapeValue):
            return self.shape_tensor(value.dims, value.dtype)
        if isinstance(value, DimValue):
            return dim_value(self, value.dim, value.dtype)
        if isinstance(value, np.ndarray):
            return self.graph.add_constant(np.asarray(value, order="C"))  # (ascontiguousarray makes a 0-d array 1-d)
        what = repr(value) if type(value).__name__.startswith("_") else f"a {type(value).__name__}"
        raise LoweringError(f"{what} where a tensor is needed (a sequence or an optional is held at compile time; an op that selects between them at run time has no form)")

    def shape_tensor(self, dims: Sequence[DimLike], dtype: str = "i64") -> Node:
        """A 1-d integer tensor holding ``dims`` (a shape value used as data)."""
        parts = []
        one = self.index(1)
        for d in dims:
            parts.append(self.graph.add("reshape", (dim_value(self, d, dtype), one)))
        if not parts:
            return self.graph.add_constant(np.zeros((0,), np.int32 if dtype == "i32" else np.int64))
        if len(parts) == 1:
            return parts[0]
        return self.graph.add("concat", tuple(parts), {"axis": 0})


def known(v: Any) -> np.ndarray | None:
    """A compile-time array, where ``v`` is one (a constant, or a shape value of static dims)."""
    if isinstance(v, np.ndarray):
        return v
    if isinstance(v, ShapeValue) and all(isinstance(d, int) or (isinstance(d, SymExpr) and d.is_const) for d in v.dims):
        return np.array([int(d) if isinstance(d, int) else d.const_value for d in v.dims], np.int64)
    return None


class NeedsValue(LoweringError):
    """An input's values are used as a shape, axes or count (a Reshape's shape fed by the caller):
    the program is compiled for those values (``input`` names it)."""

    def __init__(self, what: str, input: str) -> None:
        super().__init__(f"{what} comes from input {input!r}: the program is compiled for its values")
        self.input = input


# Ops that pass an input's values through unchanged in kind (pieces, reshapes, casts, joins with
# constants): a shape operand computed by them from an input is that input's values, compiled
# per value.
_VALUE_PASSING = frozenset({"slice", "reshape", "convert", "transpose", "concat"})


def input_behind(v: Any) -> Node | None:
    """The input that ``v`` is built from by pieces, reshapes, casts and joins with constants, if
    it is so built (a size may come as a float, as ONNX's Range and OneHot allow)."""
    if not isinstance(v, Node):
        return None
    if v.op == "input":
        return v
    if v.op not in _VALUE_PASSING:
        return None
    found = None
    for operand in v.inputs:
        if operand.is_index or operand.op == "constant":  # (a slice's bounds, a constant piece)
            continue
        source = input_behind(operand)
        if source is None:
            return None
        found = found or source
    return found


def known_array(v: Any, what: str) -> np.ndarray:
    """``v``'s values, flattened; they must be known at compile time (a caller's input raises
    NeedsValue: the program is compiled per value)."""
    k = known(v)
    source = input_behind(v) if k is None else None
    if source is not None:
        raise NeedsValue(what, source.name)
    if k is None:
        raise LoweringError(f"{what} must be known when the model is compiled (a constant), not computed at run time")
    return np.asarray(k).reshape(-1)


def known_ints(v: Any, what: str) -> list[int]:
    """``v`` as a flat list of ints; it must be known at compile time."""
    return [int(x) for x in known_array(v, what)]


def arange(ctx: GraphBuilder, start: Any, limit: Any, delta: Any, dtype: str) -> Any:
    """ONNX's Range, TensorFlow's Range: a numpy array where all three operands are known; an iota
    over a symbolic count where the limit is a dim (start and a positive integer step known)."""
    ks, kl, kd = known(start), known(limit), known(delta)
    if ks is not None and kl is not None and kd is not None:
        if np.asarray(kd).item() == 0:
            raise LoweringError("Range with a step of 0")
        values = np.arange(np.asarray(ks).item(), np.asarray(kl).item(), np.asarray(kd).item())
        if dtype == "bf16":  # numpy has no bfloat16 of its own: a float32 constant converted
            return convert(ctx, ctx.graph.add_constant(values.astype(np.float32)), "bf16")
        return values.astype(numpy_dtype(dtype))
    for v in (start, limit, delta):
        source = input_behind(v) if known(v) is None else None  # (a size cast to float is still the caller's value)
        if source is not None:
            raise NeedsValue("Range's start, limit and step", source.name)
    lim = limit.dim if isinstance(limit, DimValue) else None
    if ks is None or kd is None or lim is None or np.asarray(kd).item() <= 0 or dtype not in ("i32", "i64"):
        raise LoweringError("Range with a start, step or limit computed at run time (a limit may be a dim), a step <= 0, or a non-integer dtype")
    s, d = int(np.asarray(ks).item()), int(np.asarray(kd).item())
    n = (as_expr(lim) - s + d - 1) // d
    if not ctx.graph.constraints.prove_ge(n, 0):
        ctx.graph.constraints.assume(n, ">=", 0, "Range: the limit must not be below the start")
    out = ctx.graph.add("iota", (ctx.index(n),), {"dtype": dtype})
    if d != 1:
        out = elementwise(ctx, "mul", [out, np.array(d, numpy_dtype(dtype))], dtype)
    if s != 0:
        out = elementwise(ctx, "add", [out, np.array(s, numpy_dtype(dtype))], dtype)
    return out


def same_padding(n: DimLike, kernel: int, stride: int, dilation: int) -> tuple[int, int] | None:
    """SAME padding (low, high) of a window over a dim of ``n``, so that out = ceil(n / stride):
    a total of (out - 1) * stride + extent - n, the odd one at the end (TensorFlow's SAME, ONNX's
    SAME_UPPER). None where it depends on a size known only at run time (stride > 1); with
    stride 1 it is extent - 1 for any size."""
    extent = (kernel - 1) * dilation + 1

    def of(size: int) -> tuple[int, int]:
        total = max((-(-size // stride) - 1) * stride + extent - size, 0)
        return total // 2, total - total // 2

    if isinstance(n, int) or (isinstance(n, SymExpr) and n.is_const):
        return of(int(n))
    if stride == 1:
        return of(10_000)  # extent - 1 in all, whatever the size
    return None


def shape_dims(v: Any, what: str) -> list[DimLike]:
    """A shape operand as symbolic dims: a constant, or a shape value."""
    if isinstance(v, ShapeValue):
        return list(v.dims)
    return list(known_ints(v, what))


def reshape_target(ctx: GraphBuilder, x: Node, dims: list[DimLike], allowzero: bool) -> list[DimLike]:
    """A reshape's target shape: one -1 is inferred; 0 copies the input's dim unless ``allowzero``
    (ONNX's default copies, TensorFlow's reshape means a 0-sized dim)."""
    out: list[DimLike] = []
    infer = None
    for i, d in enumerate(dims):
        if isinstance(d, int) and d == 0 and not allowzero:
            out.append(x.shape[i])
        elif isinstance(d, int) and d == -1:
            if infer is not None:
                raise LoweringError("Reshape: more than one -1 in the shape")
            infer = i
            out.append(1)
        else:
            out.append(d)
    if infer is not None:
        c = ctx.graph.constraints
        known_part = c.normalize(product(out))
        total = c.normalize(product(x.shape))
        q = exact_divide(total, known_part)
        if q is None:
            # Dims that share no symbol (GPT-2's attention_mask viewed as [input_ids' batch, -1]):
            # the program divides at run time and checks that the elements fill the shape.
            q = floor_divide(ctx, total, known_part)
            c.assume_equal(known_part * q, total, f"Reshape: {total} elements must fill a shape whose other dims hold {known_part} (the -1 at dim {infer})")
        out[infer] = q
    return out


def dim_arith(ctx: GraphBuilder, op: str, a: DimLike, b: DimLike) -> DimLike | None:
    """``a op b`` on symbolic dims, for the ops dims are closed under (None otherwise). A division
    by a dim it shares no symbol with (GPT-2's mask elements over the ids' batch) is done when the
    program runs (``floor_divide``: a new symbol, the divisor checked positive)."""
    a, b = as_expr(a), as_expr(b)
    if op == "add":
        return a + b
    if op == "sub":
        return a - b
    if op == "mul":
        return a * b
    if op == "div" and b.is_const and b.const_value > 0:
        return a // b.const_value
    if op == "remainder" and b.is_const and b.const_value > 0:
        return a % b.const_value
    if op in ("div", "remainder") and not b.is_const:
        q = floor_divide(ctx, a, b)
        return q if op == "div" else a - q * b
    if op == "pow" and b.is_const and 0 <= b.const_value <= 8:  # torch.export writes a square side's area as side ** 2
        out = as_expr(1)
        for _ in range(int(b.const_value)):
            out = out * a
        return out
    return None


# -- running a compiled array graph ------------------------------------------------------------------
def to_torch(a: np.ndarray) -> Any:
    import torch

    if a.dtype.name == "bfloat16":  # ml_dtypes' bfloat16 (what onnx and TensorFlow use): the same bits
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def to_numpy(t: Any) -> np.ndarray:
    import torch

    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        import ml_dtypes  # installed with onnx and TensorFlow

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def has_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def bind_inputs(names: Sequence[str], args: Sequence[Any], kwargs: dict[str, Any]) -> list[Any]:
    """A call's inputs in ``names``' order: positional first, the rest by name; InputError otherwise."""
    values = list(args)
    for name in names[len(values) :]:
        if name not in kwargs:
            raise InputError(f"missing input {name!r}; the inputs are {list(names)}")
        values.append(kwargs.pop(name))
    if kwargs:
        raise InputError(f"unexpected input(s) {sorted(kwargs)}; the inputs are {list(names)}")
    if len(values) > len(names):
        raise InputError(f"{len(values)} inputs given; there are {len(names)} ({list(names)})")
    return values


def apply_constraints(graph: Any, ranges: dict[str, Any], facts: list[Any]) -> None:
    """The user's ``constraints=`` (parsed by ``parse_user_constraints``) on an imported graph."""
    from disc.shape.user import apply_user_facts

    apply_user_facts(graph.constraints, facts, ranges)
    for name, (lo, hi) in ranges.items():
        graph.constraints.set_range(name, lo, hi)


def input_array(name: str, v: Any) -> np.ndarray:
    """``v`` as a C-contiguous writable numpy array, or an InputError naming the input."""
    try:
        a = np.require(v, requirements=["C", "W"])  # a read-only array is copied: torch tensors are writable
    except Exception as e:
        raise InputError(f"input {name!r}: not an array ({type(v).__name__}: {e})") from None
    if a.dtype == object:
        raise InputError(f"input {name!r}: an array of Python objects, not numbers")
    return a


class TorchRunner:
    """Runs a ``CompiledModule`` (PyTorch installed): arrays become tensors without a copy."""

    def __init__(self, compiled: Any) -> None:
        self.compiled = compiled

    def run(self, names: list[str], values: list[Any]) -> list[Any]:
        import torch

        as_torch = any(isinstance(v, torch.Tensor) for v in values)
        tensors = [v if isinstance(v, torch.Tensor) else to_torch(input_array(name, v)) for name, v in zip(names, values)]
        outs = self.compiled(*tensors)
        outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
        return outs if as_torch else [to_numpy(o) for o in outs]

    def save(self, folder: str | os.PathLike) -> Path:
        return self.compiled.save(folder)


class StandaloneRunner:
    """Runs the native program through ``disc_runtime`` (no PyTorch): loaded from a folder written
    once, which is removed again as soon as the runtime holds the library and the constants."""

    def __init__(self, graph: Any, native: Any, input_names: list[str]) -> None:
        import disc_runtime

        self.graph, self.native, self.input_names = graph, native, input_names
        scratch = Path(tempfile.mkdtemp(prefix="disc-program-"))
        try:
            self.model = disc_runtime.load(self.save(scratch / "program"))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        self._bf16 = [t.dtype == "bf16" for t in self.model.outputs]

    def run(self, names: list[str], values: list[Any]) -> list[Any]:
        outs = self.model.run(*[input_array(name, v) for name, v in zip(names, values)])
        if any(self._bf16):
            import ml_dtypes

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


def compile_array_graph(
    graph: Any,
    inputs: list[str],
    n_outputs: int,
    source: str,
    backend: str | None,
    start: float,
    host_calls: dict[str, Any] | None = None,
    host_counts: dict[str, int] | None = None,
) -> tuple[Any, Any]:
    """Compile an imported graph (numpy constants): returns (runner, report). ``host_calls`` are the
    frontend's calls for its ``host_call`` ops (run between compiled segments; PyTorch's executors only)."""
    from disc.report import CompileReport, record_report

    with_torch = has_torch()
    if host_calls and not with_torch:
        ops = ", ".join(f"{op} x{n}" for op, n in sorted((host_counts or {}).items()))
        raise CompileError(
            f"{graph.name}: ops disc does not lower ({ops}) would run in the host framework between compiled segments, "
            "which needs PyTorch's executors (not installed)"
        )
    if with_torch:
        from disc.driver import compile_graph

        # The executors hold tensors as PyTorch's (the model's weights are not copied).
        graph.constants = {
            k: to_torch(np.require(v, requirements=["C", "W"])) if isinstance(v, np.ndarray) else v for k, v in graph.constants.items()
        }
        program = compile_graph(graph, dict(host_calls or {}), backend=backend, device="cpu")
        graph, choice = program.graph, program.choice
    else:
        graph, choice = _native_program(graph, backend, source)
    report = CompileReport(
        name=graph.name,
        source=source,
        graph=graph,
        fallbacks=dict(host_counts or {}),
        compile_seconds=time.perf_counter() - start,
        backend=choice,
        fallback_calls=dict(host_calls or {}),
    )
    record_report(report)
    if with_torch:
        import torch.utils._pytree as pytree

        from disc.compiled import CompiledModule

        spec = pytree.tree_flatten(list(range(n_outputs)))[1]
        return TorchRunner(CompiledModule(report, program.executor, inputs, spec)), report
    return StandaloneRunner(graph, choice.native, inputs), report


def _native_program(graph: Any, backend: str | None, source: str) -> tuple[Any, Any]:
    """Without PyTorch: the optimised graph and its native CPU program, or a CompileError saying what it lacks."""
    from disc.codegen.cpu.build import build_native
    from disc.codegen.lowering import Unsupported
    from disc.passes.pipeline import run_pipeline
    from disc.report import BackendChoice

    backend = backend or os.environ.get("DISC_BACKEND", "auto")
    if backend not in ("auto", "native"):
        raise CompileError(
            f"backend={backend!r} needs PyTorch, which is not installed here; without it a {source} model compiles to the native CPU program (backend='native')"
        )
    graph = run_pipeline(graph)
    try:
        native = build_native(graph)
    except Unsupported as e:
        raise CompileError(
            f"{graph.name}: the native CPU program cannot hold this graph ({e}); with PyTorch installed such ops run in PyTorch between compiled segments"
        ) from e
    return graph, BackendChoice("native-cpu", native=native)
