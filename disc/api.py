"""The user API: ``disc.compile``, ``disc.explain``, ``disc.reports``.

``compile`` captures a module once with symbolic dims, optimises the IR and
returns a ``CompiledModule`` that runs at any shape satisfying the
constraints, without recompiling.
"""

from __future__ import annotations

import logging
import os
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from disc.compiled import CompiledModule, PerBranchModule
from disc.driver import compile_graph, example_device
from disc.errors import CaptureError, CompileError
from disc.report import CompileReport, clear_reports, record_report, reports
from disc.shape.user import UserConstraints, apply_user_facts, parse_user_constraints

__all__ = ["CompileReport", "CompiledModule", "clear_reports", "compile", "explain", "load", "record_report", "reports", "save"]

Constraints = UserConstraints
logger = logging.getLogger("disc")


def compile(
    model: torch.nn.Module,
    example_inputs: Sequence[Any],
    *,
    dynamic: Mapping[str, Mapping[int, str]] | None = None,
    constraints: Constraints | None = None,
    backend: str | None = None,
    cache: bool | None = None,
) -> CompiledModule | PerBranchModule:
    """Compile ``model`` once for every shape.

    ``dynamic`` names the dynamic dims per input: ``{"ids": {0: "batch", 1: "seq"}}``;
    inputs sharing a name share the dim. Other dims are static. The inputs of a ``*past``
    parameter are ``past_0``, ``past_1``, ...; ``{"past": {...}}`` names the dims of each.
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

    A model whose code branches on a dynamic size (or calls ``int()`` on one) has no single
    program: torch.export refuses it, and ``compile`` returns a ``PerBranchModule`` that
    compiles one graph per branch through ``torch.compile(backend="disc")`` (with a warning;
    ``disc.explain`` says why). Given ``constraints`` or a ``backend``, it raises instead.
    """
    from disc.frontends.torch.export import capture, varargs_dynamic
    from disc.runtime import program_cache

    if not isinstance(model, torch.nn.Module):
        raise CompileError(f"disc.compile expects a torch.nn.Module, got {type(model).__name__}")
    if dynamic is not None and not isinstance(dynamic, Mapping):
        raise CompileError(
            f"disc.compile: dynamic must map input names to {{axis: dim name}}, e.g. {{'x': {{0: 'batch', 1: 'seq'}}}}; got {dynamic!r}. "
            "(dynamic=True is torch.compile's flag: torch.compile(model, backend='disc', dynamic=True) makes every dim dynamic.)"
        )
    if dynamic is not None:
        dynamic = varargs_dynamic(model, tuple(example_inputs), dynamic)
    start = time.perf_counter()
    ranges, facts = parse_user_constraints(constraints)
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
        hit, cached = program_cache.lookup(key, load)
        if hit is not None:
            hit.report.cache = cached
            hit.report.compile_seconds = time.perf_counter() - start
            _watch_weights(hit, model, dict(dynamic=dynamic, constraints=constraints, backend=backend, cache=cache))
            return hit
    try:
        captured = capture(model, tuple(example_inputs), dict(dynamic or {}), ranges)
    except CaptureError as e:
        if backend not in (None, "auto") or facts or ranges:
            raise  # the per-branch graphs could not honour the backend or constraints asked for
        return _per_branch(model, tuple(example_inputs), dict(dynamic or {}), e)
    graph = captured.importer.graph
    apply_user_facts(graph.constraints, facts, ranges)
    program = compile_graph(graph, captured.importer.fallbacks, backend=backend, device=example_device(example_inputs))
    executor, choice = program.executor, program.choice
    report = CompileReport(
        name=type(model).__name__,
        source="disc.compile",
        graph=program.graph,
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


def _per_branch(model: torch.nn.Module, args: tuple, dynamic: Mapping[str, Mapping[int, str]], error: CaptureError) -> PerBranchModule:
    """Never a crash where torch.export refuses a model whose code branches on its sizes: compile
    a graph per branch through dynamo, which guards on the branch, and say so."""
    from disc.frontends.torch.export import input_names_of

    why = str(error)
    first = why.splitlines()[0]
    short = first if len(first) <= 400 else first[:400] + " ..."  # a shape check can be a page of polynomial
    logger.warning("disc.compile: %s; compiling one graph per branch of its code through torch.compile instead (disc.explain says more)", short)
    return PerBranchModule(model, list(args), input_names_of(model, args), dynamic, why)


def load(
    folder: str | os.PathLike,
    *,
    backend: str | None = None,
    external: Mapping[str, torch.Tensor] | None = None,
    external_digests: Mapping[str, str] | None = None,
    verify: bool = False,
) -> CompiledModule:
    """The program ``disc.save`` wrote to ``folder``, ready to call at any shape.

    A native CPU program opens its saved library (no lowering, no code generation, no C++
    compile where it was built for this CPU); other programs (segments around PyTorch ops, GPU
    programs, or another ``backend`` asked for) are built again from the saved IR by the
    compile driver, without its passes. ``external``: the constants saved as external, by the
    owner's names (program-cache entries), with ``external_digests`` their SHA-256 by the same
    names (checked against the entry's). ``verify``: lower the IR again and refuse the folder
    unless that gives its saved C++.
    """
    from disc.frontends.torch.importer import Fallback
    from disc.runtime.artifact import read

    start = time.perf_counter()
    saved = read(folder, host_op=Fallback.from_json, backend=backend, external=external, external_digests=external_digests, verify=verify)
    executor, choice = saved.executor, saved.choice
    if executor is None:
        program = compile_graph(saved.graph, saved.fallbacks, backend=saved.backend, device=saved.device, optimize=False)
        executor, choice = program.executor, program.choice
    report = CompileReport(
        name=saved.name,
        source="disc.load",
        graph=saved.graph,
        fallbacks=saved.fallback_counts,
        compile_seconds=time.perf_counter() - start,
        hints=dict(saved.capture.get("hints", {})),
        decomposed_because=saved.capture.get("decomposed_because"),
        backend=choice,
        fallback_calls=saved.fallbacks,
    )
    record_report(report)
    return CompiledModule(report, executor, saved.input_names, saved.out_spec)


def save(compiled: CompiledModule, folder: str | os.PathLike) -> Path:
    """Write ``compiled`` to ``folder`` (replacing a saved program there); ``load`` runs it again."""
    from disc.runtime.artifact import save as write

    if isinstance(compiled, PerBranchModule):
        return compiled.save(folder)  # says why it cannot
    return write(compiled, folder)


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


def _check_the_example_meets_them(model: torch.nn.Module, args: tuple, dynamic: Mapping[str, Mapping[int, str]], ranges: Mapping[str, Any], facts: list[Any]) -> None:
    """Refuse, before anything is traced, dims and constraints the example inputs contradict: the
    program would reject every input, its own example included."""
    from disc.frontends.torch.export import input_names_of
    from disc.shape.expr import SYMBOL_NAME_RULE, is_symbol_name

    names = input_names_of(model, args)
    seen: dict[str, tuple[str, int, int]] = {}  # dim name -> (input, axis, example size) where first named
    for name, t in zip(names, args):
        if not isinstance(t, torch.Tensor):
            continue
        for axis, dim in dynamic.get(name, {}).items():
            if not isinstance(axis, int) or not -t.dim() <= axis < t.dim():
                continue  # capture names the bad axis
            if not is_symbol_name(dim):
                raise CompileError(f"input {name!r} dim {axis % t.dim()} is named {dim!r}; a dim name is {SYMBOL_NAME_RULE} (the program's text names dims so)")
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


def explain(obj: Any = None) -> str:
    """A readable account: IR with symbolic dims, constraints, fallbacks, compilations."""
    if isinstance(obj, CompiledModule):
        return obj.report.text()
    if isinstance(obj, PerBranchModule):
        return obj.text()
    if isinstance(obj, CompileReport):
        return obj.text()
    rs = reports()
    if not rs:
        return "disc: nothing compiled in this process yet"
    header = f"disc: {len(rs)} compilation(s) in this process"
    return "\n\n".join([header] + [r.text() for r in rs])
