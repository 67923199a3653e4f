"""``disc.compile`` frontend: capture with ``torch.export``, never specialising on 1.

torch.export (like dynamo) turns an example dim of size 0 or 1 into a constant.
disc therefore traces with *hint* inputs: every dynamic dim is set to a trace
size that is never 0 or 1 (``hint_candidates``: large distinct primes first,
then the user's own sizes, then small ones), growing or cutting the example's
own data so token ids stay in range and masks stay masks. Nothing in the
captured program depends on the hint: disc re-derives every shape with its
own symbolic rules, and each decision torch made assuming "this dim is not 1"
(a kept squeeze, a broadcast resolved at trace time) becomes a runtime check
or a runtime broadcast in disc's IR. See docs/internals.md, "Frontend".
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx.experimental import _config as fx_config

from disc.errors import CaptureError, CompileError, ShapeError
from disc.frontends.torch.importer import Importer, InputSpec, import_fx

DynamicSpec = Mapping[str, Mapping[int, str]]


@dataclass
class Captured:
    importer: Importer
    input_names: list[str]
    out_spec: Any
    hints: dict[str, int]
    decomposed_because: str | None = None  # None: imported as torch.export returned it


def _positional(model: torch.nn.Module) -> tuple[list[str], str | None]:
    """``forward``'s named positional parameters, and its ``*past`` parameter's name (or None)."""
    params = list(inspect.signature(model.forward).parameters.values())
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return names, next((p.name for p in params if p.kind == p.VAR_POSITIONAL), None)


def input_names_of(model: torch.nn.Module, args: Sequence[Any]) -> list[str]:
    """The names of the example inputs: ``forward``'s parameters, and ``past_0``, ``past_1``, ...
    for the inputs a ``*past`` parameter takes (a decoder's KV cache, one tensor per layer)."""
    names, rest = _positional(model)
    if len(args) > len(names):
        if rest is None:
            raise CompileError(f"{type(model).__name__}.forward takes {len(names)} positional inputs, got {len(args)} example inputs")
        names += [f"{rest}_{i}" for i in range(len(args) - len(names))]
    return names[: len(args)]


def varargs_dynamic(model: torch.nn.Module, args: Sequence[Any], dynamic: DynamicSpec) -> dict[str, Mapping[int, str]]:
    """``dynamic`` with a ``*past`` parameter's entry given to each of its inputs (``past_0``, ...)
    that has no entry of its own: ``{"past": {0: "batch", 2: "cached"}}`` names every cached tensor's dims."""
    fixed, rest = _positional(model)
    out = dict(dynamic)
    if rest is None or rest not in out:
        return out
    spec = out.pop(rest)
    for name in input_names_of(model, args)[len(fixed) :]:
        out.setdefault(name, spec)
    return out


# Trace sizes tried in order. Large, distinct primes first: no intermediate
# size of a realistic model (a conv pyramid, a head split) collapses to 0 or 1,
# and no two dims coincide by accident. Then the user's own sizes, then small
# ones for models that only accept short dims.
_LARGE_HINTS = (67, 61, 71, 59, 73, 53, 79, 47, 83, 43)
_SMALL_HINTS = (3, 5, 7, 2, 11, 13, 4, 17, 19, 6)


def hint_candidates(args: Sequence[torch.Tensor], names: Sequence[str], dynamic: DynamicSpec) -> list[dict[str, int]]:
    """Trace sizes for every dynamic dim name, in the order they are tried."""
    example: dict[str, int] = {}
    for name, t in zip(names, args):
        for axis, dim_name in dynamic.get(name, {}).items():
            example.setdefault(dim_name, int(t.shape[axis]))
    large = {d: _LARGE_HINTS[i % len(_LARGE_HINTS)] for i, d in enumerate(example)}
    small = {d: _SMALL_HINTS[i % len(_SMALL_HINTS)] for i, d in enumerate(example)}
    taken = {v for v in example.values() if v >= 2}
    own: dict[str, int] = {}
    spare = iter(h for h in _SMALL_HINTS if h not in taken)
    for d, size in example.items():
        own[d] = size if size >= 2 else next(spare)
    out: list[dict[str, int]] = []
    for cand in (large, own, small):
        if cand and cand not in out:
            out.append(cand)
    return out or [{}]


def _grow(t: torch.Tensor, axis: int, size: int) -> torch.Tensor:
    if t.shape[axis] == size:
        return t
    if t.shape[axis] == 0:
        shape = list(t.shape)
        shape[axis] = size
        return torch.zeros(shape, dtype=t.dtype)
    reps = [1] * t.dim()
    reps[axis] = -(-size // t.shape[axis])
    return t.repeat(*reps).narrow(axis, 0, size).contiguous()


def capture(
    model: torch.nn.Module,
    args: Sequence[Any],
    dynamic: DynamicSpec,
    ranges: Mapping[str, tuple[int | None, int | None]] | None = None,
) -> Captured:
    names = input_names_of(model, args)
    unknown = set(dynamic) - set(names)
    if unknown:
        raise CompileError(f"dynamic names unknown input(s) {sorted(unknown)}; inputs are {names}")
    for name, t in zip(names, args):
        if not isinstance(t, torch.Tensor):
            raise CompileError(f"input {name!r} is a {type(t).__name__}; disc.compile takes tensor inputs")
        for axis in dynamic.get(name, {}):
            if not -t.dim() <= axis < t.dim():
                raise CompileError(f"dynamic axis {axis} of input {name!r} is out of range for rank {t.dim()}")
    dynamic = {n: {a % args[names.index(n)].dim(): d for a, d in spec.items()} for n, spec in dynamic.items()}
    # Dim.DYNAMIC lets torch infer each dim's valid range (e.g. seq <= 512 from a
    # position table) and fails loudly if the model forces a dim to be static.
    ranges = ranges or {}
    dynamic_shapes = _export_dynamic_shapes(model, names, dynamic)
    ep, hints, oblivious = _export(model, args, names, dynamic, dynamic_shapes, decompose=False)
    specs = [InputSpec(n, dict(dynamic.get(n, {}))) for n in names]
    name = type(model).__name__
    why = why_decompose(ep)
    importer = _import(ep, specs, name) if why is None else None
    if importer is not None and importer.fallback_counts and _decomposes_a_fallback(ep, importer):
        why = f"{', '.join(sorted(importer.fallback_counts))} fell back to PyTorch"
    if why is not None:
        try:
            ep = _decompose(ep, oblivious)
        except Exception:  # a guard the re-trace adds at these sizes: export again from the next candidate on
            ep, hints, _ = _export(model, args, names, dynamic, dynamic_shapes, decompose=True)
        _refuse_mutations(ep, name)
        importer = _import(ep, specs, name)
    _refuse_a_program_that_refuses_its_example(importer, args, hints, name)
    c = importer.graph.constraints
    _apply_inferred_ranges(importer, ep)
    for dim_name, (lo, hi) in ranges.items():
        if dim_name in c.facts:
            c.set_range(dim_name, lo, hi)
    return Captured(importer, names, ep.call_spec.out_spec, hints, why)


def _export_dynamic_shapes(model: torch.nn.Module, names: Sequence[str], dynamic: DynamicSpec) -> tuple:
    """torch.export's ``dynamic_shapes``, positional: one entry per parameter, and for a ``*past``
    parameter one tuple of its inputs' entries (its inputs have no names in forward's signature)."""
    specs = [{axis: torch.export.Dim.DYNAMIC for axis in dynamic.get(name, {})} or None for name in names]
    fixed, rest = _positional(model)
    if rest is not None and len(names) >= len(fixed):
        return (*specs[: len(fixed)], tuple(specs[len(fixed) :]))
    return tuple(specs)


def _import(ep: Any, specs: list[InputSpec], name: str) -> Importer:
    sig = ep.graph_signature
    state = {**ep.state_dict, **ep.constants}
    constants: dict[str, torch.Tensor] = {}
    for placeholder, target in {**sig.inputs_to_parameters, **sig.inputs_to_buffers, **sig.inputs_to_lifted_tensor_constants}.items():
        value = state[target]
        constants[placeholder] = value.detach() if isinstance(value, torch.Tensor) else torch.as_tensor(value)
    return import_fx(ep.graph_module, specs, constants, name=name)


def _refuse_a_program_that_refuses_its_example(importer: Importer, args: Sequence[torch.Tensor], hints: Mapping[str, int], name: str) -> None:
    """The captured program's shape checks must hold at the example's own sizes.

    torch.export traces at the hint sizes; where the model's code branches on a size
    (Swin: ``if pad > 0: crop``) it may keep the branch those sizes take without a guard.
    The program is then right only for sizes that take the same branch, and its checks (a
    reshape's element count) refuse the rest. Evaluating the checks at the example finds that
    at compile time, before a user's first call does.
    """
    from disc.runtime.reference import build_shape_program

    graph = importer.graph
    if len(graph.inputs) != len(args):
        return
    try:
        build_shape_program(graph).fn([tuple(int(n) for n in t.shape) for t in args])
    except ShapeError as e:
        traced = ", ".join(f"{d}={v}" for d, v in hints.items())
        raise CaptureError(
            f"torch.export's program of {name}, traced at {traced}, refuses the example's own sizes: {e}. "
            "The model's code branches on a size and the trace kept the branch its sizes take"
        ) from e


def _refuse_mutations(ep: Any, name: str) -> None:
    """A forward that writes a buffer or an input has side effects disc.compile's program does not have."""
    sig = ep.graph_signature
    written = [f"buffer {b!r}" for b in sig.buffers_to_mutate.values()] + [f"input {i!r}" for i in sig.user_inputs_to_mutate.values()]
    if written:
        raise CompileError(
            f"{name}.forward writes {', '.join(sorted(written))} in place; disc.compile compiles side-effect-free programs. "
            "torch.compile(model, backend='disc') keeps such writes (PyTorch applies them around the compiled graph)."
        )


def _decomposes_a_fallback(ep: Any, importer: Importer) -> bool:
    """Would decomposing rewrite an op that fell back? Core ATen ops (``sort``)
    come out of the re-trace as they went in, and fall back again."""
    table = _decompositions(ep)
    return any(not _kept_by_decomposition(f.target, table) for f in importer.fallbacks.values())


def _kept_by_decomposition(target: Any, table: Any) -> bool:
    """Does ``run_decompositions`` leave this op as it is? Not if the table decomposes it, nor if
    it is CompositeImplicitAutograd (``view_as``): the re-trace expands those itself."""
    if not isinstance(target, torch._ops.OpOverload) or target in table:
        return False
    return not torch._C._dispatch_has_kernel_for_dispatch_key(target.name(), "CompositeImplicitAutograd")


# In-place ops that change a tensor's autograd state, not its values (Hugging Face's rotary
# embeddings call ``detach_``): an inference program imports them as the identity.
_AUTOGRAD_ONLY_MUTATIONS = (torch.ops.aten.detach_.default,)


def why_decompose(ep: Any) -> str | None:
    """Why disc cannot import this export as it is, without ``run_decompositions`` (None: it can).

    Decomposing re-traces the whole program (BERT-base: 4.5 s of a 7.5 s
    compile) to turn ops like ``linear`` and ``layer_norm`` into core ATen,
    which disc lowers just as well directly (``lowering_composite.py``). It is
    needed when the program mutates something (decomposition functionalises
    it) or has an op disc has no lowering for but torch decomposes; an op
    whose lowering refuses later sends ``capture`` back to the decomposed form
    too. A core ATen op without a lowering runs in PyTorch either way.
    """
    import operator

    from disc.frontends.torch.lowering import LOWERINGS, SYMINT_OPS

    sig = ep.graph_signature
    mutated = [*sig.buffers_to_mutate.values(), *sig.user_inputs_to_mutate.values()]
    if mutated:
        return f"the program mutates {', '.join(sorted(mutated))}"
    table = _decompositions(ep)
    for n in ep.graph.nodes:
        if n.op != "call_function" or n.target is operator.getitem or n.target in SYMINT_OPS:
            continue
        schema = getattr(n.target, "_schema", None)
        if schema is not None and schema.is_mutable and n.target not in _AUTOGRAD_ONLY_MUTATIONS:
            return f"{n.target} mutates its input"
        lowered = n.target in LOWERINGS or getattr(n.target, "overloadpacket", None) in LOWERINGS
        if not lowered and not _kept_by_decomposition(n.target, table):
            return f"{n.target} has no direct lowering"
        if n.target is torch.ops.aten.matmul.default and not matmul_lowers(*(tuple(x.meta["val"].shape) for x in n.args[:2])):
            return "a matmul is not a single dot_general"
    return None


def _apply_inferred_ranges(importer: Importer, ep: Any) -> None:
    """Ranges torch inferred (``seq <= 512``) become facts checked at every call.

    The lower bound is not taken: torch raises it to 2 for its 0/1
    specialisation, which disc does not do.
    """
    c = importer.graph.constraints
    for sym, vr in ep.range_constraints.items():
        ours = importer.symbols.get(sym)
        name = ours.as_symbol() if ours is not None else None
        if name is None:
            continue
        if not getattr(vr.upper, "is_Integer", False):
            continue  # unbounded
        upper = int(vr.upper)
        if upper < 2**62:
            c.set_range(name, None, upper)


def _export(
    model: torch.nn.Module, args: Sequence[torch.Tensor], names: Sequence[str], dynamic: DynamicSpec, dynamic_shapes: Any, decompose: bool
) -> tuple[Any, dict[str, int], bool]:
    """torch.export at the first trace sizes that work (and, with ``decompose``, decompose).

    Each candidate is tried plainly, then size-obliviously: convolution's meta
    kernel insists every intermediate spatial size is != 1, which contradicts
    dims that may be 1, and ``backed_size_oblivious`` avoids that guard. It is
    only a retry because for attention models the same setting adds
    ``seq != 1`` guards instead. Returns the program, the trace sizes and
    whether it was traced size-obliviously.
    """
    errors: list[Exception] = []
    for hints in hint_candidates(args, names, dynamic):
        traced = []
        for name, t in zip(names, args):
            for axis, dim_name in dynamic.get(name, {}).items():
                t = _grow(t, axis, hints[dim_name])
            traced.append(t)
        for oblivious in (False, True):
            try:
                with torch.no_grad(), fx_config.patch(backed_size_oblivious=oblivious):
                    ep = torch.export.export(model, tuple(traced), dynamic_shapes=dynamic_shapes, strict=False)
                return (_decompose(ep, oblivious) if decompose else ep), hints, oblivious
            except Exception as e:  # torch raises many types; the user needs the message
                errors.append(e)
    raise CaptureError(f"torch.export could not capture {type(model).__name__}: {errors[0]}") from errors[0]


def _decompose(ep: Any, oblivious: bool) -> Any:
    with torch.no_grad(), fx_config.patch(backed_size_oblivious=oblivious):
        return ep.run_decompositions(_decompositions(ep))


def _decompositions(ep: Any) -> Any:
    """torch's default decompositions, keeping ``aten.matmul`` whole where disc lowers it directly.

    Decomposing matmul under symbolic shapes is the slowest part of the
    export (BERT-base: 2.5 of 7.2 s, re-deriving views and contiguity for
    each of its 72 GEMMs); disc maps it straight to one ``dot_general``. Only
    when every matmul (and every linear, which decomposes into one) has a form
    the lowering takes does the table keep it; otherwise all are decomposed.
    """
    table = torch.export.default_decompositions()
    aten = torch.ops.aten
    # disc lowers attention itself (lowering_attention.py), in a form the GPU backend fuses into one
    # kernel call; torch's decomposition spells the scale and the empty-row rule another way.
    table.pop(aten.scaled_dot_product_attention.default, None)
    for n in ep.graph.nodes:
        if n.op != "call_function" or n.target not in (aten.matmul.default, aten.linear.default):
            continue
        a, b = (x.meta.get("val") if isinstance(x, torch.fx.Node) else None for x in n.args[:2])
        if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
            return table
        rhs = (None, None) if n.target is aten.linear.default else tuple(b.shape)  # linear: by the matrix weight.t()
        if not matmul_lowers(tuple(a.shape), rhs):
            return table
    del table[aten.matmul.default]
    return table


def matmul_lowers(a: Sequence[Any], b: Sequence[Any]) -> bool:
    """Does ``matmul`` of operands of these shapes lower to one ``dot_general``?

    Either the right operand is a matrix (``[..., k] @ [k, n]``), or both have
    the same rank >= 3 and the same batch dims (compared as the same size or
    symbol, so no guard is added).
    """
    if len(a) >= 2 and len(b) == 2:
        return True
    return len(a) == len(b) >= 3 and all(str(x) == str(y) for x, y in zip(a[:-2], b[:-2]))
