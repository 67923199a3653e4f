"""Lowering a fusion plan to a program description every native backend shares.

``lower(graph)`` turns the optimised graph and its fusion plan into a
``LoweredProgram``: an ordered list of steps (generated kernels and library
calls), the buffer each materialised value lives in, and a workspace plan
whose sizes and offsets are symbolic expressions of the input dims. The CPU
(C++) and GPU (Triton) code generators differ only in how they print it.

Two decisions are made here rather than in the fusion planner, because they
depend on which values end up in memory:

- *views*: a chain of ``reshape``/``transpose`` ops whose only consumers are
  GEMMs is not computed at all; the GEMM reads the producer's buffer through
  strides (a transposed weight, heads split out of a ``[B*S, H*D]`` matrix);
- *buffers*: intermediates are carved out of one workspace; a buffer reuses a
  dead one whose size is provably equal (liveness-based reuse), so the plan
  holds for every shape without knowing any.

Anything outside what the native backends handle raises ``Unsupported`` with
the reason; the caller then runs the reference executor and says why.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from disc.fusion.plan import FusionGroup, is_cheap, plan_fusion
from disc.ir.graph import Graph, Node
from disc.ir.registry import kernel_kind
from disc.ir.types import ITEMSIZE, IndexType
from disc.shape.constraints import ShapeConstraints
from disc.shape.expr import DimLike, SymExpr, as_expr

_REMAPS = ("reshape", "transpose")
# Read by a GEMM through strides: a slice with a start offset too, a broadcast with stride 0 along
# the dims it expands (GQA's repeated K/V heads become a batch dim the GEMM reads again).
_VIEWS = (*_REMAPS, "slice", "broadcast_in_dim")
_STRIDED_READERS = ("dot_general", "attention")  # library ops that read their operands through strides
# Elementwise ops each backend's emitter writes itself (no entry in its table of op forms).
ELEMENTWISE_OWN_FORMS = ("select", "convert", "bitcast")
# Both backends' kernels load and store 16-bit floats, computing in f32 between. The CPU's RAL
# runs 16-bit GEMMs (oneDNN's matmul: AMX or AVX512_BF16 where the CPU has them) but f32
# convolutions only: a 16-bit convolution is refused and runs in PyTorch between compiled
# segments. torch's GPU GEMMs and convolutions take 16-bit operands.
KERNEL_DTYPES = frozenset({"f16", "bf16", "f32", "f64", "i64", "i32", "i16", "i8", "u8", "i1", "u16", "u32", "u64"})
GPU_LIBRARY_DTYPES = frozenset({"f16", "bf16", "f32", "f64"})
CPU_LIBRARY_DTYPES = {"dot_general": frozenset({"f16", "bf16", "f32"})}  # other library ops: f32


class Unsupported(Exception):
    """The program uses something the native backends do not generate (yet).

    ``nodes`` names the ops at fault when they are known: the backend can then run
    those ops in PyTorch between compiled segments (``disc.runtime.segments``).
    """

    def __init__(self, message: str, nodes: Sequence[Node] = ()) -> None:
        super().__init__(message)
        self.nodes = tuple(nodes)


# A dim's stride: one expression, or for a compound dim the (size, stride) of each part.
Stride = SymExpr | tuple[tuple[DimLike, SymExpr], ...]


@dataclass(frozen=True)
class View:
    """A strided window onto a buffer: element (i0, i1, ...) is at base + offset + sum(i_k * strides[k])."""

    base: Node  # the materialised value whose buffer is read
    shape: tuple[DimLike, ...]
    strides: tuple[Stride, ...]  # a compound dim has ((size, stride), ...), outermost first
    offset: SymExpr = SymExpr.const(0)  # elements from the buffer's start (a slice's start)


@dataclass
class KernelStep:
    group: FusionGroup
    inputs: list[Node]  # buffers read (materialised values, in first-use order)
    outputs: list[Node]  # values of the group written to their buffers

    @property
    def kind(self) -> str:
        return self.group.kind

    @property
    def reads(self) -> list[Node]:
        return self.inputs

    @property
    def written(self) -> list[Node]:
        return self.outputs


@dataclass(frozen=True)
class ConvEpilogue:
    """What a convolution's library call computes after the convolution (``plan_fusion``'s
    ``conv_epilogues``): ``end = relu?(conv + bias?)``, the value written instead of the conv's."""

    bias: Node | None  # a 1-D per-output-channel vector in memory
    relu: bool
    end: Node

    def describe(self) -> str:
        """"+ bias %b, relu -> %end": what follows the convolution inside its call."""
        parts = ([f"bias %{self.bias.name}"] if self.bias is not None else []) + (["relu"] if self.relu else [])
        return f"+ {', '.join(parts)} -> %{self.end.name}"


