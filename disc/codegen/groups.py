"""What a fused group is, independent of the language it is printed in.

Both code generators (C++ and Triton) ask the same questions of a kernel
step before they print it: which space its reductions reduce, in which
order dependent reductions run, whether a column schedule can run it, which
broadcasts are left to run time, and which value an output reshapes. The
answers live here once.
"""

from __future__ import annotations

from collections.abc import Callable

from disc.codegen.lowering import KernelStep, Unsupported
from disc.fusion.plan import same_but_unit_dims
from disc.ir.graph import Node
from disc.shape.constraints import ShapeConstraints
from disc.shape.expr import DimLike


def output_source(out: Node, members: set[Node]) -> Node:
    """The value ``out`` reshapes, through the group's own reshapes (a reshape keeps the linear order)."""
    while out.op == "reshape" and out in members:
        out = out.inputs[0]
    return out


def written_per_row(c: ShapeConstraints, outputs: list[Node], reductions: list[Node], domain: Node, members: set[Node]) -> list[Node]:
    """The outputs of a reduction kernel written once per row rather than at every element of the
    reduced ``domain``: those with fewer elements, and a reduction's own value (or one of its
    shape) when the reduced dims are all 1, which has as many elements as the domain but is
    indexed by rows (``x[b, 1].sum(-1)``)."""
    out = []
    for o in outputs:
        source = output_source(o, members)
        if not c.prove_same_numel(o.shape, domain.shape):
            out.append(o)
        elif not c.prove_same_shape(source.shape, domain.shape) and any(c.prove_same_shape(source.shape, r.shape) for r in reductions):
            out.append(o)
    return out


def _unit_dim_view(dims: tuple[str, ...], shape: tuple[DimLike, ...], source: tuple[DimLike, ...]) -> tuple[str, ...] | None:
    """Where index ``dims`` of a value of ``shape`` is in the same elements viewed as ``source``,
    when the two differ only by dims of size 1: the other dims keep their index, ``source``'s
    unit dims take 0. None otherwise."""
    if not same_but_unit_dims(shape, source):
        return None
    kept = iter([i for i, d in zip(dims, shape) if d != 1])
    return tuple("0" if d == 1 else next(kept) for d in source)


def reduced_index(c: ShapeConstraints, source: Node, reductions: list[Node], row_of: Callable[[Node], tuple[str, ...]]) -> tuple[str, ...] | None:
    """The index at which a kernel writes ``source``, a value of one of its reductions' shapes or a
    unit-dim view of one (``s.unsqueeze(-1)``, a BatchNorm's ``mean.reshape(-1)``); ``row_of(r)``
    is reduction ``r``'s index in that kernel. None if ``source`` is neither."""
    for r in reductions:
        if c.prove_same_shape(source.shape, r.shape):
            return row_of(r)
    for r in reductions:
        view = _unit_dim_view(row_of(r), r.shape, source.shape)
        if view is not None:
            return view
    return None


def reads(roots: list[Node], target: Node, members: set[Node]) -> bool:
    """Does computing ``roots`` inside the group read ``target``? (Reductions are finished values: not entered.)"""
    seen, stack = set(), list(roots)
    while stack:
        n = stack.pop()
        if n is target:
            return True
        if n in seen or n not in members or n.op == "reduce":
            continue
        seen.add(n)
        stack.extend(n.inputs)
    return False


def reduction_domain(step: KernelStep, c: ShapeConstraints) -> tuple[list[Node], Node, tuple[int, ...]]:
    """The group's reductions, the space they all reduce, and its reduced dims (``Unsupported`` if they differ)."""
    reductions = [n for n in step.group.nodes if n.op == "reduce"]
    first = reductions[0]
    domain = first.inputs[0]
    rank = max(len(domain.shape), 1)
    rdims = tuple(sorted(d % rank for d in first.attrs["dims"]))
    for r in reductions[1:]:
        if not c.prove_same_shape(r.inputs[0].shape, domain.shape) or tuple(sorted(d % rank for d in r.attrs["dims"])) != rdims:
            raise Unsupported(f"reductions %{first.name} and %{r.name} reduce different spaces")
    if not rdims:
        raise Unsupported(f"reduction %{first.name} reduces no dims")
    return reductions, domain, rdims


def reduction_levels(step: KernelStep) -> dict[Node, int]:
    """The pass of each reduction (1 + the deepest reduction it reads: LayerNorm's mean 1, variance 2); others inherit."""
    level: dict[Node, int] = {}
    for n in step.group.nodes:  # program order: operands first
        below = [level[x] for x in n.inputs if x in level]
        if n.op == "reduce":
            level[n] = 1 + max(below, default=0)
        elif below:
            level[n] = max(below)
    return level


def leading_reduction(step: KernelStep, c: ShapeConstraints, passes: bool = False) -> int:
    """How many leading dims every reduction of the group reduces, when a column schedule can run it; else 0."""
    outer, lead = column_space(step, c, passes)
    return lead if outer == 0 else 0


def column_space(step: KernelStep, c: ShapeConstraints, passes: bool = False) -> tuple[int, int]:
    """(kept outer dims, reduced dims) when a column schedule can run the group's reductions; else (0, 0).

    The reduced dims are one consecutive block with kept dims after it; kept dims
    before it (an NHWC image's batch, when a spatial mean reduces h and w) are walked
    one index at a time around the schedule.

    A column schedule walks the reduction space in memory order (reduced rows
    outer, kept elements inner) and accumulates per kept element: it needs
    every reduction to reduce the same leading dims of one space. A reduction
    is only known after the last row, so a value computed per element (an
    operand of a reduction, a full-size output) that reads one needs another
    pass over the space: allowed with ``passes`` (one walk per reduction
    level, BatchNorm's mean then variance), else refused.
    """
    reductions = [n for n in step.group.nodes if n.op == "reduce"]
    domain = reductions[0].inputs[0]
    rank = len(domain.shape)
    rdims = sorted(d % max(rank, 1) for d in reductions[0].attrs["dims"])
    outer = rdims[0] if rdims else 0
    if not rdims or rdims != list(range(outer, outer + len(rdims))) or rdims[-1] == rank - 1:
        return 0, 0
    for r in reductions:
        if sorted(d % rank for d in r.attrs["dims"]) != rdims or not c.prove_same_shape(r.inputs[0].shape, domain.shape):
            return 0, 0
    members = set(step.group.nodes)
    full = [o for o in step.outputs if c.prove_same_numel(o.shape, domain.shape)]
    per_element = [r.inputs[0] for r in reductions] + full
    if not passes and any(reads(per_element, r, members) for r in reductions):
        return 0, 0
    return outer, len(rdims)


def runtime_broadcasts(step: KernelStep, c: ShapeConstraints) -> list[tuple[DimLike, DimLike]]:
    """(operand dim, result dim) of every broadcast the group leaves to run time: neither provably 1 nor provably equal."""
    out: list[tuple[DimLike, DimLike]] = []
    for n in step.group.nodes:
        if n.op != "broadcast_in_dim":
            continue
        x = n.inputs[0]
        for m, d in enumerate(n.attrs["dims"]):
            src, dst = x.shape[m], n.shape[d]
            if not c.prove_is_one(src) and not c.prove_equal(src, dst):
                out.append((src, dst))
    return out
