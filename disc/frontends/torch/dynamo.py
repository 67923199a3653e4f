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

from disc.errors import CompileError
from disc.frontends.torch.importer import InputSpec, import_fx


def _user_name(placeholder: str) -> str:
    # Dynamo names inputs like L_input_ids_ or l_self_modules_...; keep the readable part.
    name = placeholder
    for prefix in ("L_", "l_"):
        name = name.removeprefix(prefix)
    return name.rstrip("_") or placeholder


def _state_name(placeholder: str) -> str:
    # Dynamo names an inlined module's weight l_self_modules_encoder_modules_fc_parameters_weight_:
    # for messages, the module's own spelling (encoder.fc.weight).
    name = _user_name(placeholder).removeprefix("self_")
    for part in ("modules", "parameters", "buffers"):
        name = name.replace(f"_{part}_", ".").removeprefix(f"{part}_")
    return name


OPTIONS = ("partitioner",)  # what torch.compile(backend="disc", options={...}) accepts
PARTITIONERS = ("min_cut", "default")


def disc_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **options: Any) -> Callable[..., Any]:
    """The torch.compile backend (registered as ``"disc"``).

    ``torch.compile(..., options={"partitioner": "default"})`` saves every activation a
    training backward needs instead of min-cut rematerialisation (``$DISC_PARTITIONER``
    sets the default).
    """
    from torch._functorch.aot_autograd import aot_module_simplified

    settings = dict(options.get("options") or {})
    unknown = sorted(set(settings) - set(OPTIONS)) + sorted(set(options) - {"options"})
    if unknown:
        raise ValueError(f"torch.compile(backend='disc'): unknown option(s) {unknown}; disc takes options={{{', '.join(repr(k) + ': ...' for k in OPTIONS)}}}")

    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    # The module's parameters and buffers reach AOTAutograd in one of two ways: as the graph
    # module's own attributes (lifted in front of the inputs), or, as dynamo passes inlined
    # nn.Modules (torch's default since 2.5), as placeholders among the user's inputs.
    lifted = [*gm.named_parameters(remove_duplicate=False), *gm.named_buffers(remove_duplicate=False)]
    inlined = _module_state_positions(placeholders, example_inputs)
    # AOTAutograd's forward graph reads the lifted state first, then dynamo's placeholders.
    at = len(lifted)
    state = {i: t for i, (_, t) in enumerate(lifted)} | {at + p: example_inputs[p] for p in inlined}
    state_names = {i: name for i, (name, _) in enumerate(lifted)} | {at + p: _state_name(placeholders[p].target) for p in inlined}
    names = {i: name.replace(".", "_") for i, (name, _) in enumerate(lifted)}
    names |= {at + p: _user_name(n.target) for p, n in enumerate(placeholders) if isinstance(n.meta.get("example_value"), torch.Tensor)}
    n_placeholders = at + len(placeholders)
    grad_enabled = torch.is_grad_enabled()  # the caller's mode (dynamo guards on it); AOTAutograd compiles under no_grad
    start = time.perf_counter()

    outcomes: list[bool] = []  # per compiled graph: did disc compile it?

    def compile_or_keep(
        fx_gm: torch.fx.GraphModule,
        fx_inputs: Sequence[Any],
        kind: str,
        names: dict[int, str],
        state: dict[int, torch.Tensor],
        state_names: dict[int, str],
    ) -> Callable[..., Any]:
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        try:
            with unset_fake_temporarily():  # AOTAutograd calls its compilers in fake mode; constants are real
                compiled = _compile_aten(fx_gm, fx_inputs, names, state, state_names, start, kind)
        except Exception as e:  # never break the user's model: run this graph in PyTorch
            _record_failure(gm, e, start, kind)
            outcomes.append(False)
            return _boxed(fx_gm)
        outcomes.append(True)
        return compiled

    def fw_compiler(fx_gm: torch.fx.GraphModule, fx_inputs: Sequence[Any]) -> Callable[..., Any]:
        constants = _frozen_state(state, len(fx_inputs) == n_placeholders, grad_enabled)
        return compile_or_keep(fx_gm, fx_inputs, "forward", names, constants, state_names)

    def bw_compiler(fx_gm: torch.fx.GraphModule, fx_inputs: Sequence[Any]) -> Callable[..., Any]:
        # The backward graph's inputs are the tensors the forward saved and the output
        # gradients (AOTAutograd names them), its outputs the input gradients.
        return compile_or_keep(fx_gm, fx_inputs, "backward", {}, {}, {})

    # Dynamo's DDP graph splitting runs the first call of each piece itself, to use up the fake
    # outputs AOTAutograd gives at a first call, only when this counter says AOTAutograd ran.
    from torch._dynamo.utils import counters

    counters["aot_autograd"]["total"] += 1
    with _attention_kernels_for_every_shape():
        compiled = aot_module_simplified(
            gm,
            list(example_inputs),
            fw_compiler=fw_compiler,
            bw_compiler=bw_compiler,
            partition_fn=_partitioner(settings.get("partitioner")),
            decompositions=_decompositions(),
        )
    # AOTAutograd compiles the backward lazily or at once depending on the torch version;
    # only a graph disc compiled (forward, and backward once it exists) may drop torch's
    # size-1 assumptions.
    if all(outcomes) and outcomes and not _trains_batch_norm(gm):
        _drop_zero_one_specialisation(example_inputs)
    return compiled


