"""Fusion planning: which IR ops become one kernel, decided from shape constraints alone.

The plan is the contract between the optimised graph and the code generators
(CPU C++ and Triton alike): each ``FusionGroup`` is one kernel (or one library
call), named by its kind, as in DISC:

- ``loop``: elementwise, broadcast and index-remapping ops over one iteration
  space; a producer joins its consumer when their element counts are provably
  equal (``ShapeConstraints.prove_same_numel``), never by comparing values;
- ``input``: a reduction with the producers of its input (same rule);
- ``stitch``: a reduction together with the ops that broadcast its result back
  over the reduced rows and combine it (LayerNorm, softmax, RMSNorm): one
  kernel that keeps the row in cache instead of writing the reduction out;
- ``library``: a GEMM or convolution, alone (its epilogue stays a loop group), except where the
  backend asks for convolution epilogues (``plan_fusion(g, conv_epilogues=True)``, the CPU
  backend): a per-channel bias add and a ReLU after a convolution are then the library call's
  (oneDNN applies them while the output is in cache); see ``_conv_epilogue``;
- ``fallback``: an op PyTorch runs.

Cheap producers (broadcasts, iota) are *duplicated* into each consumer group
rather than materialised: ``FusionGroup.duplicated`` lists them.
Planning is a pure function of the graph: it never changes it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from disc.ir.graph import Graph, Node
from disc.ir.ops.reduction import spreads_back_onto_its_rows
from disc.ir.registry import BROADCAST, ELEMENTWISE, LIBRARY, REDUCTION, get_spec, kernel_kind
from disc.shape.constraints import ShapeConstraints
from disc.shape.expr import DimLike, SymExpr

# Movement ops that only remap indices of one operand: fusible like elementwise ops.
_INDEX_REMAPS = {"reshape", "transpose"}
# Movement ops whose elements each come from one operand element at another position (a part, a
# join, a border). They fuse with their consumers like elementwise ops; a producer whose values
# nothing else reads is computed inside their kernel at the positions they read, never written
# out (a rotary embedding's rotate_half: slice, neg, concat and the multiply-add in one loop).
_PART_REMAPS = {"slice", "concat", "pad"}

CYCLE = "one kernel would depend on itself through another kernel"


@dataclass
class FusionGroup:
    kind: str  # loop | input | stitch | library | fallback | kernel
    nodes: list[Node]  # in program order
    duplicated: list[Node] = field(default_factory=list)  # cheap producers recomputed here and in other groups

    @property
    def root(self) -> Node:
        return self.nodes[-1]

    def describe(self) -> str:
        ops = ", ".join(n.op for n in self.nodes)
        dup = f"; recomputes {', '.join('%' + n.name for n in self.duplicated)}" if self.duplicated else ""
        return f"{self.kind:8} -> %{self.root.name} : {self.root.type}  [{ops}]{dup}"


@dataclass
class Refusal:
    """A producer -> consumer edge the planner did not fuse, and the rule that kept them apart."""

    producer: Node
    consumer: Node
    reason: str

    def describe(self) -> str:
        return f"%{self.producer.name} ({self.producer.op}) -/-> %{self.consumer.name} ({self.consumer.op}): {self.reason}"


@dataclass
class FusionPlan:
    groups: list[FusionGroup]
    refused: list[Refusal] = field(default_factory=list)  # in program order of the consumer

    def counts(self) -> dict[str, int]:
        """Kernels by kind; library calls and fallbacks counted separately from generated kernels."""
        return dict(Counter(g.kind for g in self.groups))

    @property
    def memory_bound_kernels(self) -> int:
        return sum(1 for g in self.groups if g.kind not in ("library", "fallback"))

    def describe(self, max_refusals: int = 40) -> str:
        counts = ", ".join(f"{k}={v}" for k, v in sorted(self.counts().items()))
        lines = [f"{len(self.groups)} kernels ({counts})"] + ["  " + g.describe() for g in self.groups]
        if self.refused:
            lines.append(f"edges not fused ({len(self.refused)}):")
            lines += ["  " + r.describe() for r in self.refused[:max_refusals]]
            if len(self.refused) > max_refusals:
                lines.append(f"  ... and {len(self.refused) - max_refusals} more")
        return "\n".join(lines)


def _is_kernel_op(n: Node) -> bool:
    """Does ``n`` compute tensor data (as opposed to an input, constant or shape scalar)?"""
    return kernel_kind(n.op, n.type) is not None


# Ops that fuse with nothing but compute their operands at indices of their own choosing, so a
# cheap operand (broadcast, iota) can be recomputed inside their kernel like in any other.
_RECOMPUTES_CHEAP_OPERANDS = {"scatter_add"}


def _fusible_kind(n: Node) -> str | None:
    """How ``n`` takes part in fusion: 'elementwise', 'cheap', 'reduction', or None (stands alone)."""
    category = get_spec(n.op).category
    if n.op == "host_call" or category == LIBRARY:
        return None
    if category == BROADCAST or _reads_a_buffer_through_unit_dims(n):
        return "cheap"
    if category == ELEMENTWISE or n.op in _INDEX_REMAPS or n.op in _PART_REMAPS:
        return "elementwise"
    if category == REDUCTION and n.op == "reduce":
        return "reduction"
    return None


def is_unit_dim_reshape(n: Node) -> bool:
    """A reshape that only inserts or drops dims of size 1 (``[n] -> [n, 1]``): read at an index,
    it reads its operand at the same index less the unit dims, never another row's values."""
    return n.op == "reshape" and same_but_unit_dims(n.shape, n.inputs[0].shape)


