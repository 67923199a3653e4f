"""Programs with fallbacks: compiled segments, with PyTorch running the fallbacks between them.

An op disc does not lower (a ``torch_fallback``: boolean-mask indexing, an op
with no lowering) must not send the whole graph to the reference executor,
op by op in Python. The graph is cut at its fallbacks instead, as BladeDISC
clusters what it supports and leaves the rest to the host framework: every
other op joins the earliest *segment* it can run in, each segment is compiled
like a whole program (fusion, speculation, buffer plan, generated host flow),
and the fallbacks run in PyTorch between segments.

Placement, by *stage*: segment s runs, then the fallbacks of stage s, then
segment s + 1.

- A compiled op runs in the latest segment among its operands, where a
  fallback's result counts as the segment after that fallback's stage.
- A fallback runs at the latest stage among its operands.

Values read by a later segment, a fallback or the caller become outputs of
their segment. Every segment also takes the graph's own inputs, so the dims
they carry are bound in every segment; dims born at a fallback (the count
``u0`` of a boolean mask) are bound from the fallback results the segment
reads. Constants and index arithmetic are copied into each segment using them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from disc.codegen.lowering import Unsupported
from disc.ir.graph import Graph, Node
from disc.ir.registry import get_spec
from disc.ir.types import IndexType
from disc.runtime.reference import ExecutionProfile, build_shape_program


def _is_fallback(n: Node) -> bool:
    return n.op == "torch_fallback"


def _is_free(n: Node) -> bool:
    """Values every segment has without computing them: the graph's inputs and its constants."""
    return n.op in ("input", "constant")


@dataclass
class Segment:
    """One compiled piece: its own graph, and how its inputs and outputs map to the whole graph's values."""

    stage: int
    graph: Graph
    inputs: list[Node]  # whole-graph values, in the order of the segment graph's inputs
    outputs: list[Node]  # whole-graph values, in the order of the segment graph's outputs
    executor: Any = None
    build: Any = None  # NativeBuild or TritonBuild


@dataclass
class SegmentPlan:
    """The graph cut at its fallbacks: ``segments`` (some stages may have none) and ``fallbacks[stage]``."""

    segments: list[Segment]
    fallbacks: list[list[Node]]
    host_tensors: set[Node] = field(default_factory=set)  # tensors the host reads shapes of for fallbacks' index operands


def stages(graph: Graph) -> dict[Node, int]:
    """The stage of every node that is not free: its segment (compiled ops) or the point it runs after (fallbacks).

    Index values get the stage in which compiled code could use them, like compiled ops.
    """
    stage: dict[Node, int] = {}

    def ready(x: Node) -> int:  # the first segment that may read x
        if _is_free(x):
            return 0
        return stage[x] + 1 if _is_fallback(x) else stage[x]

    for n in graph.nodes:
        if _is_free(n):
            continue
        if _is_fallback(n):
            # After the segment that produced its last operand (fallbacks of one stage run in program order).
            stage[n] = max((stage[x] if _is_fallback(x) else ready(x) for x in n.inputs if not _is_free(x)), default=0)
        else:
            stage[n] = max((ready(x) for x in n.inputs), default=0)
    return stage


def copyable(graph: Graph) -> set[Node]:
    """Tensors computed from constants alone (a transposed weight, a broadcast bias): copied into each segment
    using them, where the code generator folds them as it would in a whole program, rather than passed in."""
    out: set[Node] = set()
    for n in graph.nodes:
        if _is_free(n) or _is_fallback(n) or isinstance(n.type, IndexType):
            continue
        if all(x.op == "constant" or x in out or isinstance(x.type, IndexType) for x in n.inputs):
            out.add(n)
    return out