def _attention_kernels_for_every_shape() -> Any:
    """The caller's fused-attention choices, less cuDNN's, while AOTAutograd traces.

    Tracing ``scaled_dot_product_attention`` on CUDA records the fused kernel PyTorch picks for
    the example shapes, and the graph replays that kernel at every later shape. cuDNN's refuses
    some of them (``s_q = s_kv = 1``, a one-token sequence), where eager would have picked
    another; flash and memory-efficient attention take every length. (Seen on nine Hugging Face
    models trained under bf16 autocast on an H200.)
    """
    import contextlib

    from torch.nn.attention import SDPBackend, sdpa_kernel

    cuda = torch.backends.cuda
    if not cuda.cudnn_sdp_enabled():
        return contextlib.nullcontext()
    enabled = [
        backend
        for backend, on in (
            (SDPBackend.FLASH_ATTENTION, cuda.flash_sdp_enabled()),
            (SDPBackend.EFFICIENT_ATTENTION, cuda.mem_efficient_sdp_enabled()),
            (SDPBackend.MATH, cuda.math_sdp_enabled()),
        )
        if on
    ]
    return sdpa_kernel(enabled or [SDPBackend.MATH])


def _decompositions() -> dict[Any, Callable[..., Any]]:
    """Core ATen, plus training-mode BatchNorm (with or without running statistics) as plain ops."""
    from torch._decomp import core_aten_decompositions, get_decompositions

    aten = torch.ops.aten
    table = dict(core_aten_decompositions())
    # torch decomposes the CPU flash-attention kernel into math that returns the probability
    # matrix where its backward reads logsumexp: disc lowers the kernel itself (lowering_attention).
    table.pop(aten._scaled_dot_product_flash_attention_for_cpu.default, None)
    batch_norm = get_decompositions([aten._native_batch_norm_legit_functional, aten._native_batch_norm_legit, aten.native_batch_norm_backward])
    table.update({op: _statistics_in_double_on_cpu(fn, 2 if op is aten.native_batch_norm_backward.default else 1) for op, fn in batch_norm.items()})
    return table


def _statistics_in_double_on_cpu(decomposition: Callable[..., Any], tensor_args: int) -> Callable[..., Any]:
    """``decomposition`` run in float64 for float32 tensors on the CPU, its results cast back.

    Eager's CPU BatchNorm kernels sum in double (``acc_type<float, false>``); torch's
    decomposition sums in float32. Over a few values per channel (a small feature map at
    batch 1) that difference is amplified by ``1/std`` past 1e-4; following eager keeps disc
    as close to exact as eager is. The first ``tensor_args`` arguments (the input, and the
    output gradient in the backward) carry the dtype the decomposition computes in.
    """

    def run(*args: Any, **kwargs: Any) -> Any:
        first = args[0]
        if first.device.type != "cpu" or first.dtype != torch.float32:
            return decomposition(*args, **kwargs)
        upcast = tuple(a.double() if i < tensor_args and isinstance(a, torch.Tensor) else a for i, a in enumerate(args))
        back = lambda t: t.float() if isinstance(t, torch.Tensor) and t.dtype == torch.float64 else t  # noqa: E731
        out = decomposition(*upcast, **kwargs)
        return tuple(back(t) for t in out) if isinstance(out, (tuple, list)) else back(out)

    return run


