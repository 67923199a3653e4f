"""Programs PyTorch must help with: compiled segments, with PyTorch running some ops between them.

Three kinds of op run in PyTorch (*host ops*): a ``host_call`` (an op the
frontend does not lower: sort, an op with no lowering), on the GPU a ``nonzero``
(the positions behind boolean-mask indexing: its result size is known only once
it has run; the native CPU program runs it itself and plans what follows at the
count's bound) and an op the code generator refused (no kernel form yet, a
dtype it lacks).
Neither sends the whole graph to the reference executor, op by op in Python.
The graph is cut at its host ops instead, as BladeDISC clusters what it
supports and leaves the rest to the host framework: every other op joins the
earliest *segment* it can run in, each segment is compiled like a whole
program (fusion, speculation, buffer plan, generated host flow), and the host
ops run in PyTorch between segments (the refused ones by their reference
semantics from the op registry).

Placement, by *stage*: segment s runs, then the host ops of stage s, then
segment s + 1.

- A compiled op runs in the latest segment among its operands, where a host
  op's result counts as the segment after that host op's stage.
- A host op runs at the latest stage among its operands.

Values read by a later segment, a host op or the caller become outputs of
their segment. Every segment also takes the graph's own inputs, so the dims
they carry are bound in every segment; dims born at a host op (the count
``u0`` of a ``nonzero``) are bound from the results the segment reads.
Constants and index arithmetic are copied into each segment using them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from disc.codegen.lowering import Unsupported
from disc.ir.graph import Graph, Node
from disc.ir.registry import get_spec
from disc.ir.types import IndexType
from disc.runtime.reference import ExecutionProfile, ShapeProgram, build_shape_program, on_device, torch_call


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
    """The graph cut at the ops PyTorch runs: ``segments`` (some stages may have none) and ``host_ops[stage]``."""

    segments: list[Segment]
    host_ops: list[list[Node]]  # per stage, in program order: host_call ops and ops the code generator refused
    shape_program: ShapeProgram  # the whole graph's: index values from the input shapes, for the host ops
    reasons: dict[Node, str] = field(default_factory=dict)  # why a refused op (not a fallback) runs in PyTorch
    host_tensors: set[Node] = field(default_factory=set)  # tensors the host reads shapes of for index operands


def runs_on_host(n: Node, gpu: bool = False) -> bool:
    """Ops PyTorch runs whatever the code generator can do: a ``host_call``, and for the GPU
    program a ``nonzero``, whose result size is known only once it has run (the Triton host flow
    sizes every buffer before its first launch; the native CPU program plans at the count's bound)."""
    return n.op == "host_call" or (gpu and n.op == "nonzero")


def host_ops(graph: Graph, refused: Iterable[Node] = (), gpu: bool = False) -> set[Node]:
    """The ops PyTorch runs: those that always do (``runs_on_host``) and the ``refused`` ones (no code generator form)."""
    return {n for n in graph.nodes if runs_on_host(n, gpu)} | set(refused)


def stages(graph: Graph, host: set[Node]) -> dict[Node, int]:
    """The stage of every node that is not free: its segment (compiled ops) or the point it runs after (``host`` ops).

    Index values get the stage in which compiled code could use them, like compiled ops.
    """
    stage: dict[Node, int] = {}

    def ready(x: Node) -> int:  # the first segment that may read x
        if _is_free(x):
            return 0
        return stage[x] + 1 if x in host else stage[x]

    for n in graph.nodes:
        if _is_free(n):
            continue
        if n in host:
            # After the segment that produced its last operand (host ops of one stage run in program order).
            stage[n] = max((stage[x] if x in host else ready(x) for x in n.inputs if not _is_free(x)), default=0)
        else:
            stage[n] = max((ready(x) for x in n.inputs), default=0)
    return stage


def copyable(graph: Graph, host: set[Node]) -> set[Node]:
    """Tensors computed from constants alone (a transposed weight, a broadcast bias): copied into each segment
    using them, where the code generator folds them as it would in a whole program, rather than passed in."""
    out: set[Node] = set()
    for n in graph.nodes:
        if _is_free(n) or n in host or isinstance(n.type, IndexType):
            continue
        if all(x.op == "constant" or x in out or isinstance(x.type, IndexType) for x in n.inputs):
            out.add(n)
    return out


def plan_segments(graph: Graph, refused: Mapping[Node, str] | None = None, gpu: bool = False) -> SegmentPlan:
    """Cut ``graph`` at its fallbacks and at the ``refused`` ops (mapped to why; see the module doc),
    and for the GPU program (``gpu``) at its ``nonzero`` ops too.

    Raises ``Unsupported`` if a segment cannot be formed.
    """
    host = host_ops(graph, refused or {}, gpu)
    stage = stages(graph, host)
    copied = copyable(graph, host)
    host_nodes = [n for n in graph.nodes if n in host]
    last = max(stage.values(), default=0)
    by_stage: list[list[Node]] = [[] for _ in range(last + 1)]
    for f in host_nodes:
        by_stage[stage[f]].append(f)
    # Index operands of host ops that the whole graph's shape program cannot compute from the inputs are
    # evaluated on the host at run time; the tensors whose dims they read must then be kept.
    shape_program = build_shape_program(graph)
    computed = shape_program.computed
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

    for f in host_nodes:
        for x in f.inputs:
            if isinstance(x.type, IndexType):
                need_on_host(x)
    # Values of compiled ops read outside their segment.
    read_outside: set[Node] = set(host_tensors) | set(graph.outputs)
    for n in graph.nodes:
        if _is_free(n) or isinstance(n.type, IndexType):
            continue
        for x in n.inputs:
            if _is_free(x) or isinstance(x.type, IndexType) or (x in copied and n not in host):
                continue
            if n in host or stage[x] != stage[n]:
                read_outside.add(x)
    # A size read in another segment (a bias broadcast to a count's length): its tensor goes there too,
    # unless one of the graph's inputs carries it.
    users = graph.users()
    for d in graph.nodes:
        t = d.inputs[0] if d.op == "dim" else None
        if t is None or _is_free(t) or t in host or _carrier(d, graph.inputs, graph) is not None:
            continue
        if any(r in host or stage[r] != stage[t] for r in _readers_of_size(d, users, copied)):
            read_outside.add(t)
    segments = []
    for s in range(last + 1):
        members = [
            n
            for n in graph.nodes
            if stage.get(n) == s and n not in host and not isinstance(n.type, IndexType) and (n not in copied or n in read_outside)
        ]
        outputs = [n for n in members if n in read_outside]
        if s == 0:  # a constant returned as it is needs a segment to hand it out
            outputs += [o for o in graph.outputs if o.op == "constant" and o not in outputs]
        if outputs:
            segments.append(_segment_graph(graph, s, members, outputs, copied))
    return SegmentPlan(segments, by_stage, shape_program, dict(refused or {}), host_tensors)


def _segment_graph(graph: Graph, s: int, members: list[Node], outputs: list[Node], copied: set[Node]) -> Segment:
    member_set = set(members)
    # 1. The segment's inputs: the graph's inputs, then tensors from earlier segments and host ops in first-use order.
    boundary: list[Node] = []
    visited: set[Node] = set()

    def collect(x: Node) -> None:
        if x in visited or x in member_set or _is_free(x):
            return
        visited.add(x)
        if x.op == "dim" and _carrier(x, graph.inputs, graph) is not None:
            return  # read from that input instead (see copy)
        if isinstance(x.type, IndexType) or x in copied:
            for i in x.inputs:
                collect(i)
        else:
            boundary.append(x)

    for n in members:
        for x in n.inputs:
            collect(x)
    seg = Graph(name=f"{graph.name}_s{s}", constraints=graph.constraints.copy(), constants=graph.constants)
    available = [*graph.inputs, *boundary]
    mapped: dict[Node, Node] = {x: seg.add_input(x.name, x.tensor_type) for x in available}

    def copy(x: Node) -> Node:
        if x in mapped:
            return mapped[x]
        if x.op == "dim" and x.inputs[0] not in mapped:
            carrier = _carrier(x, available, graph)
            if carrier is None:
                raise Unsupported(f"%{x.name}: no input of its segment carries the dim {x.type}")
            source, axis = carrier
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


def _readers_of_size(d: Node, users: Mapping[Node, list[Node]], copied: set[Node]) -> set[Node]:
    """The ops reading index value ``d``, through index arithmetic and ops copied into each segment."""
    out: set[Node] = set()
    todo, seen = [d], {d}
    while todo:
        for u in users[todo.pop()]:
            if u in seen:
                continue
            seen.add(u)
            if isinstance(u.type, IndexType) or u in copied:
                todo.append(u)
            else:
                out.add(u)
    return out


def _carrier(x: Node, candidates: Sequence[Node], graph: Graph) -> tuple[Node, int] | None:
    """A (tensor, axis) among ``candidates`` with the dim that ``dim`` node ``x`` reads, or None."""
    want = graph.constraints.normalize(x.inputs[0].shape[x.attrs["axis"]])
    for t in candidates:
        for axis, d in enumerate(t.shape):
            if graph.constraints.normalize(d) == want:
                return t, axis
    return None


def _host_call(n: Node, fallbacks: Mapping[str, Any], device: torch.device | None) -> Callable[[list[Any], dict], Any]:
    """How the host runs op ``n`` on its operand values: the fallback's torch call, or the op's
    reference semantics (whose tensors built from sizes alone move to the program's device)."""
    spec = get_spec(n.op)
    if n.op == "host_call":
        call = torch_call(n, fallbacks)
        return lambda operands, results: spec.reference(*operands, call=call, results=results)
    attrs = dict(n.attrs)
    fn = spec.reference if device is None or device.type == "cpu" else on_device(spec.reference, device)
    return lambda operands, results: fn(*operands, **attrs)


def summary(plan: SegmentPlan) -> str:
    """One line: how many segments, and how many ops PyTorch runs between them."""
    n = sum(len(fs) for fs in plan.host_ops)
    fallbacks = sum(f.op == "host_call" for fs in plan.host_ops for f in fs)
    refused = f" ({n - fallbacks} refused by the code generator)" if n > fallbacks else ""
    segments = f"{len(plan.segments)} compiled segment{'s' if len(plan.segments) != 1 else ''}"
    return f"{segments}; {n} op{'s' if n != 1 else ''} run by PyTorch between them{refused}"


class SegmentedExecutor:
    """Runs a ``SegmentPlan``: each segment's compiled program, the host ops in PyTorch between them.

    Holds no per-call state on ``self``: one instance may serve several threads.
    """

    def __init__(self, graph: Graph, plan: SegmentPlan, fallbacks: Mapping[str, Any], device: torch.device | None = None) -> None:
        self.graph = graph
        self.plan = plan
        self.device = device
        self._inputs = graph.inputs  # a scan of the whole graph: once, not per call
        self._shape_program = plan.shape_program
        self._host_calls = {f: _host_call(f, fallbacks, device) for fs in plan.host_ops for f in fs}
        # The payloads host ops and outputs read, on the program's device once rather than per call.
        read = {x for fs in plan.host_ops for f in fs for x in f.inputs} | set(graph.outputs)
        refs = {x.constant_ref for x in read if x.constant_ref is not None}
        self._payloads = {ref: graph.constants[ref] if device is None else graph.constants[ref].to(device) for ref in refs}
        by_stage = {seg.stage: seg for seg in plan.segments}
        self._steps: list[tuple[Segment | None, list[Node]]] = [(by_stage.get(s), fs) for s, fs in enumerate(plan.host_ops)]
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
        env: dict[Node, Any] = dict(zip(self._inputs, inputs))
        index = self._shape_program.fn([tuple(t.shape) for t in inputs])
        results: dict = {}  # one draw per multi-output fallback and call (dropout's result and mask)
        for (seg, fs), drops in zip(self._steps, self._drops):
            if seg is not None:
                args = [env[x] for x in seg.inputs]
                env.update(zip(seg.outputs, seg.executor.run(args)))
                if profile is not None:
                    profile.append(seg.executor.profile(args))
            for f in fs:
                operands = [self._host_value(x, env, index) for x in f.inputs]
                env[f] = self._host_calls[f](operands, results)
            for x in drops:
                env.pop(x, None)
        return [env[o] if o in env else self._constant(o) for o in self.graph.outputs]

    def _constant(self, n: Node) -> torch.Tensor:
        """A constant no segment computed: a stored payload, or a literal built from its attributes
        (a scalar a host op reads, which the segments inline and never hold in memory)."""
        if n.constant_ref is not None:
            return self._payloads[n.constant_ref]
        if not n.is_literal:
            raise RuntimeError(f"disc: %{n.name} ({n.op}) was read before any step computed it")
        return get_spec("constant").reference(value=n.attrs["value"], dtype=n.attrs["dtype"], ref=None)

    def _host_value(self, x: Node, env: dict[Node, Any], index: dict[str, int]) -> Any:
        if not isinstance(x.type, IndexType):
            return env[x] if x in env else self._constant(x)
        if x.name in index:
            return index[x.name]
        value = get_spec(x.op).reference(*[self._host_value(i, env, index) for i in x.inputs], **x.attrs)
        index[x.name] = value
        return value

    def profile(self, inputs: Sequence[torch.Tensor]) -> ExecutionProfile:
        """Kernels of every segment plus the ops PyTorch runs ("fallback"); workspace: the largest segment's."""
        parts: list[ExecutionProfile] = []
        self._execute(inputs, parts)
        kernels = {"memory_bound": 0, "library": 0, "fallback": sum(len(fs) for fs in self.plan.host_ops)}
        for p in parts:
            kernels["memory_bound"] += p.kernels["memory_bound"]
            kernels["library"] += p.kernels["library"]
        return ExecutionProfile(kernels=kernels, workspace_bytes=max((p.workspace_bytes for p in parts), default=0))


def describe_segments(plan: SegmentPlan) -> list[str]:
    """Lines for ``disc.explain``: the segments, what crosses between them, and each segment's program."""
    from disc.runtime.explain import describe_native, describe_triton

    lines = [f"-- backend: {summary(plan)} --"]
    by_stage = {seg.stage: seg for seg in plan.segments}
    for s, fs in enumerate(plan.host_ops):
        seg = by_stage.get(s)
        if seg is not None:
            ins = ", ".join(f"%{x.name}" for x in seg.inputs)
            outs = ", ".join(f"%{x.name}" for x in seg.outputs)
            lines.append(f"  segment {s}: reads {ins}; hands on {outs}")
        for f in fs:
            what = f.attrs["target"] if f.op == "host_call" else f.op
            why = f"  [{plan.reasons[f]}]" if f in plan.reasons else ""
            lines.append(f"  then PyTorch: %{f.name} = {what}({', '.join('%' + x.name for x in f.inputs)}){why}")
    for seg in plan.segments:
        lines += ["", f"== segment {seg.stage} =="]
        lines += describe_triton(seg.build) if hasattr(seg.build, "module") else describe_native(seg.build)
    return lines