def plan_segments(graph: Graph) -> SegmentPlan:
    """Cut ``graph`` at its fallbacks (see the module doc). Raises ``Unsupported`` if a segment cannot be formed."""
    stage = stages(graph)
    copied = copyable(graph)
    fallback_nodes = [n for n in graph.nodes if _is_fallback(n)]
    last = max(stage.values(), default=0)
    fallbacks: list[list[Node]] = [[] for _ in range(last + 1)]
    for f in fallback_nodes:
        fallbacks[stage[f]].append(f)
    # Index operands of fallbacks that the whole graph's shape program cannot compute from the inputs are
    # evaluated on the host at run time; the tensors whose dims they read must then be kept.
    computed = build_shape_program(graph).computed
    host_tensors: set[Node] = set()
    seen: set[Node] = set()

    def need_on_host(x: Node) -> None:
        if x in seen:
            return
        seen.add(x)
        if not isinstance(x.type, IndexType):
            host_tensors.add(x)
        elif x.name not in computed:
            for i in x.inputs:
                need_on_host(i)

    for f in fallback_nodes:
        for x in f.inputs:
            if isinstance(x.type, IndexType):
                need_on_host(x)
    # Values of compiled ops read outside their segment.
    read_outside: set[Node] = set(host_tensors) | set(graph.outputs)
    for n in graph.nodes:
        if _is_free(n) or isinstance(n.type, IndexType):
            continue
        for x in n.inputs:
            if _is_free(x) or isinstance(x.type, IndexType) or (x in copied and not _is_fallback(n)):
                continue
            if _is_fallback(n) or stage[x] != stage[n]:
                read_outside.add(x)
    segments = []
    for s in range(last + 1):
        members = [
            n
            for n in graph.nodes
            if stage.get(n) == s and not _is_fallback(n) and not isinstance(n.type, IndexType) and (n not in copied or n in read_outside)
        ]
        outputs = [n for n in members if n in read_outside]
        if s == 0:  # a constant returned as it is needs a segment to hand it out
            outputs += [o for o in graph.outputs if o.op == "constant" and o not in outputs]
        if outputs:
            segments.append(_segment_graph(graph, s, members, outputs, copied))
    return SegmentPlan(segments, fallbacks, host_tensors)


def _segment_graph(graph: Graph, s: int, members: list[Node], outputs: list[Node], copied: set[Node]) -> Segment:
    member_set = set(members)
    # 1. The segment's inputs: the graph's inputs, then tensors from earlier segments and fallbacks in first-use order.
    boundary: list[Node] = []
    visited: set[Node] = set()

    def collect(x: Node) -> None:
        if x in visited or x in member_set or _is_free(x):
            return
        visited.add(x)
        if x.op == "dim" and _input_carries(graph, x):
            return  # read from that input instead (see _dim_source)
        if isinstance(x.type, IndexType) or x in copied:
            for i in x.inputs:
                collect(i)
        else:
            boundary.append(x)

    for n in [*members, *outputs]:
        for x in n.inputs:
            collect(x)
    seg = Graph(name=f"{graph.name}_s{s}", constraints=graph.constraints.copy(), constants=graph.constants)
    mapped: dict[Node, Node] = {}
    for x in [*graph.inputs, *boundary]:
        mapped[x] = seg.add_input(x.name, x.tensor_type)
    available = [*graph.inputs, *boundary]

    def copy(x: Node) -> Node:
        if x in mapped:
            return mapped[x]
        if x.op == "dim" and x.inputs[0] not in mapped:
            source, axis = _dim_source(x, available, graph)
            node = seg.add_typed("dim", [copy(source)], {"axis": axis}, x.type, x.name)
        else:
            node = seg.add_typed(x.op, [copy(i) for i in x.inputs], x.attrs, x.type, x.name)
        mapped[x] = node
        return node

    for n in members:
        copy(n)
    for o in outputs:
        copy(o)
    seg.outputs = [mapped[o] for o in outputs]
    return Segment(s, seg, available, outputs)


def _input_carries(graph: Graph, x: Node) -> bool:
    """Whether one of the graph's inputs has the dim that ``dim`` node ``x`` reads."""
    want = graph.constraints.normalize(x.inputs[0].shape[x.attrs["axis"]])
    return any(graph.constraints.normalize(d) == want for i in graph.inputs for d in i.shape)


def _dim_source(x: Node, available: Sequence[Node], graph: Graph) -> tuple[Node, int]:
    want = graph.constraints.normalize(x.inputs[0].shape[x.attrs["axis"]])
    for t in available:
        for axis, d in enumerate(t.shape):
            if graph.constraints.normalize(d) == want:
                return t, axis
    raise Unsupported(f"%{x.name}: no input of its segment carries the dim {want}")