def _partitioner(name: str | None = None) -> Callable[..., Any]:
    """How AOTAutograd splits a training graph into forward and backward.

    ``"min_cut"`` (the default) saves fewer activations: cheap ops are recomputed
    in the backward. ``"default"`` saves every activation the backward needs.
    ``benchmarks/training.py`` measures both (system ``disc-save-all``).
    """
    import os

    from torch._functorch.partitioners import default_partition, min_cut_rematerialization_partition

    name = name or os.environ.get("DISC_PARTITIONER", "min_cut")
    if name not in PARTITIONERS:
        raise ValueError(f"partitioner {name!r} is not one of {PARTITIONERS}")
    if name == "default":
        return default_partition

    def min_cut(*args: Any, **kwargs: Any) -> Any:
        # Views are recomputed in the backward, not saved: a saved transpose would be a
        # copy in disc's forward (its outputs are contiguous), while a transpose in the
        # backward folds into the GEMM that reads it.
        from torch._functorch import config

        with config.patch(recompute_views=True):
            return min_cut_rematerialization_partition(*args, compiler="inductor", **kwargs)

    return min_cut


def _trains_batch_norm(gm: torch.fx.GraphModule) -> bool:
    """Does the frame run BatchNorm in training mode?

    ``F.batch_norm`` refuses one value per channel in Python, before any op
    runs; dynamo folded that check away because it assumed sizes >= 2. Such a
    frame keeps dynamo's size-1 guards, so a 1-sized batch retraces and the
    check raises as in eager (rather than the statistics becoming NaN).
    """
    import torch.nn.functional as F

    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target in (F.batch_norm, torch.batch_norm):
            training = n.kwargs.get("training", n.args[5] if len(n.args) > 5 else False)
            if training is not False:
                return True
    return False


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


def _module_state_positions(placeholders: list[torch.fx.Node], example_inputs: Sequence[Any]) -> list[int]:
    """Which of dynamo's placeholders are parameters or buffers of the (inlined) nn.Modules."""
    try:
        from torch._dynamo.source import is_from_unspecialized_param_buffer_source
    except ImportError:  # a torch without inlined modules: its state is lifted instead
        return []
    positions = []
    for pos, (node, value) in enumerate(zip(placeholders, example_inputs)):
        source = getattr(node, "_dynamo_source", None) or getattr(node.meta.get("grapharg"), "source", None)
        if isinstance(value, torch.Tensor) and source is not None and is_from_unspecialized_param_buffer_source(source):
            positions.append(pos)
    return positions


def _frozen_state(state: dict[int, torch.Tensor], layout_matches: bool, grad_enabled: bool) -> dict[int, torch.Tensor]:
    """The module state a forward graph may read as constants (placeholder position -> tensor).

    Inference only, as with ``disc.compile``: a program reads its weights as constants (packed
    once for the GEMM library, folded where passes can). Training keeps them inputs. State the
    graph writes or returns a view of (a running count, a cache buffer) stays an input, as does
    everything when AOTAutograd's metadata is missing or its inputs are not laid out as expected.
    """
    if not state or not layout_matches:
        return {}
    if grad_enabled and any(t.requires_grad for t in state.values()):
        return {}
    from torch._guards import TracingContext

    meta = getattr(TracingContext.try_get(), "fw_metadata", None)
    if meta is None:
        return {}
    written = {i for i, info in enumerate(meta.input_info) if info.mutates_data or info.mutates_metadata}
    written |= {out.base_idx for out in meta.output_info if out.base_idx is not None}
    return {i: t for i, t in state.items() if i not in written}


def _boxed(fx_gm: torch.fx.GraphModule) -> Callable[..., Any]:
    from torch._functorch.aot_autograd import make_boxed_func

    return make_boxed_func(fx_gm.forward)


