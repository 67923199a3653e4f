"""The user API: ``disc.compile``, ``disc.explain``, ``disc.reports``.

``compile`` captures a module once with symbolic dims, optimises the IR and
returns a ``CompiledModule`` that runs at any shape satisfying the
constraints, without recompiling.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree

from disc.errors import CompileError, InputError
from disc.ir.graph import Graph
from disc.ir.printer import print_graph
from disc.runtime.backend import example_device, executor_device, make_executor
from disc.runtime.checks import InputChecker
from disc.runtime.constant_versions import ConstantVersions
from disc.runtime.reference import ExecutionProfile
from disc.shape.expr import parse_expr

Constraints = Mapping[str, Any] | Sequence[str]
logger = logging.getLogger("disc")


@dataclass
class CompileReport:
    """What one compilation produced: IR, constraints, fallbacks, timing."""

    name: str
    source: str  # "disc.compile" or "torch.compile"
    graph: Graph
    fallbacks: dict[str, int]
    compile_seconds: float
    hints: dict[str, int] = field(default_factory=dict)
    calls: int = 0
    backend: Any = None  # BackendChoice: native-cpu or reference, and why
    decomposed_because: str | None = None  # why torch.export's program needed run_decompositions
    fallback_calls: dict[str, Any] = field(default_factory=dict)  # call key -> the importer's Fallback (what disc.save writes)
    cache: str = ""  # what the program cache did: hit, miss and stored, off, or why it was not used

    def text(self) -> str:
        g = self.graph
        lines = [f"== disc: {self.name} (via {self.source}) =="]
        lines.append(f"compiled in {self.compile_seconds:.2f}s; calls so far: {self.calls}")
        if self.hints:
            lines.append("trace hints (dims grown off 0/1 so nothing specialises): " + ", ".join(f"{k}={v}" for k, v in self.hints.items()))
        if self.source == "disc.compile":
            why = self.decomposed_because
            lines.append("capture: torch.export, " + (f"decomposed to core ATen ({why})" if why else "lowered as exported (no decomposition pass)"))
        if self.cache:
            lines.append(f"program cache: {self.cache}")
        lines.append("")
        lines.append("-- constraints --")
        lines += ["  " + ln for ln in g.constraints.describe()] or ["  (none)"]
        lines.append("")
        lines.append("-- fallbacks (run by PyTorch) --")
        if self.fallbacks:
            lines += [f"  {target}: {count}" for target, count in sorted(self.fallbacks.items())]
        else:
            lines.append("  none: every op is compiled")
        from disc.fusion.plan import plan_fusion

        lines.append("")
        lines.append("-- fusion plan --")
        native_cpu = self.backend is not None and self.backend.name.startswith("native-cpu")
        lines += ["  " + ln for ln in plan_fusion(g, conv_epilogues=native_cpu).describe().splitlines()]
        lines.append("")
        lines += self._backend_text()
        counts = g.op_counts()
        lines.append("")
        lines.append("-- op counts --")
        lines.append("  " + ", ".join(f"{op}={n}" for op, n in sorted(counts.items())))
        lines.append("")
        lines.append("-- IR --")
        lines.append(print_graph(g))
        return "\n".join(lines)


    def _backend_text(self) -> list[str]:
        choice = self.backend
        if choice is not None and choice.segments is not None:
            from disc.runtime.segments import describe_segments

            return describe_segments(choice.segments)
        if choice is not None and choice.triton is not None:
            from disc.codegen.triton.explain import describe_triton

            return describe_triton(choice.triton)
        if choice is None or choice.native is None:
            why = choice.reason if choice is not None else "no backend recorded"
            return ["-- backend: reference executor (op by op, with torch) --", f"  {why}"]
        from disc.codegen.cpu.explain import describe_native

        return describe_native(choice.native)


_REPORTS: list[CompileReport] = []
_REPORTS_LOCK = threading.Lock()


def record_report(report: CompileReport) -> None:
    with _REPORTS_LOCK:
        _REPORTS.append(report)


def reports() -> list[CompileReport]:
    """Every compilation made in this process (disc.compile and torch.compile)."""
    with _REPORTS_LOCK:
        return list(_REPORTS)


def clear_reports() -> None:
    with _REPORTS_LOCK:
        _REPORTS.clear()


class CompiledModule:
    """A compiled program. Stateless across calls: safe to call from several threads."""

    def __init__(self, report: CompileReport, executor: Any, input_names: list[str], out_spec: Any) -> None:
        self.report = report
        self.executor = executor
        self.input_names = input_names
        self.out_spec = out_spec
        self._check_inputs = InputChecker(report.graph, input_names, executor_device(executor))
        self._weights: ConstantVersions | None = None
        self._compile_again: Callable[[list[torch.Tensor]], CompiledModule] | None = None
        self._compilations = 1

    @property
    def graph(self) -> Graph:
        return self.report.graph

    @property
    def num_compilations(self) -> int:
        """1, whatever the shapes; one more each time the model's weights changed in place."""
        return self._compilations

    def watch_weights(self, weights: Mapping[str, torch.Tensor], compile_again: Callable[[list[torch.Tensor]], CompiledModule]) -> None:
        """Compile again (``compile_again(inputs)``) at the first call after one of ``weights`` changes in place."""
        self._weights = ConstantVersions(weights)
        self._compile_again = compile_again

    def _adopt(self, fresh: CompiledModule) -> None:
        """Run ``fresh``'s program from now on (compiled from the same model with new weights)."""
        self.report, self.executor, self._check_inputs = fresh.report, fresh.executor, fresh._check_inputs
        self._compilations += 1

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        tensors = list(args)
        if kwargs or len(tensors) < len(self.input_names):
            for name in self.input_names[len(args) :]:
                if name not in kwargs:
                    raise InputError(f"missing input {name!r}; inputs are {self.input_names}")
                tensors.append(kwargs.pop(name))
            if kwargs:
                raise InputError(f"unexpected input(s) {sorted(kwargs)}; inputs are {self.input_names}")
        self._check_inputs(tensors)
        if self._weights is not None and self._weights.changed() and self._compile_again is not None:
            again = self._compile_again
            self._weights.recompile_if_changed(self.report.name, lambda: self._adopt(again(tensors)))
        self.report.calls += 1
        # Entering no_grad costs ~2 us, a tenth of a small call: only when an input could start a graph.
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            with torch.no_grad():
                outs = self.executor.run(tensors)
        else:
            outs = self.executor.run(tensors)
        return pytree.tree_unflatten(outs, self.out_spec)


    def save(self, folder: str | os.PathLike) -> Path:
        """Write this program to ``folder``; ``disc.load(folder)`` runs it again without compiling."""
        from disc.runtime.artifact import save

        return save(self, folder)

    def profile(self, *args: Any) -> ExecutionProfile:
        """Kernels executed (memory-bound, library, fallback) and peak workspace at these inputs."""
        self._check_inputs(list(args))
        with torch.no_grad():
            return self.executor.profile(list(args))