@dataclass
class LibraryStep:
    node: Node  # dot_general, convolution or a convolution gradient
    operands: list[View]
    # Set when the result is written straight into the buffer of a later reshape/transpose
    # chain's end (heads merged back into rows), through these strides, instead of its own buffer.
    result: View | None = None
    epilogue: ConvEpilogue | None = None

    @property
    def writes(self) -> Node:
        if self.epilogue is not None:
            return self.epilogue.end
        return self.result.base if self.result is not None else self.node

    @property
    def reads(self) -> list[Node]:
        bias = self.epilogue.bias if self.epilogue is not None else None
        return [v.base for v in self.operands] + ([bias] if bias is not None else [])

    @property
    def written(self) -> list[Node]:
        return [self.writes]

    @property
    def kind(self) -> str:
        return "library"


Step = KernelStep | LibraryStep


@dataclass
class Slot:
    """A region of the workspace; buffers of provably equal byte size share it when their lifetimes don't overlap."""

    size: SymExpr  # bytes
    users: list[Node] = field(default_factory=list)
    live: list[tuple[int, int]] = field(default_factory=list)  # per user: (step writing it, step last reading it)

    def live_with(self, other: Slot) -> bool:
        """Is some user of this slot live while some user of ``other`` is? Then their bytes must differ."""
        return any(a <= d and c <= b for a, b in self.live for c, d in other.live)


@dataclass
class LoweredProgram:
    graph: Graph
    steps: list[Step]
    # Where each materialised value lives: ("input", i) | ("const", name) | ("output", k) | ("slot", s)
    location: dict[Node, tuple[str, object]]
    slots: list[Slot]
    outputs: list[tuple[str, object]]  # per graph output: ("buffer", k) | ("input", i) | ("const", name) | ("same", j)
    output_buffers: list[Node]  # values written into caller-allocated outputs, in buffer order
    folded_views: dict[Node, View]

    def describe_slots(self) -> list[str]:
        """A line per workspace slot: its symbolic size, the buffers sharing it and when each is live."""
        lines = []
        for k, slot in enumerate(self.slots):
            names = ", ".join("%" + n.name for n in slot.users)
            live = ", ".join(f"{a}..{b}" for a, b in slot.live)
            lines.append(f"  slot {k}: {slot.size} B  <- {names}  (live in steps {live})")
        return lines

    def describe_folded_views(self) -> str:
        """"12 ops folded (reshape 6, transpose 4, broadcast_in_dim 2)": the view ops no kernel computes."""
        kinds = Counter(n.op for n in self.folded_views)
        detail = ", ".join(f"{op} {k}" for op, k in sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0])))
        return f"{sum(kinds.values())} ops folded" + (f" ({detail})" if detail else "")

    def counts(self) -> dict[str, int]:
        out = {"memory_bound": 0, "library": 0}
        for s in self.steps:
            out["library" if isinstance(s, LibraryStep) else "memory_bound"] += 1
        return out