def _compile_aten(
    fx_gm: torch.fx.GraphModule,
    fx_inputs: Sequence[Any],
    names: dict[int, str],
    constants_at: dict[int, torch.Tensor],
    state_names: dict[int, str],
    start: float,
    kind: str = "forward",
) -> Callable[..., Any]:
    """disc's program for one AOTAutograd graph: ``constants_at`` maps placeholder positions to
    the tensors read as constants, ``names`` others to the user's input names (``state_names``:
    the module's names of its parameters and buffers, for messages)."""
    from torch._functorch.aot_autograd import make_boxed_func

    from disc.driver import compile_graph, example_device, executor_device
    from disc.report import CompileReport, record_report

    if any(n.target is torch.ops.higher_order.with_effects for n in fx_gm.graph.nodes):
        # An op with side effects (linalg's error checks) threads an effect token, which
        # AOTAutograd passes as None at run time: a graph disc would have to take a None for.
        raise CompileError("the graph threads an effect token (an op with side effects): it runs in PyTorch")
    placeholders = [n for n in fx_gm.graph.nodes if n.op == "placeholder"]
    constants = {placeholders[pos].target: value.detach() for pos, value in constants_at.items()}
    specs: list[InputSpec] = []
    tensor_positions: list[int] = []
    carried = {d.node.expr for pos, v in enumerate(fx_inputs) if pos not in constants_at and isinstance(v, torch.Tensor) for d in v.shape if isinstance(d, torch.SymInt)}
    size_positions: set[int] = set()  # SymInt inputs no tensor carries: passed as empty tensors' dims
    for pos, (node, val) in enumerate(zip(placeholders, fx_inputs)):
        if isinstance(val, torch.SymInt) and val.node.expr.is_Symbol and val.node.expr not in carried:
            carried.add(val.node.expr)
            size_positions.add(pos)
            specs.append(InputSpec(names.get(pos, node.target)))
            tensor_positions.append(pos)
            continue
        if pos in constants_at or not isinstance(val, torch.Tensor):
            continue  # constants, and SymInt sizes (disc recomputes them from tensor dims)
        dims = {axis: str(d.node.expr) for axis, d in enumerate(val.shape) if isinstance(d, torch.SymInt) and d.node.expr.is_Symbol}
        specs.append(InputSpec(names.get(pos, node.target), dims))
        tensor_positions.append(pos)
    title = f"torch.compile graph {len(_reports_from_dynamo()) + 1}" + ("" if kind == "forward" else f" ({kind})")

    def build() -> tuple[Any, Any, CompileReport]:
        size_inputs = frozenset(placeholders[p].target for p in size_positions)
        importer = import_fx(fx_gm, specs, constants, name="dynamo_graph", allow_host_outputs=True, allow_rng=True, size_inputs=size_inputs)
        program = compile_graph(importer.graph, importer.fallbacks, device=example_device(fx_inputs))
        executor = program.executor
        report = CompileReport(
            name=title,
            source="torch.compile",
            graph=program.graph,
            fallbacks=dict(importer.fallback_counts),
            compile_seconds=time.perf_counter() - start,
            backend=program.choice,
            fallback_calls=dict(importer.fallbacks),
        )
        record_report(report)
        return importer, executor, report

    importer, executor, report = build()
    input_names = [s.name for s in specs]
    seeded = importer.rng_seed is not None  # the graph draws random numbers: one fresh seed per call
    if seeded:
        input_names.append(importer.rng_seed.name)
    host_outputs = _HostOutputs(placeholders, fx_inputs, importer.output_layout, _output_values(fx_gm))

    from disc.runtime.checks import InputChecker
    from disc.runtime.constant_versions import ConstantVersions

    check_inputs = InputChecker(report.graph, input_names, executor_device(executor))
    weights = ConstantVersions({state_names.get(pos, placeholders[pos].target): value for pos, value in constants_at.items()})
    program = [executor, report]  # replaced whole when the weights change

    def compile_again() -> None:
        _, fresh, fresh_report = build()
        program[:] = [fresh, fresh_report]

    def run(*args: Any) -> list[Any]:
        if size_positions and any(int(args[p]) < 0 for p in size_positions):
            # A program takes an int argument as a size, which cannot be negative (an arange's
            # start, a shift): this call runs the graph in PyTorch, as eager would.
            return list(fx_gm(*args))
        tensors = [_size_carrier(args[p], check_inputs.device) if p in size_positions else args[p] for p in tensor_positions]
        if seeded:  # from torch's generator, so torch.manual_seed reproduces the draws
            tensors.append(torch.randint(-(2**63), 2**63 - 1, (1,), dtype=torch.int64, device=check_inputs.device))
        check_inputs(tensors)
        if weights.changed():
            weights.recompile_if_changed(title, compile_again)
        executor, report = program
        report.calls += 1
        with torch.no_grad():
            outs = executor.run(tensors)
        return host_outputs.assemble(outs, args)

    return make_boxed_func(run)


def _size_carrier(size: Any, device: Any) -> torch.Tensor:
    """An empty tensor whose first dim is ``size``: how a program takes a size as an input."""
    return torch.empty((int(size), 0), dtype=torch.int8, device=device)


def _output_values(gm: torch.fx.GraphModule) -> list[Any]:
    """torch's value (a fake tensor, a SymInt, None) of each output of ``gm``."""
    outs = gm.graph.output_node().args[0]
    return [o.meta.get("val") if isinstance(o, torch.fx.Node) else o for o in outs]


def _size_function(expr: Any, symbols: list[Any]) -> Callable[..., int]:
    """``expr`` (torch's sympy, with FloorDiv and friends) as a function of ``symbols``' values."""
    import sympy

    def evaluate(*values: int) -> int:
        return int(expr.xreplace({s: sympy.Integer(v) for s, v in zip(symbols, values)}))

    return evaluate


# A size as a function of some arguments' values: (function, [(argument, axis or None for an int argument)]).
_SizeOfArgs = tuple[Callable[..., int], list[tuple[int, int | None]]]