def compile(
    model: torch.nn.Module,
    example_inputs: Sequence[Any],
    *,
    dynamic: Mapping[str, Mapping[int, str]] | None = None,
    constraints: Constraints | None = None,
    backend: str | None = None,
    cache: bool | None = None,
) -> CompiledModule:
    """Compile ``model`` once for every shape.

    ``dynamic`` names the dynamic dims per input: ``{"ids": {0: "batch", 1: "seq"}}``;
    inputs sharing a name share the dim. Other dims are static.
    ``constraints`` adds user facts: ``{"seq": {"min": 1, "max": 512, "multiple_of": 8}}``
    or expressions such as ``["seq == 2*half"]`` (checked at every call).
    ``backend``: "auto" (default, or ``$DISC_BACKEND``): the native CPU program for CPU
    inputs, the Triton program for GPU inputs, or the reference executor where the graph
    has no such form; "native" / "triton": that program, or an error; "reference": op by
    op with torch.
    ``cache``: look the model up in the program cache first, and store what is compiled
    (default on; ``DISC_PROGRAM_CACHE=0`` turns it off). A model compiled before on this
    machine, with the same code, weights, inputs and options, is loaded without torch.export
    (see ``disc/runtime/program_cache.py`` for what the key covers).
    """
    from disc.frontends.torch.export import capture
    from disc.passes.pipeline import run_pipeline
    from disc.runtime import program_cache

    if not isinstance(model, torch.nn.Module):
        raise CompileError(f"disc.compile expects a torch.nn.Module, got {type(model).__name__}")
    if dynamic is not None and not isinstance(dynamic, Mapping):
        raise CompileError(
            f"disc.compile: dynamic must map input names to {{axis: dim name}}, e.g. {{'x': {{0: 'batch', 1: 'seq'}}}}; got {dynamic!r}. "
            "(dynamic=True is torch.compile's flag: torch.compile(model, backend='disc', dynamic=True) makes every dim dynamic.)"
        )
    start = time.perf_counter()
    ranges, facts = _split_constraints(constraints)
    _check_the_example_meets_them(model, tuple(example_inputs), dict(dynamic or {}), ranges, facts)
    key, cached = None, "off"
    if program_cache.enabled(cache):
        try:
            key = program_cache.program_key(model, tuple(example_inputs), {"dynamic": dynamic, "constraints": constraints, "backend": backend})
        except program_cache.Uncacheable as e:
            cached = f"not used: {e}"
        except Exception as e:  # the cache only saves time: failing to key a model must not fail its compilation
            logger.warning("disc: the program cache could not key %s (%s: %s); compiling it", type(model).__name__, type(e).__name__, e)
            cached = f"not used: {type(e).__name__} while computing the key: {e}"
    if key is not None:
        hit, cached = program_cache.lookup(key)
        if hit is not None:
            hit.report.cache = cached
            hit.report.compile_seconds = time.perf_counter() - start
            _watch_weights(hit, model, dict(dynamic=dynamic, constraints=constraints, backend=backend, cache=cache))
            return hit
    captured = capture(model, tuple(example_inputs), dict(dynamic or {}), ranges)
    graph = captured.importer.graph
    _apply_user_facts(graph, facts, ranges)
    graph = run_pipeline(graph)
    executor, choice = make_executor(graph, captured.importer.fallbacks, backend, example_device(example_inputs))
    report = CompileReport(
        name=type(model).__name__,
        source="disc.compile",
        graph=graph,
        fallbacks=dict(captured.importer.fallback_counts),
        compile_seconds=time.perf_counter() - start,
        hints=captured.hints,
        decomposed_because=captured.decomposed_because,
        backend=choice,
        fallback_calls=dict(captured.importer.fallbacks),
        cache=cached,
    )
    compiled = CompiledModule(report, executor, captured.input_names, captured.out_spec)
    if key is not None:
        report.cache = f"{cached}; {program_cache.store(key, compiled)}"
    record_report(report)
    _watch_weights(compiled, model, dict(dynamic=dynamic, constraints=constraints, backend=backend, cache=cache))
    return compiled


