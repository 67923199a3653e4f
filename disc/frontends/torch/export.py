"""``disc.compile`` frontend: capture with ``torch.export``, never specialising on 1.

torch.export (like dynamo) turns an example dim of size 0 or 1 into a constant.
disc therefore traces with *hint* inputs: every dynamic dim whose example
size is 0 or 1 is grown to a distinct value >= 2 (by repeating the example's
own data, so token ids stay in range and masks stay masks). Nothing in the
captured program depends on the hint: disc re-derives every shape with its
own symbolic rules, and each decision torch made assuming "this dim is not 1"
(a kept squeeze, a broadcast resolved at trace time) becomes a runtime check
or a runtime broadcast in disc's IR. See docs/architecture.md, "Frontend".
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch
import torch.utils._pytree as pytree

from disc.errors import CompileError
from disc.frontends.torch.importer import Importer, InputSpec, import_fx

DynamicSpec = Mapping[str, Mapping[int, str]]


@dataclass
class Captured:
    importer: Importer
    input_names: list[str]
    out_spec: Any
    hints: dict[str, int]


def input_names_of(model: torch.nn.Module, args: Sequence[Any]) -> list[str]:
    params = list(inspect.signature(model.forward).parameters.values())
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(args) > len(names):
        raise CompileError(f"{type(model).__name__}.forward takes {len(names)} positional inputs, got {len(args)} example inputs")
    return names[: len(args)]


def choose_hints(args: Sequence[torch.Tensor], names: Sequence[str], dynamic: DynamicSpec) -> dict[str, int]:
    """A trace size for every dynamic dim name: the example's size, unless it is 0 or 1."""
    sizes: dict[str, int] = {}
    for name, t in zip(names, args):
        for axis, dim_name in dynamic.get(name, {}).items():
            sizes.setdefault(dim_name, int(t.shape[axis]))
    taken = {v for v in sizes.values() if v >= 2}
    hints: dict[str, int] = {}
    candidate = 2
    for dim_name, size in sizes.items():
        if size >= 2:
            hints[dim_name] = size
            continue
        while candidate in taken:
            candidate += 1
        hints[dim_name] = candidate
        taken.add(candidate)
    return hints


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
    hints = choose_hints(args, names, dynamic)
    traced_args = []
    for name, t in zip(names, args):
        for axis, dim_name in dynamic.get(name, {}).items():
            t = _grow(t, axis, hints[dim_name])
        traced_args.append(t)

    dims: dict[str, Any] = {}
    ranges = ranges or {}
    for dim_name in hints:
        lo, hi = ranges.get(dim_name, (None, None))
        # The range given to torch must contain the hint; disc keeps the user's range itself.
        kw = {}
        if hi is not None:
            kw["max"] = max(hi, hints[dim_name])
        dims[dim_name] = torch.export.Dim(dim_name, **kw)
    dynamic_shapes = {name: {axis: dims[d] for axis, d in dynamic.get(name, {}).items()} or None for name in names}
    try:
        with torch.no_grad():
            ep = torch.export.export(model, tuple(traced_args), dynamic_shapes=dynamic_shapes, strict=False)
        ep = ep.run_decompositions()
    except Exception as e:  # torch raises many types; the user needs the message
        raise CompileError(f"torch.export could not capture {type(model).__name__}: {e}") from e

    sig = ep.graph_signature
    state = {**ep.state_dict, **ep.constants}
    constants: dict[str, torch.Tensor] = {}
    for placeholder, target in {**sig.inputs_to_parameters, **sig.inputs_to_buffers, **sig.inputs_to_lifted_tensor_constants}.items():
        value = state[target]
        constants[placeholder] = value.detach() if isinstance(value, torch.Tensor) else torch.as_tensor(value)
    specs = [InputSpec(n, dict(dynamic.get(n, {}))) for n in names]
    importer = import_fx(ep.graph_module, specs, constants, name=type(model).__name__)
    c = importer.graph.constraints
    for dim_name, (lo, hi) in ranges.items():
        if dim_name in c.facts:
            c.set_range(dim_name, lo, hi)
    return Captured(importer, names, ep.call_spec.out_spec, hints)


def unflatten_outputs(out_spec: Any, outs: list[torch.Tensor]) -> Any:
    return pytree.tree_unflatten(outs, out_spec)