def same_but_unit_dims(a: Sequence[DimLike], b: Sequence[DimLike]) -> bool:
    """Do shapes ``a`` and ``b`` list the same dims once the static 1s are dropped?"""
    return [d for d in a if d != 1] == [d for d in b if d != 1]


def _reads_a_buffer_through_unit_dims(n: Node) -> bool:
    """A unit-dim reshape of a value that is in memory anyway (an input, a constant, a GEMM's or
    a gather's result): it fuses with no producer, so as a group of its own it would only copy.
    Such a reshape is recomputed by the kernels that read it, like a broadcast. (One of a fused
    value stays with its producer's group, which may have to write it out in that shape.)"""
    x = n.inputs[0] if n.inputs else None
    return is_unit_dim_reshape(n) and x is not None and (not _is_kernel_op(x) or _fusible_kind(x) is None)


def is_cheap(n: Node) -> bool:
    """Is ``n`` recomputed by the kernels that read it (written out only by a group of its own)?"""
    return _fusible_kind(n) == "cheap"


class _Planner:
    """Greedy producer-consumer merging in program order, guarded by shape proofs and a cycle check.

    A group's *spaces* are the element counts it iterates over (each op's
    output, each reduction's input and output). Two groups joined by an edge
    merge when they provably share a space: an elementwise chain shares its
    shape, and a LayerNorm's per-row statistics share the reduction's output
    space while its normalisation shares the reduction's input space, which
    is what makes the whole norm one stitch group.
    """

    def __init__(self, g: Graph, conv_epilogues: bool = False) -> None:
        self.g = g
        self.conv_epilogues = conv_epilogues
        self.c = g.constraints
        self.users = g.users()
        self.order = {n: i for i, n in enumerate(g.nodes)}
        self.group_of: dict[Node, int] = {}
        self.members: dict[int, list[Node]] = {}
        self.spaces: dict[int, list[SymExpr]] = {}
        self.absorbed: dict[Node, set[int]] = {}  # cheap node -> groups that recompute it
        self.refused: list[Refusal] = []

    def run(self) -> FusionPlan:
        for n in self.g.nodes:
            if not _is_kernel_op(n) or _fusible_kind(n) == "cheap" or n in self.group_of:
                continue  # (already in a group: a convolution's epilogue)
            gid = len(self.members)
            self.group_of[n] = gid
            self.members[gid] = [n]
            self.spaces[gid] = self._spaces_of(n)
            if _fusible_kind(n) is not None:
                self._pull(n, n, set())
            elif n.op in _RECOMPUTES_CHEAP_OPERANDS:
                self._absorb_cheap_operands(n)
            elif self.conv_epilogues and n.op == "convolution":
                for m in _conv_epilogue(n, self.users, self.g, self.c):
                    (self._recompute_in if is_cheap(m) else self._claim)(m, gid)
        self._materialise_cheap()
        groups = []
        for nodes in self.members.values():
            if nodes:
                nodes.sort(key=self.order.get)
                dup = sorted((m for m in nodes if len(self.absorbed.get(m, ())) > 1), key=self.order.get)
                groups.append(FusionGroup(self._kind(nodes), nodes, dup))
        groups = self._schedule(groups)
        # An edge refused while pulling may have been joined later through another path.
        refused = [r for r in self.refused if self.group_of.get(r.producer) != self.group_of.get(r.consumer)]
        return FusionPlan(groups, refused)

    def _schedule(self, groups: list[FusionGroup]) -> list[FusionGroup]:
        """Groups in an order that computes every value before it is read.

        Program order of the roots, except that a group runs before any group
        reading one of its values: a group may write a value early in the program
        (an attention GEMM's operand) from the same loop as a late one (that
        operand transposed and saved for the backward graph).
        """
        import heapq

        writer: dict[Node, int] = {}
        for k, grp in enumerate(groups):
            for n in grp.nodes:
                if _fusible_kind(n) != "cheap" or len(grp.nodes) == 1:
                    writer[n] = k
        after: dict[int, set[int]] = {k: set() for k in range(len(groups))}
        for k, grp in enumerate(groups):
            inside = set(grp.nodes)
            for n in grp.nodes:
                for x in n.inputs:
                    w = writer.get(x)
                    if x not in inside and w is not None and w != k:
                        after[k].add(w)
        readers: dict[int, list[int]] = {k: [] for k in after}
        for k, deps in after.items():
            for w in deps:
                readers[w].append(k)
        waiting = {k: len(deps) for k, deps in after.items()}
        ready = [(self.order[grp.root], k) for k, grp in enumerate(groups) if not waiting[k]]
        heapq.heapify(ready)
        ordered: list[FusionGroup] = []
        while ready:
            _, k = heapq.heappop(ready)
            ordered.append(groups[k])
            for r in readers[k]:
                waiting[r] -= 1
                if not waiting[r]:
                    heapq.heappush(ready, (self.order[groups[r].root], r))
        assert len(ordered) == len(groups), "fusion groups depend on each other in a cycle"
        return ordered

    def _pull(self, n: Node, via: Node, seen: set[Node]) -> None:
        """Fuse the producers of ``via`` (``n`` itself, or a cheap op absorbed into n's group) into n's group."""
        cyclic: list[Node] = []
        for p in via.inputs:
            if p in seen or not _is_kernel_op(p):
                continue
            seen.add(p)
            kind = _fusible_kind(p)
            if kind is None:
                self.refused.append(Refusal(p, via, _why_alone(p)))
                continue
            if kind == "cheap":
                # Recomputed in this group rather than written out; its own producers may fuse too.
                self._recompute_in(p, self.group_of[n])
                self._pull(n, p, seen)
                continue
            why = self._join(p, via, self.group_of[n])
            if why == CYCLE:
                cyclic.append(p)
            elif why is not None:
                self.refused.append(Refusal(p, via, why))
        # A path back through another operand's group closes once that group has joined too
        # (x*cos + rotate_half(x)*sin: rotate_half reads x's group, which the add reaches first).
        for p in cyclic:
            why = self._join(p, via, self.group_of[n])
            if why is not None:
                self.refused.append(Refusal(p, via, why))

    def _join(self, p: Node, via: Node, gn: int) -> str | None:
        """Merge the group of producer ``p`` (read by ``via``) into ``gn``; else the rule that forbids it."""
        gp = self.group_of[p]
        if gp == gn:
            return None
        if not self._share_space(gp, gn):
            if via.op in _PART_REMAPS and self._computable_inside(gp, gn):
                self._merge(gp, gn, spaces=False)  # gp's values are computed where via reads them, not in gp's space
                return None
            spaces = [" / ".join(dict.fromkeys(str(x) for x in self.spaces[g])) for g in (gp, gn)]
            return f"element counts not provably equal ({spaces[0]} vs {spaces[1]})"
        if self._part_remap_with_reduction(gp, gn):
            return "a slice, concat or pad is not fused with a reduction"
        if not self._one_row_space(gp, gn):
            return "their reductions reduce different rows (other dims or lengths)"
        if self._reads_other_rows(gp, gn):
            return "a transpose, reshape or broadcast would read reduction results at rows other than the one being computed"
        if self._creates_cycle(gp, gn):
            return CYCLE
        self._merge(gp, gn)
        return None

    def _absorb_cheap_operands(self, n: Node, gn: int | None = None) -> None:
        """Recompute ``n``'s cheap operands in its own kernel (a scatter's index broadcast along its
        rows, its zero base), and theirs (the reshape of an input under that broadcast), so they
        are neither written out nor read back."""
        gn = self.group_of[n] if gn is None else gn
        for p in n.inputs:
            if _is_kernel_op(p) and _fusible_kind(p) == "cheap" and p not in self.members[gn]:
                self._recompute_in(p, gn)
                self._absorb_cheap_operands(p, gn)

    def _claim(self, m: Node, gn: int) -> None:
        """``m`` is computed by group ``gn`` (a library call's epilogue) and fuses with nothing else."""
        self.group_of[m] = gn
        self.members[gn].append(m)

    def _recompute_in(self, p: Node, gn: int) -> None:
        """Cheap op ``p`` is computed inside group ``gn`` (as well as in any other group reading it)."""
        if p not in self.members[gn]:
            self.members[gn].append(p)
        self.absorbed.setdefault(p, set()).add(gn)

    def _materialise_cheap(self) -> None:
        """A cheap op used by a non-fusing op or returned by the program is also written out by its own kernel.

        Consumers first: a cheap op read by another cheap op (a reshape [n] -> [n, 1] under a
        broadcast) is needed in memory only if that one is written out by a kernel of its own.
        """
        for n in reversed(self.g.nodes):
            if not _is_kernel_op(n) or _fusible_kind(n) != "cheap":
                continue
            needed = n in self.g.outputs or any(
                _is_kernel_op(u) and n not in self.members.get(self.group_of.get(u, -1), []) and (not is_cheap(u) or u in self.group_of)
                for u in self.users[n]
            )
            if needed:
                gid = len(self.members)
                self.group_of[n] = gid
                self.members[gid] = [n]
                self.absorbed.setdefault(n, set()).add(gid)

    def _spaces_of(self, n: Node) -> list[SymExpr]:
        shapes = [n.shape] + ([n.inputs[0].shape] if _fusible_kind(n) == "reduction" else [])
        out = []
        for shape in shapes:
            numel = SymExpr.const(1)
            for d in shape:
                numel = numel * self.c.normalize(d)
            out.append(numel)
        return out

    def _share_space(self, a: int, b: int) -> bool:
        return any(self.c.prove_equal(x, y) for x in self.spaces[a] for y in self.spaces[b])

    def _one_row_space(self, a: int, b: int) -> bool:
        """A kernel reduces over one row space: all its reductions reduce the same dims of equal shapes.

        (A LayerNorm backward reduces the same tensor along rows for the input
        gradient and along columns for the weight gradient: two kernels.)
        """
        reductions = [m for m in self.members[a] + self.members[b] if _fusible_kind(m) == "reduction"]
        if not reductions:
            return True
        first = reductions[0]

        def reduced(r: Node) -> tuple[int, ...]:
            rank = max(len(r.inputs[0].shape), 1)
            return tuple(sorted(d % rank for d in r.attrs["dims"]))

        return all(
            reduced(r) == reduced(first) and self.c.prove_same_shape(r.inputs[0].shape, first.inputs[0].shape) for r in reductions[1:]
        )

    def _reads_other_rows(self, a: int, b: int) -> bool:
        """Would the merged group transpose (or reshape) a value computed from its own reductions?

        A row kernel finishes one row's reductions before it uses them; a transpose
        downstream would need other rows' results (a softmax saved transposed for
        the backward GEMM), so it becomes a kernel of its own. So does a reshape
        read inside the kernel (grouped-query attention's backward sums the heads
        sharing a key, then reshapes the sum for the rotary embedding).
        """
        merged = set(self.members[a]) | set(self.members[b])
        if not any(_fusible_kind(m) == "reduction" for m in merged):
            return False
        if any(t.op == "broadcast_in_dim" and _spreads_other_rows(t, merged) for t in merged):
            return True
        return any(self._moves_rows(t, merged) and next(_reductions_reaching(t.inputs, merged), None) is not None for t in merged)

    def _moves_rows(self, t: Node, merged: set[Node]) -> bool:
        """Does ``t`` read its operand at positions other than its own row?

        A transpose does; so does a reshape that changes the shape and is read
        again inside the kernel (a reshape that is only written out keeps the
        linear order, and the kernel writes it at the row's own position).
        """
        if t.op == "transpose":
            return list(t.attrs["perm"]) != sorted(t.attrs["perm"])
        if t.op == "reshape":
            if is_unit_dim_reshape(t):  # the same rows, viewed with dims of size 1 added or dropped
                return False
            inside = any(u in merged for u in self.users[t])
            return inside and not self.c.prove_same_shape(t.shape, t.inputs[0].shape)
        return False

    def _kind(self, nodes: list[Node]) -> str:
        if len(nodes) == 1 and nodes[0].op == "host_call":
            return "fallback"
        if any(get_spec(n.op).category == LIBRARY for n in nodes):  # alone, or with its epilogue
            return "library"
        if _fusible_kind(nodes[-1]) is None:  # an op that fuses with nothing (a scatter: with the cheap operands it recomputes)
            return "kernel"
        reductions = [n for n in nodes if _fusible_kind(n) == "reduction"]
        if not reductions:
            return "loop"
        # A reduction whose result is used inside the group was stitched to its consumers.
        inside = set(nodes)
        if any(u in inside for r in reductions for u in self.users[r]):
            return "stitch"
        return "input"

    def _computable_inside(self, gp: int, gn: int) -> bool:
        """Can group ``gp`` be computed inside ``gn`` at the positions ``gn`` reads, never written
        out? Only if ``gn`` reads all of its values, nothing else does (no other kernel, no cheap op
        another kernel recomputes, not the program's result), and no reduction is involved."""
        for m in self.members[gp]:
            if _fusible_kind(m) == "cheap":
                continue  # recomputed by every kernel that reads it, wherever that is
            if m in self.g.outputs or any(_is_kernel_op(u) and self.group_of.get(u) not in (gp, gn) for u in self.users[m]):
                return False
        if any(_fusible_kind(m) == "reduction" for m in self.members[gp] + self.members[gn]):
            return False
        return not self._creates_cycle(gp, gn)

    def _part_remap_with_reduction(self, a: int, b: int) -> bool:
        """Would the merged group hold a reduction and a slice, concat or pad? (Kept apart: a row
        kernel reads its row at positions of its own.)"""
        merged = self.members[a] + self.members[b]
        return any(_fusible_kind(m) == "reduction" for m in merged) and any(m.op in _PART_REMAPS for m in merged)

    def _creates_cycle(self, a: int, b: int) -> bool:
        """Would merging groups a and b make a group that depends on itself through another group?"""
        merged = set(self.members[a]) | set(self.members[b])
        # Cheap ops are recomputed by every group that uses them, so reaching one from outside
        # is no dependency on this group (a broadcast constant shared by every LayerNorm).
        computed = {m for m in merged if _fusible_kind(m) != "cheap"}
        if not computed:
            return False
        # Walk back from inputs outside the merged set; reaching a node it computes again is a cycle.
        # Nodes are in topological order, so a node no later than the earliest computed one has no
        # computed ancestor: the walk stops there instead of at the graph's inputs.
        earliest = min(self.order[m] for m in computed)
        stack = [i for m in merged for i in m.inputs if i not in merged]
        seen: set[Node] = set()
        while stack:
            x = stack.pop()
            if x in seen or self.order[x] <= earliest:
                continue
            seen.add(x)
            for i in x.inputs:
                if i in computed:
                    return True
                stack.append(i)
        return False

    def _merge(self, a: int, b: int, spaces: bool = True) -> None:
        """Group ``a`` joins ``b``. ``spaces=False``: ``a`` is computed at the positions ``b`` reads,
        so its element counts are not ``b``'s to share with later consumers."""
        for m in self.members[a]:
            if self.group_of.get(m) == a:
                self.group_of[m] = b
            if m not in self.members[b]:
                self.members[b].append(m)
            if m in self.absorbed:
                self.absorbed[m].discard(a)
                self.absorbed[m].add(b)
        if spaces:
            self.spaces[b] += self.spaces[a]
        self.members[a] = []
        self.spaces[a] = []