def _watch_weights(compiled: CompiledModule, model: torch.nn.Module, options: dict[str, Any]) -> None:
    """Have ``compiled`` compile ``model`` again, with the same options, once its weights change in place.

    The model is held weakly: a compiled program does not keep its model alive.
    """
    weights = dict(model.named_parameters()) | dict(model.named_buffers())
    model_ref = weakref.ref(model)
    name = type(model).__name__  # not `compiled`: the closure would make a reference cycle

    def compile_again(inputs: list[torch.Tensor]) -> CompiledModule:
        current = model_ref()
        if current is None:
            raise CompileError(f"the weights of {name} changed in place after compilation, and the model is gone: compile it again")
        return compile(current, inputs, **options)

    compiled.watch_weights(weights, compile_again)


def _split_constraints(constraints: Constraints | None) -> tuple[dict[str, tuple[int | None, int | None]], list[Any]]:
    ranges: dict[str, tuple[int | None, int | None]] = {}
    facts: list[Any] = []
    if constraints is None:
        return ranges, facts
    if isinstance(constraints, Mapping):
        for name, spec in constraints.items():
            unknown = set(spec) - {"min", "max", "multiple_of"}
            if unknown:
                raise CompileError(f"constraint for {name!r}: unknown key(s) {sorted(unknown)}; use min, max, multiple_of")
            ranges[name] = (spec.get("min"), spec.get("max"))
            if spec.get("multiple_of") is not None:
                facts.append((name, int(spec["multiple_of"])))
        return ranges, facts
    for text in constraints:
        lhs, sep, rhs = str(text).partition("==")
        if not sep:
            raise CompileError(f"constraint {text!r}: expected 'lhs == rhs'")
        facts.append((parse_expr(lhs), parse_expr(rhs)))
    return ranges, facts


