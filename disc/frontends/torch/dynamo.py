"""Plug-in mode: ``torch.compile(model, backend="disc", dynamic=True)``.

Dynamo captures the frame, AOTAutograd decomposes it to core ATen with
SymInt sizes, and disc imports that graph exactly like an exported one. If
anything about a graph cannot be compiled, the backend returns the graph to
PyTorch to run as is (and says so in ``disc.explain``): plug-in mode never
breaks a model.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from disc.frontends.torch.importer import InputSpec, import_fx


def _user_name(placeholder: str) -> str:
    # Dynamo names inputs like L_input_ids_ or l_self_modules_...; keep the readable part.
    name = placeholder
    for prefix in ("L_", "l_"):
        name = name.removeprefix(prefix)
    return name.rstrip("_") or placeholder


def disc_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **options: Any) -> Callable[..., Any]:
    """The torch.compile backend (registered as ``"disc"``)."""
    from torch._decomp import core_aten_decompositions
    from torch._functorch.aot_autograd import aot_module_simplified

    # Tensor inputs only: dynamo also passes SymInt sizes as placeholders.
    user_names = [_user_name(n.target) for n in gm.graph.nodes if n.op == "placeholder" and isinstance(n.meta.get("example_value"), torch.Tensor)]
    params = dict(gm.named_parameters(remove_duplicate=False))
    buffers = dict(gm.named_buffers(remove_duplicate=False))
    n_state = len(params) + len(buffers)
    state_values = list(params.values()) + list(buffers.values())
    start = time.perf_counter()

    def fw_compiler(fx_gm: torch.fx.GraphModule, fx_inputs: Sequence[Any]) -> Callable[..., Any]:
        try:
            return _compile_aten(fx_gm, fx_inputs, user_names, state_values, n_state, start)
        except Exception as e:  # never break the user's model: run this graph in PyTorch
            _record_failure(gm, e, start)
            return _boxed(fx_gm)

    compiled = aot_module_simplified(gm, list(example_inputs), fw_compiler=fw_compiler, decompositions=core_aten_decompositions())
    if _last_report_compiled():
        _drop_zero_one_specialisation(example_inputs)
    return compiled


def _last_report_compiled() -> bool:
    rs = _reports_from_dynamo()
    return bool(rs) and rs[-1].graph.name != "not_compiled"


def _drop_zero_one_specialisation(example_inputs: Sequence[Any]) -> None:
    """Let dynamo reuse this graph when a dynamic dim is 1.

    Dynamo gives every dynamic size the range [2, inf) ("0/1 specialisation")
    and guards on it, so a later call with a size-1 dim recompiles. disc's
    program does not need that assumption: it derives shapes itself and
    decides broadcasts at run time, with runtime checks where torch's trace
    relied on a dim not being 1. So, once disc has compiled the graph, the
    lower bound of each such symbol is relaxed to 1 before dynamo produces
    its guards. Explicit guards (user code branching on a size) stay.
    """
    from torch._guards import detect_fake_mode
    from torch.utils._sympy.value_ranges import ValueRanges

    fake_mode = detect_fake_mode(list(example_inputs))
    shape_env = getattr(fake_mode, "shape_env", None)
    if shape_env is None:
        return
    for sym, vr in list(shape_env.var_to_range.items()):
        if vr.lower == 2 and sym in getattr(shape_env, "var_to_sources", {}):
            shape_env.var_to_range[sym] = ValueRanges(1, vr.upper)
    guards = getattr(shape_env, "guards", None)
    if isinstance(guards, list):
        guards[:] = [g for g in guards if not _is_meta_kernel_not_one_guard(g)]


# Files of torch's own shape checks (meta kernels, refs, contiguity helpers).
_TORCH_META_FILES = ("_prims_common", "_subclasses/fake_impls", "_meta_registrations", "_refs/")


def _is_meta_kernel_not_one_guard(guard: Any) -> bool:
    """A ``size != 1``-style guard that torch's own meta kernels added, not user code.

    Such guards (contiguity checks, broadcast inference inside a fake kernel)
    describe how torch traced the op, not what the program means; disc
    derives broadcasts itself and checks them at run time, so they may go.
    Guards from user code (``if x.size(0) == 1``) are kept.
    """
    import sympy

    expr = getattr(guard, "expr", None)
    if not isinstance(expr, sympy.Ne):
        return False
    loc = getattr(getattr(guard, "sloc", None), "framework_loc", None)
    filename = loc if isinstance(loc, str) else getattr(loc, "filename", "") or ""
    return any(part in filename.replace("\\", "/") for part in _TORCH_META_FILES)


def _boxed(fx_gm: torch.fx.GraphModule) -> Callable[..., Any]:
    from torch._functorch.aot_autograd import make_boxed_func

    return make_boxed_func(fx_gm.forward)


def _compile_aten(
    fx_gm: torch.fx.GraphModule,
    fx_inputs: Sequence[Any],
    user_names: list[str],
    state_values: list[torch.Tensor],
    n_state: int,
    start: float,
) -> Callable[..., Any]:
    from torch._functorch.aot_autograd import make_boxed_func

    from disc.api import CompileReport, record_report
    from disc.passes.pipeline import run_pipeline
    from disc.runtime.backend import make_executor

    placeholders = [n for n in fx_gm.graph.nodes if n.op == "placeholder"]
    # Inference graphs from AOTAutograd lift parameters and buffers first; they
    # become constants when nothing requires grad (training keeps them inputs).
    as_constants = not torch.is_grad_enabled() or not any(t.requires_grad for t in state_values)
    constants: dict[str, torch.Tensor] = {}
    if as_constants and len(placeholders) >= n_state:
        for node, value in zip(placeholders[:n_state], state_values):
            constants[node.target] = value.detach()
    specs: list[InputSpec] = []
    user_iter = iter(user_names)
    tensor_positions: list[int] = []
    for pos, (node, val) in enumerate(zip(placeholders, fx_inputs)):
        if node.target in constants:
            continue
        if not isinstance(val, torch.Tensor):
            continue  # SymInt sizes: recomputed by disc from tensor dims
        name = next(user_iter, node.target) if pos >= n_state else node.target
        dims = {axis: str(d.node.expr) for axis, d in enumerate(val.shape) if isinstance(d, torch.SymInt) and d.node.expr.is_Symbol}
        specs.append(InputSpec(name, dims))
        tensor_positions.append(pos)
    importer = import_fx(fx_gm, specs, constants, name="dynamo_graph")
    graph = run_pipeline(importer.graph)
    executor, choice = make_executor(graph, importer.fallbacks)
    report = CompileReport(
        name=f"torch.compile graph {len(_reports_from_dynamo()) + 1}",
        source="torch.compile",
        graph=graph,
        fallbacks=dict(importer.fallback_counts),
        compile_seconds=time.perf_counter() - start,
        backend=choice,
    )
    record_report(report)
    names = [s.name for s in specs]

    from disc.runtime.checks import check_inputs

    def run(*args: Any) -> list[torch.Tensor]:
        tensors = [args[p] for p in tensor_positions]
        check_inputs(graph, names, tensors)
        report.calls += 1
        with torch.no_grad():
            return executor.run(tensors)

    return make_boxed_func(run)


def _reports_from_dynamo() -> list[Any]:
    from disc.api import reports

    return [r for r in reports() if r.source == "torch.compile"]


def _record_failure(gm: torch.fx.GraphModule, error: Exception, start: float) -> None:
    from disc.api import CompileReport, record_report
    from disc.ir.graph import Graph

    report = CompileReport(
        name=f"torch.compile graph (NOT compiled: {type(error).__name__}: {error})",
        source="torch.compile",
        graph=Graph(name="not_compiled"),
        fallbacks={"<whole graph>": 1},
        compile_seconds=time.perf_counter() - start,
    )
    record_report(report)
    if _env_set("DISC_DEBUG"):
        traceback.print_exception(error)


def _env_set(name: str) -> bool:
    """Is the environment flag ``name`` set (to anything but empty or 0)?"""
    import os

    return os.environ.get(name, "") not in ("", "0")


def register() -> None:
    """Register ``"disc"`` with dynamo (also done by the torch_dynamo_backends entry point)."""
    from torch._dynamo.backends.registry import _BACKENDS, register_backend

    if "disc" not in _BACKENDS or _BACKENDS.get("disc") is None:
        register_backend(name="disc")(disc_backend)
    _turn_off_duck_sizing()


def _turn_off_duck_sizing() -> None:
    """Stop dynamo from merging input dims that are equal by coincidence.

    With duck sizing (torch's default) dims of equal size on the first call
    share one symbol: an image batch of 3 shares the symbol of the 3 RGB
    channels, the convolution's channel check pins it to the constant 3, and
    every other batch size recompiles. disc proves the equalities a program
    needs from op semantics, so merging by coincidence only costs it
    recompilations. A backend cannot change how dynamo traced a frame after
    the fact, and ``torch.compile`` gives a backend no hook before tracing, so
    this is process-wide: other backends then get one symbol per dim too
    (still correct; possibly more general code). ``DISC_DUCK_SHAPE=1`` keeps
    torch's default.
    """
    import torch.fx.experimental._config as fx_config

    if not _env_set("DISC_DUCK_SHAPE"):
        fx_config.use_duck_shape = False