def _spreads_other_rows(t: Node, merged: set[Node]) -> bool:
    """Does broadcast ``t`` put a reduction's result (or a value computed from it in ``merged``)
    anywhere but back on the rows it reduced? ``x - x.amax(1)`` on an [n, n] tensor subtracts
    row j's max from column j: a row kernel has not computed row j yet."""
    return not all(spreads_back_onto_its_rows(t, r) for r in _reductions_reaching(t.inputs[:1], merged))


def _reductions_reaching(starts: Sequence[Node], merged: set[Node]) -> Iterator[Node]:
    """The reductions of ``merged`` that ``starts`` are computed from within ``merged`` (the walk
    stops at each reduction it meets)."""
    stack, seen = list(starts), set()
    while stack:
        x = stack.pop()
        if x in seen or x not in merged:
            continue
        seen.add(x)
        if _fusible_kind(x) == "reduction":
            yield x
        else:
            stack.extend(x.inputs)


def _conv_epilogue(conv: Node, users: dict[Node, list[Node]], g: Graph, c: ShapeConstraints) -> list[Node]:
    """The ops after ``conv`` that its library call computes: ``+ bias`` (a per-channel vector
    broadcast along the channel dim), then ``relu``, either or both; [] if none qualifies.

    Taken only where nothing fusible reads the result (the next convolution does): a consumer
    that could have joined the bias add in a loop kernel (a reshape, a sigmoid and a reduction)
    would otherwise become a kernel of its own, a copy. Measured on AVX2 (2 threads): a 3x3/2
    convolution from 3 to 64 channels at 2x288x224 took 0.70 ms, and its bias + ReLU as a
    separate kernel 0.27 ms more, inside the convolution no measurable time; for ResNet's
    BatchNorm chains (four per-channel ops) the post-ops cost as much as the kernel, so those
    stay loops.
    """
    if conv.dtype != "f32" or len(conv.shape) != 4:
        return []
    channel = 3 if conv.attrs.get("channels_last") else 1

    def readers(x: Node) -> list[Node]:  # those that read its values (not its shape)
        return [u for u in users[x] if _is_kernel_op(u)]

    chain: list[Node] = []
    value = conv
    bias = _bias_add(value, readers, channel, c) if value not in g.outputs else None
    if bias is not None:
        chain += [bias.inputs[1] if bias.inputs[0] is value else bias.inputs[0], bias]
        value = bias
    after = readers(value)
    if len(after) == 1 and after[0].op == "relu" and value not in g.outputs:
        value = after[0]
        chain.append(value)
    if not chain or any(_fusible_kind(u) is not None for u in readers(value)):
        return []
    return chain