def resolve_outputs(specs: list[tuple[str, object]], buffers: Sequence[Any], inputs: Sequence[Any], constant: Callable[[str], Any]) -> list[Any]:
    """The graph's outputs after a run, from ``LoweredProgram.outputs``: a written buffer, an input
    passed through, a constant (``constant(name)``), or the same value as an earlier output.

    A plain loop, not a recursive closure: a closure that refers to itself is a reference cycle,
    and it kept every call's outputs and inputs alive until Python's cycle collector ran (RSS
    grew by tens of MB over a few hundred calls, then fragmented the heap)."""
    out: list[Any] = []
    for kind, where in specs:
        if kind == "buffer":
            out.append(buffers[where])  # type: ignore[index]
        elif kind == "input":
            out.append(inputs[where])  # type: ignore[index]
        elif kind == "const":
            out.append(constant(str(where)))
        else:  # "same": an earlier output
            out.append(out[where])  # type: ignore[index]
    return out


def workspace_bytes(kept: Any, needed: int) -> int:
    """The size of a kept workspace (a uint8 tensor, or None) that must now hold ``needed`` bytes:
    at least half again the old one, so a length growing by one per step (a decoder) reallocates
    rarely instead of leaving a slightly smaller hole in the heap at every step. Both executors
    free the old buffer before taking the new one."""
    return max(needed, 0 if kept is None else kept.numel() + kept.numel() // 2)


def distinct_kernels(calls: Sequence[Any]) -> list[tuple[Any, int]]:
    """Each distinct generated kernel among a program's calls (those with a ``kernel``), in first-use
    order, with how many calls launch it: what both explain pages list."""
    first: dict[str, Any] = {}
    uses: dict[str, int] = {}
    for call in calls:
        kernel = getattr(call, "kernel", None)
        if kernel is None:
            continue
        first.setdefault(kernel.name, call)
        uses[kernel.name] = uses.get(kernel.name, 0) + 1
    return [(call, uses[name]) for name, call in first.items()]


def contiguous_strides(shape: tuple[DimLike, ...]) -> tuple[SymExpr, ...]:
    strides: list[SymExpr] = []
    acc = SymExpr.const(1)
    for d in reversed(shape):
        strides.append(acc)
        acc = acc * as_expr(d)
    return tuple(reversed(strides))


def _is_one(c: ShapeConstraints, d: DimLike) -> bool:
    return c.prove_is_one(d)


def reshape_view(c: ShapeConstraints, shape, strides, new_shape) -> tuple[Stride, ...] | None:
    """Strides giving ``new_shape`` over the same elements in the same order, or None if no strides can.

    Old and new dims are matched in groups of provably equal products. A group
    of old dims laid out contiguously relative to each other gets ordinary
    strides; a group that is not (heads split out of a row, then merged with
    the batch) may still become one *compound* dim, ((size, stride), ...),
    which a GEMM takes as several batch dims.
    """
    old = [(d, s) for d, s in zip(shape, strides) if not _is_one(c, d)]
    new_idx = [k for k, d in enumerate(new_shape) if not _is_one(c, d)]
    out: list[Stride] = [SymExpr.const(0)] * len(new_shape)
    i = j = 0
    while i < len(old) or j < len(new_idx):
        if i >= len(old) or j >= len(new_idx):
            return None
        group_old, group_new = [old[i]], [new_idx[j]]
        i, j = i + 1, j + 1
        p_old, p_new = as_expr(group_old[0][0]), as_expr(new_shape[group_new[0]])
        while not c.prove_equal(p_old, p_new):
            # Extend the side whose product is a proper divisor of the other's.
            if i < len(old) and _divides(c, p_old, p_new):
                group_old.append(old[i])
                p_old = p_old * as_expr(old[i][0])
                i += 1
            elif j < len(new_idx) and _divides(c, p_new, p_old):
                group_new.append(new_idx[j])
                p_new = p_new * as_expr(new_shape[new_idx[j]])
                j += 1
            else:
                return None
        if len(group_old) == 1 and len(group_new) == 1:
            out[group_new[0]] = group_old[0][1]
            continue
        if any(isinstance(st, tuple) for _, st in group_old):
            return None
        contiguous = all(c.prove_equal(s_outer, as_expr(s_inner) * as_expr(d_inner)) for (_, s_outer), (d_inner, s_inner) in zip(group_old, group_old[1:]))
        if not contiguous:
            if len(group_new) != 1:
                return None
            out[group_new[0]] = tuple((d, as_expr(st)) for d, st in group_old)
            continue
        stride = as_expr(group_old[-1][1])
        for k in reversed(group_new):
            out[k] = stride
            stride = stride * as_expr(new_shape[k])
    return tuple(out)


def attention_heads(c: ShapeConstraints, v: View, operand: int) -> tuple[DimLike, SymExpr, bool] | None:
    """How the attention library reads dim 1 (the heads) of operand ``operand``'s view ``v``: (size,
    stride, grouped). Key and value heads each read again by a group of query heads (GQA's
    repeated K/V: a compound dim of stride 0 inside) are passed once, grouped. None where a dim
    is split across strides otherwise: a tensor view cannot say it."""
    if any(isinstance(st, tuple) for k, st in enumerate(v.strides) if k != 1):
        return None
    st = v.strides[1]
    if not isinstance(st, tuple):
        return v.shape[1], st, False
    if operand not in (1, 2) or len(st) != 2 or not c.prove_equal(st[1][1], 0):
        return None
    return st[0][0], st[0][1], True


def batch_parts(c: ShapeConstraints, n: Node, sa: Stride, sb: Stride, sc: Stride, size: DimLike) -> list[tuple]:
    """One GEMM batch dim as (size, lhs stride, rhs stride, out stride) parts.

    A compound view dim (heads split out of rows, then merged with the batch)
    is several strided dims: the other operands' plain strides are split into
    the same parts, so every backend passes them as separate batch dims.
    """
    compound = [st for st in (sa, sb, sc) if isinstance(st, tuple)]
    if not compound:
        return [(size, sa, sb, sc)]
    sizes = [d for d, _ in compound[0]]
    for other in compound[1:]:
        if len(other) != len(sizes) or not all(c.prove_equal(a, b) for (a, _), b in zip(other, sizes)):
            raise Unsupported(f"%{n.name}: operands split batch dim differently")

    def split(st) -> list:
        if isinstance(st, tuple):
            return [x for _, x in st]
        out, acc = [], as_expr(st)
        for d in reversed(sizes):
            out.append(acc)
            acc = acc * as_expr(d)
        return list(reversed(out))

    return list(zip(sizes, split(sa), split(sb), split(sc)))


def _divides(c: ShapeConstraints, a: SymExpr, b: SymExpr) -> bool:
    from disc.shape.expr import exact_divide

    q = exact_divide(c.normalize(b), c.normalize(a))
    return q is not None and not c.prove_is_one(q)


class _Lowering:
    def __init__(self, g: Graph, conv_epilogues: bool, data_dependent: bool, gpu: bool, refusal: Callable[[Node], str | None] | None) -> None:
        self.g = g
        self.refusal = refusal
        self.conv_epilogues = conv_epilogues
        self.data_dependent = data_dependent
        self.gpu = gpu
        self.c = g.constraints
        self.users = g.users()
        self.outputs = set(g.outputs)

    def run(self) -> LoweredProgram:
        self._check_supported()
        plan = plan_fusion(self.g, self.conv_epilogues)
        folded = self._fold_views()
        steps = self._steps(plan, folded)
        location, slots, out_specs, out_buffers = self._plan_buffers(steps)
        return LoweredProgram(self.g, steps, location, slots, out_specs, out_buffers, folded)

    def _check_supported(self) -> None:
        refused: dict[Node, str] = {}  # every op at fault, so they all move to PyTorch at once
        for n in self.g.nodes:
            if n.op == "host_call":
                refused[n] = f"%{n.name} is a host_call ({n.attrs['host']} runs it); the native program must be whole"
            elif isinstance(n.type, IndexType):
                continue
            elif n.op == "nonzero" and not self.data_dependent:
                refused[n] = f"%{n.name}: nonzero's result size is known only once it has run; PyTorch runs it between compiled segments"
            elif n.dtype not in KERNEL_DTYPES:
                refused[n] = f"%{n.name}: dtype {n.dtype} has no kernels yet"
            elif kernel_kind(n.op, n.type) == "library" and n.dtype not in self._library_dtypes(n.op):
                refused[n] = f"%{n.name}: {n.op} in {n.dtype}; the library path takes {', '.join(sorted(self._library_dtypes(n.op)))}"
            elif self.refusal is not None and (why := self.refusal(n)) is not None:
                refused[n] = why
        if refused:
            raise Unsupported(next(iter(refused.values())), list(refused))
        for o in self.g.outputs:
            if isinstance(o.type, IndexType):
                raise Unsupported(f"output %{o.name} is a shape scalar")

    def _library_dtypes(self, op: str) -> frozenset[str]:
        return GPU_LIBRARY_DTYPES if self.gpu else CPU_LIBRARY_DTYPES.get(op, frozenset({"f32"}))

    # -- views ------------------------------------------------------------------
    def _fold_views(self) -> dict[Node, View]:
        """Remap chains read only by GEMMs become strided views of their producer."""
        foldable: set[Node] = set()
        for n in reversed(self.g.nodes):
            if n.op in _VIEWS and n not in self.outputs and self.users[n]:
                if all(u.op in _STRIDED_READERS or u in foldable for u in self.users[n]):
                    foldable.add(n)
        views: dict[Node, View] = {}
        for n in self.g.nodes:
            if n not in foldable:
                continue
            src = n.inputs[0]
            base = views.get(src) or View(src, src.shape, contiguous_strides(src.shape))
            view = self._remap(base, n)
            if view is not None:
                views[n] = view
        # A folded node must only feed GEMMs (which accept compound dims as batch dims only)
        # and other folded nodes; unfold until that holds.
        changed = True
        while changed:
            changed = False
            for n in list(views):
                for u in self.users[n]:
                    if u.op == "dot_general":
                        ok = self._gemm_accepts(u, n, views[n], self.c)
                    elif u.op == "attention":  # any strides a tensor view can have, and grouped K/V heads
                        ok = attention_heads(self.c, views[n], u.inputs.index(n)) is not None
                    else:
                        ok = u in views
                    if not ok:
                        del views[n]
                        changed = True
                        break
        return views

    @staticmethod
    def _gemm_accepts(dot: Node, operand: Node, view: View, c: ShapeConstraints) -> bool:
        """Compound dims and dims read again (stride 0) only as batch dims: a matrix's rows and
        columns need one non-zero stride each."""
        side = "lhs" if dot.inputs[0] is operand else "rhs"
        batch = set(dot.attrs[f"{side}_batch"])
        for k, st in enumerate(view.strides):
            if k in batch:
                continue
            if isinstance(st, tuple) or (c.prove_equal(st, 0) and not c.prove_is_one(view.shape[k])):
                return False
        return True

    def _remap(self, v: View, n: Node) -> View | None:
        if n.op == "transpose":
            perm = n.attrs["perm"]
            return View(v.base, n.shape, tuple(v.strides[p] for p in perm), v.offset)
        if n.op == "slice":  # the QKV split of a fused projection: same strides, from the start on
            axis, stride = n.attrs["axis"], v.strides[n.attrs["axis"]]
            if isinstance(stride, tuple):
                return None
            strides = list(v.strides)
            strides[axis] = stride * n.attrs["step"]
            return View(v.base, n.shape, tuple(strides), v.offset + as_expr(n.inputs[1].type.value) * stride)
        if n.op == "broadcast_in_dim":
            strides = [SymExpr.const(0)] * len(n.shape)
            for i, d in enumerate(n.attrs["dims"]):
                if self.c.prove_equal(v.shape[i], n.shape[d]):
                    strides[d] = v.strides[i]
                elif not self.c.prove_is_one(v.shape[i]):
                    return None  # expanded or not is decided at run time
            return View(v.base, n.shape, tuple(strides), v.offset)
        strides = reshape_view(self.c, v.shape, v.strides, n.shape)
        return None if strides is None else View(v.base, n.shape, strides, v.offset)

    # -- steps ------------------------------------------------------------------
    def _steps(self, plan, folded: dict[Node, View]) -> list[Step]:
        steps: list[Step] = []
        view_bases = {v.base for v in folded.values()}
        results = self._fold_results(plan, folded)
        skipped = {n for v in results.values() for n in self._chain(v.base)} if results else set()
        # Every kernel computing each node: a value read by a cheap op that this kernel recomputes
        # is still written out when another kernel (the cheap op's own, as a program output)
        # computes that reader and reads the value from memory.
        computed_by: dict[Node, list[set[Node]]] = {}
        for grp in plan.groups:
            members = {n for n in grp.nodes if n not in folded and n not in skipped}
            for n in members:
                computed_by.setdefault(n, []).append(members)
        for grp in plan.groups:
            if grp.kind == "library":
                node = next(n for n in grp.nodes if kernel_kind(n.op, n.type) == "library")
                tensors = [x for x in node.inputs if not isinstance(x.type, IndexType)]  # not a gradient's size operands
                operands = [folded.get(x) or View(x, x.shape, contiguous_strides(x.shape)) for x in tensors]
                steps.append(LibraryStep(node, operands, results.get(node), _conv_epilogue(node, grp)))
                continue
            # The GEMM before a skipped chain writes the chain's end directly; a group that recomputes
            # the chain (a cheap op duplicated into its reader's kernel) reads that buffer instead.
            nodes = [n for n in grp.nodes if n not in folded and n not in skipped]
            if not nodes:
                continue
            members = set(nodes)
            own = len(nodes) == 1  # a cheap op materialised by its own group
            outputs = []
            for n in nodes:
                if is_cheap(n) and not own:
                    continue  # recomputed here; written out only by its own group, if any
                outside = any(u not in folded and any(n not in other for other in computed_by.get(u, [set()])) for u in self.users[n])
                if n in self.outputs or outside or n in view_bases:
                    outputs.append(n)
            inputs: list[Node] = []
            for n in nodes:
                for x in n.inputs:
                    if x in members or isinstance(x.type, IndexType) or x in inputs:
                        continue
                    if x.is_literal:
                        continue  # inlined
                    inputs.append(x)
            steps.append(KernelStep(FusionGroup(grp.kind, nodes, grp.duplicated), inputs, outputs))
        return _fuse_siblings(self.c, self._drop_unread(steps, view_bases))

    def _drop_unread(self, steps: list[Step], view_bases: set[Node]) -> list[Step]:
        """Steps whose results nobody reads are dead: a materialised cheap op every reader recomputes, or
        code after the last output (the planner keeps every op; DCE normally removed such code before)."""
        while True:
            read = {x for s in steps for x in s.reads}
            keep = read | self.outputs | view_bases
            changed = False
            for s in steps:
                if isinstance(s, KernelStep) and any(o not in keep for o in s.outputs):
                    s.outputs = [o for o in s.outputs if o in keep]
                    changed = True
            live = [s for s in steps if (s.outputs if isinstance(s, KernelStep) else s.writes in keep)]
            if not changed and len(live) == len(steps):
                return steps
            steps = live

    def _chain(self, end: Node) -> list[Node]:
        """The remap ops from a GEMM result to ``end``."""
        out = [end]
        while out[-1].inputs[0].op in _REMAPS:
            out.append(out[-1].inputs[0])
        return out

    def _fold_results(self, plan, folded: dict[Node, View]) -> dict[Node, View]:
        """GEMM results whose only use is a reshape/transpose chain forming a group of its own: written in its layout."""
        out: dict[Node, View] = {}
        group_of = {n: grp for grp in plan.groups for n in grp.nodes}
        for grp in plan.groups:
            end = grp.root
            if grp.kind != "loop" or any(n.op not in _REMAPS for n in grp.nodes) or end in folded:
                continue
            chain = self._chain(end)
            src = chain[-1].inputs[0]
            if src.op not in _STRIDED_READERS or src in self.outputs or set(chain) != set(grp.nodes):
                continue
            if any(len(self.users[n]) != 1 for n in [src, *chain[1:]]) or group_of.get(src) is None:
                continue
            view = View(end, end.shape, contiguous_strides(end.shape))
            for n in chain:  # walk back from the buffer to the GEMM's result shape
                view = self._unmap(view, n)
                if view is None:
                    break
            if view is not None and self._result_ok(src, view):
                out[src] = view
        return out

    def _unmap(self, v: View, n: Node) -> View | None:
        """``v`` is a view of ``n``'s value; the same memory seen as ``n``'s operand."""
        x = n.inputs[0]
        if n.op == "transpose":
            perm = n.attrs["perm"]
            strides: list[Stride] = [SymExpr.const(0)] * len(perm)
            for k, p in enumerate(perm):
                strides[p] = v.strides[k]
            return View(v.base, x.shape, tuple(strides))
        new = reshape_view(self.c, v.shape, v.strides, x.shape)
        return None if new is None else View(v.base, x.shape, new)

    def _result_ok(self, dot: Node, view: View) -> bool:
        """A GEMM writes C with unit column stride, one row stride and (possibly compound) batch
        strides; attention, any view a tensor can be (its result is copied in)."""
        if dot.op == "attention":
            return not any(isinstance(st, tuple) for st in view.strides)
        nb = len(dot.attrs["lhs_batch"])
        rest = view.strides[nb:]
        if any(isinstance(st, tuple) for st in rest):
            return False
        lhs_free = len(dot.inputs[0].shape) - nb - len(dot.attrs["lhs_contract"])
        rows, cols = list(range(nb, nb + lhs_free)), list(range(nb + lhs_free, len(dot.shape)))
        live_cols = [k for k in cols if not self.c.prove_is_one(dot.shape[k])]
        if live_cols and not self.c.prove_equal(view.strides[live_cols[-1]], 1):
            return False
        for group in (rows, cols):
            live = [k for k in group if not self.c.prove_is_one(dot.shape[k])]
            for a, b in zip(live, live[1:]):
                if not self.c.prove_equal(view.strides[a], as_expr(view.strides[b]) * as_expr(dot.shape[b])):
                    return False
        return True

    # -- buffers ------------------------------------------------------------------
    def _plan_buffers(self, steps: list[Step]):
        location: dict[Node, tuple[str, object]] = {}
        for i, n in enumerate(self.g.inputs):
            location[n] = ("input", i)
        out_specs: list[tuple[str, object]] = []
        out_buffers: list[Node] = []
        for j, o in enumerate(self.g.outputs):
            if o in self.g.outputs[:j]:
                out_specs.append(("same", self.g.outputs.index(o)))
            elif o.op == "input":
                out_specs.append(("input", self.g.inputs.index(o)))
            elif o.constant_ref is not None:
                out_specs.append(("const", o.constant_ref))
            elif o.op == "constant":
                raise Unsupported(f"output %{o.name} is a scalar literal")
            else:
                location[o] = ("output", len(out_buffers))
                out_specs.append(("buffer", len(out_buffers)))
                out_buffers.append(o)
        for n in self.g.nodes:
            if n.constant_ref is not None:
                location[n] = ("const", n.constant_ref)

        produced = [s.written for s in steps]
        reads = [s.reads for s in steps]
        last_read: dict[Node, int] = {}
        for i, rs in enumerate(reads):
            for x in rs:
                last_read[x] = i
        for outs in produced:
            for n in outs:
                if n in location and location[n][0] == "output":
                    continue
                if n not in last_read:
                    raise Unsupported(f"%{n.name} is written but never read")  # a planner bug; never silently drop work
        slots: list[Slot] = []
        busy_until: list[int] = []
        for i, outs in enumerate(produced):
            for n in outs:
                if n in location:
                    continue
                size = self.c.normalize(n.tensor_type.numel() * ITEMSIZE[n.dtype])
                chosen = None
                for s, slot in enumerate(slots):
                    # Free before this step starts (a kernel never writes a buffer it reads).
                    if busy_until[s] < i and self.c.prove_equal(slot.size, size):
                        chosen = s
                        break
                if chosen is None:
                    slots.append(Slot(size))
                    busy_until.append(-1)
                    chosen = len(slots) - 1
                slots[chosen].users.append(n)
                busy_until[chosen] = max(last_read.get(n, i), i)
                slots[chosen].live.append((i, busy_until[chosen]))
                location[n] = ("slot", chosen)
        for rs in reads:
            for x in rs:
                if x not in location:
                    raise Unsupported(f"%{x.name} ({x.op}) is read but never materialised")
        return location, slots, out_specs, out_buffers


def _conv_epilogue(node: Node, grp: FusionGroup) -> ConvEpilogue | None:
    """The epilogue the planner put in a convolution's group (its bias add and ReLU), if any."""
    rest = [n for n in grp.nodes if n is not node and n.op != "broadcast_in_dim"]
    if not rest:
        return None
    bias = next((n for n in grp.nodes if n.op == "broadcast_in_dim"), None)
    ops = sorted(n.op for n in rest)
    if ops not in (["add"], ["relu"], ["add", "relu"]) or (("add" in ops) != (bias is not None)):
        raise Unsupported(f"%{node.name}: no library epilogue for [{', '.join(n.op for n in grp.nodes)}]", [node])
    return ConvEpilogue(bias.inputs[0] if bias is not None else None, "relu" in ops, grp.root)


def defines_a_count(step: Step) -> bool:
    """Does ``step`` run a ``nonzero``, binding a dim (its count) that later steps' sizes use?"""
    return isinstance(step, KernelStep) and step.group.nodes[-1].op == "nonzero"


def _fuse_siblings(c: ShapeConstraints, steps: list[Step]) -> list[Step]:
    """Horizontal fusion: independent loop kernels over provably equal shapes become one kernel.

    The Q, K and V bias adds of an attention layer are three such kernels; one
    loop writing all three reads the shape once and launches one parallel region.
    A later kernel moves up to an earlier one only past steps it doesn't depend
    on, and the earlier one's results must not be needed before the merged position.
    """
    steps = list(steps)
    i = 0
    while i < len(steps):
        a = steps[i]
        if not (isinstance(a, KernelStep) and a.kind == "loop"):
            i += 1
            continue
        merged = False
        made = {n: k for k, s in enumerate(steps) for n in s.written}
        for j in range(i + 1, len(steps)):
            b = steps[j]
            if not (isinstance(b, KernelStep) and b.kind == "loop"):
                continue
            if not c.prove_same_shape(a.group.nodes[-1].shape, b.group.nodes[-1].shape):
                continue
            at = max([i] + [made[x] + 1 for x in b.inputs if x in made])
            if any(made.get(x) == i for x in b.inputs):
                continue  # b reads a's results: not siblings
            if any(defines_a_count(s) for s in steps[i + 1 : j]):
                continue  # b's sizes may be a count known only after that step (an iota of it)
            needed_early = any(
                x in a.outputs for s in steps[i + 1 : at] for x in s.reads
            )
            if needed_early:
                continue
            nodes = a.group.nodes + [n for n in b.group.nodes if n not in a.group.nodes]
            group = FusionGroup("loop", nodes, a.group.duplicated + b.group.duplicated)
            inputs = a.inputs + [x for x in b.inputs if x not in a.inputs]
            fused = KernelStep(group, inputs, a.outputs + b.outputs)
            del steps[j]
            del steps[i]
            steps.insert(at - 1 if at > i else i, fused)
            merged = True
            break
        if not merged:
            i += 1
    return steps


def lower(
    g: Graph, conv_epilogues: bool = False, data_dependent: bool = False, gpu: bool = False, refusal: Callable[[Node], str | None] | None = None
) -> LoweredProgram:
    """Fusion plan, folded views and buffer plan of ``g``; raises ``Unsupported`` with the reason.
    ``conv_epilogues``: convolutions compute their bias add and ReLU (a backend whose library
    call can, the CPU's). ``data_dependent``: the backend runs ``nonzero`` itself, binding its
    count mid-call (the CPU's host flow); otherwise a ``nonzero`` is refused. ``gpu``: the
    Triton backend's library dtypes (16-bit GEMMs and convolutions) rather than the CPU's.
    ``refusal``: the backend's declared support, why it cannot hold a node (None: it can); every
    node it refuses is named in one ``Unsupported``, so the driver moves them all at once."""
    return _Lowering(g, conv_epilogues, data_dependent, gpu, refusal).run()
