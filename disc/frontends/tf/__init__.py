"""The TensorFlow frontend: tf.function and Keras models compiled once for all their shapes.

    import disc.tf
    prog = disc.tf.compile(model, input_signature=[tf.TensorSpec([None, None], tf.int32, name="ids")])
    out = prog(ids)                      # tf.Tensors (or numpy arrays) in, the function's structure of tf.Tensors out

    @disc.tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32)])
    def f(x): ...                        # a drop-in for tf.function

``None`` dims of the signature become symbols (``dynamic={"ids": {0: "batch"}}`` names them;
one name in two places is one symbol; an int pins a dim); ``constraints`` as for
``disc.compile``. The function is traced once (``get_concrete_function``), its variables are
frozen to constants and its function calls inlined (``convert_variables_to_constants_v2``), and
the resulting ``GraphDef`` is imported (``importer.py``, op table ``ops.py``). An op outside the
table runs in TensorFlow between compiled segments (``fallback.py``; ``disc.explain`` lists it),
or with ``fallback=False`` is an error naming the op and the node before anything runs. The program runs through the
same driver and executors as the other frontends (the PyTorch executors where PyTorch is
installed, else the native CPU program through ``disc_runtime``), and ``prog.save(folder)``
writes a program that runs without TensorFlow.

Inference only. Variables are frozen when the program is compiled; one assigned afterwards
(``set_weights``, ``fit``, an ``assign``) is noticed at the next call, which compiles again
(``variables.py``; ``watch_variables=False`` skips the per-call check).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from disc.errors import CompileError
from disc.frontends.arrays import apply_constraints, bind_inputs, compile_array_graph
from disc.frontends.tf.importer import TF_DTYPES, InputSpec, import_graph_def
from disc.frontends.tf.variables import VariableWatch

__all__ = ["TfProgram", "compile", "function", "supported_ops", "trace"]

logger = logging.getLogger("disc")


def supported_ops() -> list[str]:
    """The TensorFlow op types this frontend lowers."""
    from disc.frontends.tf.ops import OPS

    return sorted(OPS)


def _callable(fn: Any, n_inputs: int) -> Callable[..., Any]:
    """What the traced function calls: a Keras model in inference mode, else ``fn`` itself."""
    import keras

    functional = isinstance(fn, keras.Model) and (
        type(fn).__name__ in ("Functional", "Sequential") or getattr(fn, "_is_graph_network", False)
    )
    if functional:
        return lambda *xs: fn(list(xs) if n_inputs > 1 else xs[0], training=False)
    if isinstance(fn, keras.layers.Layer):
        return lambda *xs: fn(*xs, training=False)
    return fn


def _signature(fn: Any, input_signature: Sequence[Any] | None) -> list[Any]:
    import tensorflow as tf

    if input_signature is not None:
        return list(input_signature)
    inputs = getattr(fn, "inputs", None)  # a functional Keras model knows its inputs
    if inputs:
        return [tf.TensorSpec(tuple(t.shape), t.dtype, name=getattr(t, "name", None)) for t in inputs]
    raise CompileError(
        "disc.tf.compile needs input_signature=[tf.TensorSpec(...), ...] for this function (only a functional Keras model knows its inputs)"
    )


@dataclass
class Traced:
    """A function traced and frozen: what the importer reads, and the variables it froze."""

    graph_def: Any
    specs: list[InputSpec]
    outputs: list[str]  # output tensor names
    structure: Any  # the function's output structure
    output_types: Callable[[str], list[tuple[str, tuple[int | None, ...] | None]]]  # a node's outputs as TensorFlow infers them
    watch: VariableWatch | None  # the frozen variables as they were read, where watched


def trace(fn: Any, input_signature: Sequence[Any] | None = None, watch_variables: bool = False) -> Traced:
    """Trace and freeze ``fn`` (with ``watch_variables``, the variables are read for the watch
    first, so that a write while freezing shows at the next call)."""
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    sig = _signature(fn, input_signature)
    for i, s in enumerate(sig):
        if not isinstance(s, tf.TensorSpec):
            raise CompileError(
                f"input_signature[{i}] is a {type(s).__name__}; disc.tf takes tf.TensorSpec entries (nested structures are not supported)"
            )
    func = fn if hasattr(fn, "get_concrete_function") else tf.function(_callable(fn, len(sig)))
    try:
        concrete = func.get_concrete_function(*sig)
    except Exception as e:
        raise CompileError(f"tracing the function with input_signature={sig} failed: {type(e).__name__}: {e}") from e
    watch = VariableWatch(concrete.variables) if watch_variables else None
    frozen = convert_variables_to_constants_v2(concrete)
    specs = []
    for s, t in zip(sig, frozen.inputs):
        name = s.name or t.name.split(":")[0]
        if t.dtype.as_datatype_enum not in TF_DTYPES:
            raise CompileError(f"input {name!r}: dtype {t.dtype.name} is not one disc runs")
        dims = tuple(None if d is None else int(d) for d in t.shape.as_list())
        specs.append(InputSpec(t.name.split(":")[0], TF_DTYPES[t.dtype.as_datatype_enum], dims, name))
    outputs = [t.name for t in frozen.outputs]

    def output_types(node: str) -> list[tuple[str, tuple[int | None, ...] | None]]:
        out = []
        for t in frozen.graph.get_operation_by_name(node).outputs:
            dims = None if t.shape.rank is None else tuple(t.shape.as_list())
            out.append((TF_DTYPES.get(t.dtype.as_datatype_enum, t.dtype.name), dims))
        return out

    return Traced(frozen.graph.as_graph_def(), specs, outputs, concrete.structured_outputs, output_types, watch)


@dataclass(frozen=True)
class Compilation:
    """One compilation of a TensorFlow function: its program, report, output structure, the
    call's input names, and the watch over the variables it froze."""

    runner: Any
    report: Any
    structure: Any
    input_names: list[str]
    watch: VariableWatch | None