def _bias_add(y: Node, readers: Callable[[Node], list[Node]], channel: int, c: ShapeConstraints) -> Node | None:
    """The single reader of ``y`` if it is ``y + broadcast(b)`` for a 1-D ``b`` in memory spread along ``channel``."""
    after = readers(y)
    if len(after) != 1 or after[0].op != "add":
        return None
    add = after[0]
    other = add.inputs[1] if add.inputs[0] is y else add.inputs[0]
    if other is y or other.op != "broadcast_in_dim" or list(other.attrs["dims"]) != [channel] or len(readers(other)) != 1:
        return None
    b = other.inputs[0]
    in_memory = b.op in ("constant", "input") or (_is_kernel_op(b) and _fusible_kind(b) != "cheap")
    if not in_memory or b.dtype != "f32" or len(b.shape) != 1 or not c.prove_equal(b.shape[0], y.shape[channel]):
        return None
    if b.is_literal:
        return None  # not in memory
    return add


def _why_alone(p: Node) -> str:
    if p.op == "host_call":
        return "the producer runs in PyTorch (fallback)"
    if get_spec(p.op).category == LIBRARY:
        return "the producer is a library call (GEMM/convolution); its epilogue is a kernel of its own"
    return f"{p.op} has no fusible form (it runs as a kernel of its own)"


def plan_fusion(g: Graph, conv_epilogues: bool = False) -> FusionPlan:
    """Group the tensor ops of ``g`` into kernels; see the module docstring for the rules.
    ``conv_epilogues``: a convolution's bias add and ReLU join its library call (CPU backend)."""
    return _Planner(g, conv_epilogues).run()