def _size_of(size: _SizeOfArgs, args: Sequence[Any]) -> int:
    fn, sources = size
    return int(fn(*[args[p] if axis is None else args[p].shape[axis] for p, axis in sources]))


class _HostOutputs:
    """The outputs of an AOTAutograd graph that are not tensors disc computes.

    A backward graph returns ``None`` for inputs without a gradient; a training
    forward returns the sizes its backward needs. Sizes are torch expressions
    over the graph's size symbols, evaluated from the actual arguments.

    An output that is a view of an input (``chunk``, ``expand`` of an argument) is returned as
    that view of the real argument, with torch's sizes, strides and offset: AOTAutograd rebuilds
    such an output from the argument with the returned tensor's strides, so disc's fresh
    contiguous result would be read at the wrong places.
    """

    def __init__(self, placeholders: list[torch.fx.Node], fx_inputs: Sequence[Any], layout: list[Any], values: Sequence[Any] = ()) -> None:
        import sympy
        from torch.multiprocessing.reductions import StorageWeakRef

        self.layout = layout
        where: dict[sympy.Symbol, tuple[int, int | None]] = {}  # symbol -> (argument, axis or None)
        for pos, val in enumerate(fx_inputs):
            if isinstance(val, torch.SymInt) and val.node.expr.is_Symbol:
                where.setdefault(val.node.expr, (pos, None))
            elif isinstance(val, torch.Tensor):
                for axis, d in enumerate(val.shape):
                    if isinstance(d, torch.SymInt) and d.node.expr.is_Symbol:
                        where.setdefault(d.node.expr, (pos, axis))

        def function(d: Any, what: str) -> _SizeOfArgs:
            """How to compute size ``d`` (an int or a SymInt) from the call's arguments."""
            if not isinstance(d, torch.SymInt):
                return (lambda: int(d)), []
            symbols = sorted(d.node.expr.free_symbols, key=str)
            missing = [x for x in symbols if x not in where]
            if missing:
                raise ValueError(f"{what} {d.node.expr} uses {missing}, which no input carries")
            return _size_function(d.node.expr, symbols), [where[x] for x in symbols]

        self.sizes: dict[int, _SizeOfArgs] = {}
        for k, item in enumerate(layout):
            if isinstance(item, torch.fx.Node):
                val = item.meta.get("val")
                if not isinstance(val, torch.SymInt):
                    raise ValueError(f"graph output {item.name} is neither a tensor nor a size")
                self.sizes[k] = function(val, "output size")

        storages = {}
        for pos, node in enumerate(placeholders):
            val = node.meta.get("val")
            if isinstance(val, torch.Tensor):
                storages.setdefault(StorageWeakRef(val.untyped_storage()), pos)
        self.views: dict[int, tuple[int, list[_SizeOfArgs], list[_SizeOfArgs], _SizeOfArgs]] = {}  # output -> (argument, sizes, strides, offset)
        for k, val in enumerate(values):
            if isinstance(self.layout[k], int) and isinstance(val, torch.Tensor):
                pos = storages.get(StorageWeakRef(val.untyped_storage()))
                if pos is not None:
                    sizes = [function(d, "a view's size") for d in val.shape]
                    strides = [function(d, "a view's stride") for d in val.stride()]
                    self.views[k] = (pos, sizes, strides, function(val.storage_offset(), "a view's offset"))
        self.trivial = not self.views and all(isinstance(x, int) for x in layout) and layout == list(range(len(layout)))

    def assemble(self, outs: list[torch.Tensor], args: Sequence[Any]) -> list[Any]:
        if self.trivial:
            return outs
        result: list[Any] = []
        for k, item in enumerate(self.layout):
            if k in self.views:
                pos, sizes, strides, offset = self.views[k]
                result.append(args[pos].as_strided([_size_of(d, args) for d in sizes], [_size_of(d, args) for d in strides], _size_of(offset, args)))
            elif isinstance(item, int):
                result.append(outs[item])
            elif k in self.sizes:
                result.append(_size_of(self.sizes[k], args))
            else:
                result.append(item)  # None, or a literal
        return result


def _reports_from_dynamo() -> list[Any]:
    from disc.report import reports

    return [r for r in reports() if r.source == "torch.compile"]


def _record_failure(gm: torch.fx.GraphModule, error: Exception, start: float, kind: str = "forward") -> None:
    from disc.ir.graph import Graph
    from disc.report import CompileReport, record_report

    report = CompileReport(
        name=f"torch.compile graph ({kind}, NOT compiled: {type(error).__name__}: {error})",
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