class TfProgram:
    """A compiled TensorFlow function: call it with its inputs (positional, in the signature's
    order, or by name), tf.Tensors or numpy arrays; returns the function's output structure with
    tf.Tensors. Stateless: safe from several threads. A variable written since compilation is
    noticed at the next call, which compiles the function again first."""

    def __init__(self, build: Callable[[], Compilation], name: str) -> None:
        self._build = build  # trace, freeze and compile
        self._name = name
        self._now = build()  # swapped whole, so that a call sees one compilation's parts
        self._recompiling = threading.Lock()

    @property
    def runner(self) -> Any:
        return self._now.runner

    @property
    def report(self) -> Any:
        return self._now.report

    @property
    def input_names(self) -> list[str]:
        return self._now.input_names

    @property
    def graph(self) -> Any:
        return self.report.graph

    def _current(self) -> Compilation:
        now = self._now
        if now.watch is None or not now.watch.changed():
            return now
        with self._recompiling:
            if self._now is now:  # no other thread has compiled it again meanwhile
                changed = now.watch.changed()
                shown = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
                logger.warning("disc: %s: %s changed since compilation; compiling again, so that no stale copy is read", self._name, shown)
                self._now = self._build()
            return self._now

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import tensorflow as tf

        now = self._current()
        values = bind_inputs(now.input_names, args, kwargs)
        arrays = [v.numpy() if isinstance(v, (tf.Tensor, tf.Variable)) else v for v in values]
        outs = now.runner.run(now.input_names, arrays)
        tensors = [tf.convert_to_tensor(o) for o in outs]
        return tf.nest.pack_sequence_as(now.structure, tensors)

    def save(self, folder: str | os.PathLike) -> Path:
        """Write the program; ``disc.load`` or ``disc_runtime.load`` runs it without TensorFlow."""
        return self.runner.save(folder)


def compile(
    fn: Any,
    input_signature: Sequence[Any] | None = None,
    dynamic: Mapping[str, Mapping[int, str | int]] | None = None,
    constraints: Any = None,
    backend: str | None = None,
    fallback: bool = True,
    watch_variables: bool = True,
) -> TfProgram:
    """Compile a ``tf.function``, a Keras model or a Python function of tensors once for every shape.

    An op disc does not lower runs in TensorFlow between compiled segments (``disc.explain`` lists
    it); ``fallback=False`` makes it a CompileError naming the op and its node instead. A variable
    assigned after compilation is noticed at the next call, which compiles again;
    ``watch_variables=False`` saves that check (about 5 us a variable a call) for variables that
    never change."""
    from disc.shape.user import parse_user_constraints

    ranges, facts = parse_user_constraints(constraints)
    name = str(getattr(fn, "name", None) or getattr(fn, "__name__", None) or "tf_function")

    def build() -> Compilation:
        start = time.perf_counter()
        traced = trace(fn, input_signature, watch_variables)
        specs = traced.specs
        # dynamic= and the call name inputs by the signature's names; the graph knows its placeholders.
        by_name = {spec.call_name: spec for spec in specs}
        dyn = {by_name[k].name if k in by_name else k: v for k, v in (dynamic or {}).items()}
        imp = import_graph_def(traced.graph_def, name, specs, traced.outputs, dyn, traced.output_types if fallback else None)
        apply_constraints(imp.graph, ranges, facts)
        runner, report = compile_array_graph(
            imp.graph, [s.name for s in specs], len(traced.outputs), "disc.tf", backend, start, imp.host_calls, imp.host_counts
        )
        return Compilation(runner, report, traced.structure, [spec.call_name for spec in specs], traced.watch)

    return TfProgram(build, name)


def function(fn: Callable[..., Any] | None = None, *, input_signature: Sequence[Any], **options: Any) -> Any:
    """``@disc.tf.function(input_signature=[...])``: a drop-in for ``tf.function`` that compiles the
    function once, on first use, for every shape the signature allows."""

    def wrap(f: Callable[..., Any]) -> Callable[..., Any]:
        program: list[TfProgram] = []
        lock = threading.Lock()

        def call(*args: Any, **kwargs: Any) -> Any:
            if not program:
                with lock:  # one compilation, whichever thread calls first
                    if not program:
                        program.append(compile(f, input_signature, **options))
            return program[0](*args, **kwargs)

        call.__name__ = getattr(f, "__name__", "function")
        call.__doc__ = f.__doc__
        call.compiled = program  # type: ignore[attr-defined]
        return call

    return wrap(fn) if fn is not None else wrap