class SegmentedExecutor:
    """Runs a ``SegmentPlan``: each segment's compiled program, the fallbacks in PyTorch between them.

    Holds no per-call state on ``self``: one instance may serve several threads.
    """

    def __init__(self, graph: Graph, plan: SegmentPlan, fallbacks: dict[str, Any], device: torch.device | None = None) -> None:
        self.graph = graph
        self.plan = plan
        self.device = device
        self._calls = {f: fallbacks[f.attrs["call"]] for fs in plan.fallbacks for f in fs}
        self._shape_program = build_shape_program(graph)
        self._fallback_ref = get_spec("torch_fallback").reference
        by_stage = {seg.stage: seg for seg in plan.segments}
        self._steps: list[tuple[Segment | None, list[Node]]] = [(by_stage.get(s), fs) for s, fs in enumerate(plan.fallbacks)]
        self._drops = self._plan_drops()

    def _plan_drops(self) -> list[list[Node]]:
        """After each step, the values no later step or output reads (freed to keep peak memory down)."""
        last: dict[Node, int] = {}
        for k, (seg, fs) in enumerate(self._steps):
            reads = list(seg.inputs) if seg is not None else []
            for f in fs:
                reads += [x for x in f.inputs if not isinstance(x.type, IndexType)]
            for x in reads:
                last[x] = k
        for x in self.plan.host_tensors:
            last[x] = max(last.get(x, 0), len(self._steps) - 1)
        keep = set(self.graph.outputs) | set(self.graph.inputs)
        drops: list[list[Node]] = [[] for _ in self._steps]
        for x, k in last.items():
            if x not in keep:
                drops[k].append(x)
        return drops

    def run(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return self._execute(inputs, None)

    def _execute(self, inputs: Sequence[torch.Tensor], profile: list[ExecutionProfile] | None) -> list[torch.Tensor]:
        env: dict[Node, Any] = dict(zip(self.graph.inputs, inputs))
        index = self._shape_program.fn([tuple(t.shape) for t in inputs])
        results: dict = {}  # one draw per multi-output fallback and call
        for (seg, fs), drops in zip(self._steps, self._drops):
            if seg is not None:
                args = [env[x] for x in seg.inputs]
                env.update(zip(seg.outputs, seg.executor.run(args)))
                if profile is not None:
                    profile.append(seg.executor.profile(args))
            for f in fs:
                operands = [self._host_value(x, env, index) for x in f.inputs]
                env[f] = self._fallback_ref(*operands, call=self._calls[f], results=results)
            for x in drops:
                env.pop(x, None)
        return [env[o] if o in env else self._constant(o) for o in self.graph.outputs]

    def _constant(self, n: Node) -> torch.Tensor:
        return self.graph.constants[n.attrs["ref"]]

    def _host_value(self, x: Node, env: dict[Node, Any], index: dict[str, int]) -> Any:
        if not isinstance(x.type, IndexType):
            return env[x] if x in env else self._constant(x)
        if x.name in index:
            return index[x.name]
        value = get_spec(x.op).reference(*[self._host_value(i, env, index) for i in x.inputs], **x.attrs)
        index[x.name] = value
        return value

    def profile(self, inputs: Sequence[torch.Tensor]) -> ExecutionProfile:
        """Kernels of every segment plus the fallbacks run; workspace: the largest segment's."""
        parts: list[ExecutionProfile] = []
        self._execute(inputs, parts)
        kernels = {"memory_bound": 0, "library": 0, "fallback": sum(len(fs) for fs in self.plan.fallbacks)}
        for p in parts:
            kernels["memory_bound"] += p.kernels["memory_bound"]
            kernels["library"] += p.kernels["library"]
        return ExecutionProfile(kernels=kernels, workspace_bytes=max((p.workspace_bytes for p in parts), default=0))


def describe_segments(plan: SegmentPlan) -> list[str]:
    """Lines for ``disc.explain``: the segments, what crosses between them, and each segment's program."""
    from disc.codegen.cpu.explain import describe_native
    from disc.codegen.triton.explain import describe_triton

    n = sum(len(fs) for fs in plan.fallbacks)
    lines = [f"-- backend: {len(plan.segments)} compiled segments; {n} fallbacks run by PyTorch between them --"]
    by_stage = {seg.stage: seg for seg in plan.segments}
    for s, fs in enumerate(plan.fallbacks):
        seg = by_stage.get(s)
        if seg is not None:
            ins = ", ".join(f"%{x.name}" for x in seg.inputs)
            outs = ", ".join(f"%{x.name}" for x in seg.outputs)
            lines.append(f"  segment {s}: reads {ins}; hands on {outs}")
        for f in fs:
            lines.append(f"  then PyTorch: %{f.name} = {f.attrs['target']}({', '.join('%' + x.name for x in f.inputs)})")
    for seg in plan.segments:
        lines += ["", f"== segment {seg.stage} =="]
        lines += describe_triton(seg.build) if hasattr(seg.build, "module") else describe_native(seg.build)
    return lines