def _check_the_example_meets_them(model: torch.nn.Module, args: tuple, dynamic: Mapping[str, Mapping[int, str]], ranges: Mapping[str, Any], facts: list[Any]) -> None:
    """Refuse, before anything is traced, dims and constraints the example inputs contradict: the
    program would reject every input, its own example included."""
    from disc.frontends.torch.export import input_names_of

    names = input_names_of(model, args)
    seen: dict[str, tuple[str, int, int]] = {}  # dim name -> (input, axis, example size) where first named
    for name, t in zip(names, args):
        if not isinstance(t, torch.Tensor):
            continue
        for axis, dim in dynamic.get(name, {}).items():
            if not isinstance(axis, int) or not -t.dim() <= axis < t.dim():
                continue  # capture names the bad axis
            size = t.shape[axis]
            first = seen.setdefault(dim, (name, axis % t.dim(), size))
            if first[2] != size:
                raise CompileError(
                    f"dim name {dim!r} is given to input {first[0]!r} dim {first[1]} (size {first[2]} in the example) and to input "
                    f"{name!r} dim {axis % t.dim()} (size {size}): one name is one size; name them apart"
                )
    sizes = {dim: size for dim, (_, _, size) in seen.items()}

    def where(dim: str) -> str:
        name, axis, size = seen[dim]
        return f"the example input {name!r} has {dim} = {size} (dim {axis})"

    for dim, (lo, hi) in ranges.items():
        if lo is not None and hi is not None and lo > hi:
            raise CompileError(f"constraint on {dim!r}: min {lo} is greater than max {hi}; no size satisfies both")
        if dim in sizes and ((lo is not None and sizes[dim] < lo) or (hi is not None and sizes[dim] > hi)):
            raise CompileError(f"constraint on {dim!r}: min {lo}, max {hi}, but {where(dim)}")
    for lhs, rhs in facts:
        if isinstance(lhs, str):  # (dim, multiple_of)
            if rhs < 1:
                raise CompileError(f"constraint on {lhs!r}: multiple_of must be at least 1, got {rhs}")
            if lhs in sizes and sizes[lhs] % rhs:
                raise CompileError(f"constraint on {lhs!r}: multiple_of {rhs}, but {where(lhs)}")
            continue
        symbols = lhs.symbols() | rhs.symbols()
        if symbols <= set(sizes) and lhs.evaluate(sizes) != rhs.evaluate(sizes):
            values = ", ".join(f"{d} = {sizes[d]}" for d in sorted(symbols))
            raise CompileError(f"constraint {lhs} == {rhs} does not hold for the example inputs ({values})")


def _apply_user_facts(g: Graph, facts: list[Any], ranges: Mapping[str, Any]) -> None:
    c = g.constraints
    for name in ranges:
        if name not in c.facts:
            raise CompileError(f"constraint names dim {name!r}, which is not a dynamic dim ({sorted(c.facts)})")
    for lhs, rhs in facts:
        if isinstance(rhs, int) and isinstance(lhs, str):
            c.set_divisor(lhs, rhs)
            continue
        unknown = (lhs.symbols() | rhs.symbols()) - set(c.facts)
        if unknown:
            raise CompileError(f"constraint {lhs} == {rhs} names unknown dim(s) {sorted(unknown)}")
        c.assume(lhs, "==", rhs, "user constraint")


def explain(obj: Any = None) -> str:
    """A readable account: IR with symbolic dims, constraints, fallbacks, compilations."""
    if isinstance(obj, CompiledModule):
        return obj.report.text()
    if isinstance(obj, CompileReport):
        return obj.text()
    rs = reports()
    if not rs:
        return "disc: nothing compiled in this process yet"
    header = f"disc: {len(rs)} compilation(s) in this process"
    return "\n\n".join([header] + [r.text() for r in rs])
