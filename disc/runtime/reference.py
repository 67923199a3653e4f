"""The reference executor: runs the IR op by op with torch, the oracle for every backend.

Shapes are not re-derived per op. At construction the shape computation of
the program (every index value computable from the input shapes, plus every
runtime check) is generated as one Python function (``ShapeProgram``); a call
runs it once, then walks the tensor ops calling each op's reference semantics
from the registry.

The executor keeps no per-call state on ``self``, so one instance may serve
several threads at once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from disc.errors import CompileError, ShapeError
from disc.ir.graph import Graph, Node
from disc.ir.registry import get_spec, kernel_kind
from disc.ir.types import IndexType
from disc.shape.expr import SymExpr, as_expr


@dataclass
class ShapeProgram:
    """Generated Python computing index values and checks from input shapes."""

    source: str
    fn: Callable[..., dict[str, int]]
    computed: frozenset[str]  # names of index nodes it computes


class _Locals:
    """The generated function's name for each symbol: ``s0``, ``s1``... never the IR's own names,
    which come from a file a user may have edited and so are never pasted into code."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}

    def __call__(self, symbol: str) -> str:
        return self.names.setdefault(symbol, f"s{len(self.names)}")

    def expr(self, e: SymExpr) -> SymExpr:
        return e.substitute({sym: SymExpr.symbol(self(sym)) for sym in e.symbols()})


def _py(e: SymExpr, bound: set[str], local: _Locals) -> str | None:
    """Python source for an expression, or None if it uses an unbound symbol."""
    if not e.symbols() <= bound:
        return None
    return f"({local.expr(e)})"


def build_shape_program(g: Graph) -> ShapeProgram:
    c = g.constraints
    lines = ["def shape_program(shapes):", "    v = {}"]
    bound: set[str] = set()
    computed: set[str] = set()
    local = _Locals()

    def bind(sym: str, src: str) -> None:
        root = c.find(sym)
        for name in (sym, root):
            if name not in bound:
                lines.append(f"    {local(name)} = {src}")
                bound.add(name)

    # 1. Symbols bound by input dims. A dim seen again must agree (checked below).
    for pos, node in enumerate(g.inputs):
        for axis, d in enumerate(node.shape):
            if isinstance(d, SymExpr) and d.as_symbol() and d.as_symbol() not in bound:
                bind(d.as_symbol(), f"shapes[{pos}][{axis}]")
    # Symbols defined by expressions of bound ones (product equalities oriented at import).
    for name, expr in c.definitions.items():
        code = _py(expr, bound, local)
        if code and name not in bound:
            lines.append(f"    {local(name)} = {code}")
            bound.add(name)
    # 2. Index nodes, in program order; a node computing a fresh symbol binds it.
    for n in g.nodes:
        if not isinstance(n.type, IndexType):
            continue
        code = _index_code(n, bound, local)
        if code is None:
            continue
        lines.append(f"    v[{n.name!r}] = {code}")
        computed.add(n.name)
        val = as_expr(n.type.value)
        sym = val.as_symbol()
        if sym and sym not in bound:
            bind(sym, f"v[{n.name!r}]")
    # 3. Runtime checks whose symbols are bound here.
    for i, chk in enumerate(c.checks):
        lhs, rhs = _py(chk.lhs, bound, local), _py(chk.rhs, bound, local)
        if lhs is None or rhs is None:
            continue
        cond = {"==": f"{lhs} == {rhs}", "!=": f"{lhs} != {rhs}", ">=": f"{lhs} >= {rhs}", "%": f"{rhs} != 0 and {lhs} % {rhs} == 0"}[chk.op]
        lines.append(f"    if not ({cond}): _fail({i}, locals())")
    lines.append("    return v")
    source = "\n".join(lines) + "\n"

    def _fail(i: int, env: Mapping[str, Any]) -> None:
        chk = c.checks[i]
        values = {s: env.get(local(s)) for s in sorted(chk.lhs.symbols() | chk.rhs.symbols())}
        shown = ", ".join(f"{k}={v}" for k, v in values.items())
        raise ShapeError(f"shape check failed: {chk.lhs} {chk.op} {chk.rhs} ({chk.reason}) with {shown}")

    scope: dict[str, Any] = {"_fail": _fail}
    exec(compile(source, f"<disc shape program {g.name}>", "exec"), scope)
    return ShapeProgram(source, scope["shape_program"], frozenset(computed))


def _index_code(n: Node, bound: set[str], local: _Locals) -> str | None:
    ops = {"iadd": "+", "isub": "-", "imul": "*"}
    names = [f"v[{i.name!r}]" for i in n.inputs]
    if n.op == "index_const":
        return str(n.attrs["value"])
    if n.op == "dim":
        return _py(as_expr(n.inputs[0].shape[n.attrs["axis"]]), bound, local) if isinstance(n.inputs[0].shape[n.attrs["axis"]], SymExpr) else str(n.inputs[0].shape[n.attrs["axis"]])
    if not all(isinstance(i.type, IndexType) for i in n.inputs):
        return None
    if n.op == "ifloordiv":  # 0 for a zero divisor: the divisor's check then reports it
        return f"({names[0]} // {names[1]} if {names[1]} else 0)"
    if n.op in ops:
        return f"{names[0]} {ops[n.op]} {names[1]}"
    if n.op in ("imax", "imin"):
        return f"{n.op[1:]}({names[0]}, {names[1]})"
    return None


def on_device(fn: Callable[..., Any], device: torch.device) -> Callable[..., Any]:
    """``fn`` with its result moved to ``device`` when it comes back as a host tensor of rank > 0.

    The reference semantics make a tensor built from sizes alone (iota, random bits) on the host;
    0-d host tensors stay, as PyTorch lets them mix with device tensors."""

    def moved(*args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        return out.to(device) if isinstance(out, torch.Tensor) and out.dim() and out.device != device else out

    return moved


# Hosts whose frontend hands these executors calls that take and return PyTorch tensors: PyTorch's
# own ops, and TensorFlow's (frontends/tf/fallback.py converts at the call).
EXECUTOR_HOSTS = ("torch", "tensorflow")


def torch_call(n: Node, fallbacks: Mapping[str, Any]) -> Any:
    """The call a ``host_call`` node names in the frontend's table, as one taking PyTorch tensors;
    a host whose frontend gives no such calls is refused by name."""
    if n.attrs["host"] not in EXECUTOR_HOSTS:
        raise CompileError(f"%{n.name} is a host_call for {n.attrs['host']!r}; disc's executors run calls for {', '.join(EXECUTOR_HOSTS)}")
    if n.attrs["call"] not in fallbacks:
        raise CompileError(f"%{n.name} calls {n.attrs['target']} in {n.attrs['host']}, but the frontend gave no such call")
    return fallbacks[n.attrs["call"]]


class ReferenceExecutor:
    """Runs a graph with torch ops. ``fallbacks`` resolves ``host_call`` calls; ``device``
    is where the inputs are (the constants move there once, here)."""

    def __init__(self, graph: Graph, fallbacks: Mapping[str, Any] | None = None, device: str | torch.device = "cpu") -> None:
        self.graph = graph
        self.fallbacks = dict(fallbacks or {})
        self.device = torch.device(device)
        self.shape_program = build_shape_program(graph)
        # Values live in slots numbered by node position; all look-ups are planned here, not per call.
        self._slot = {n: i for i, n in enumerate(graph.nodes)}
        self._steps = self._plan()
        self._inputs = [self._slot[n] for n in graph.inputs]
        self._outputs = [self._slot[n] for n in graph.outputs]
        self._index_slots = {n.name: self._slot[n] for n in graph.nodes if n.name in self.shape_program.computed}

    def _plan(self) -> list[tuple[int, Callable[..., Any], dict[str, Any], list[int], list[int]]]:
        index_of = self._slot
        last_use: dict[Node, int] = {}
        for i, n in enumerate(self.graph.nodes):
            for x in n.inputs:
                last_use[x] = i
        for o in self.graph.outputs:
            last_use[o] = len(self.graph.nodes)
        steps = []
        for i, n in enumerate(self.graph.nodes):
            if n.op == "input" or n.name in self.shape_program.computed:
                continue
            attrs = dict(n.attrs)
            fn = get_spec(n.op).reference
            if n.constant_ref is not None:
                attrs["ref"] = self.graph.constants[n.constant_ref].to(self.device)
            if n.op == "host_call":
                attrs = {"call": torch_call(n, self.fallbacks), "results": None}  # a fresh dict per run
            elif self.device.type != "cpu":
                fn = on_device(fn, self.device)
            # Values dead after this step are dropped to keep peak memory near eager's.
            free = [index_of[x] for x in n.inputs if last_use.get(x) == i and x.op != "input" and not isinstance(x.type, IndexType)]
            steps.append((i, fn, attrs, [index_of[x] for x in n.inputs], free))
        return steps

    def _bind(self, inputs: Sequence[torch.Tensor]) -> dict[int, Any]:
        """Slots holding the inputs and every index value the shape program computes from their shapes."""
        index_values = self.shape_program.fn([tuple(t.shape) for t in inputs])
        values: dict[int, Any] = dict(zip(self._inputs, inputs))
        for name, slot in self._index_slots.items():
            values[slot] = index_values[name]
        return values

    def run(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        values = self._bind(inputs)
        fallback_results: dict = {}
        for slot, fn, attrs, operands, free in self._steps:
            if "results" in attrs:
                attrs = {**attrs, "results": fallback_results}
            values[slot] = fn(*[values[i] for i in operands], **attrs)
            for f in free:
                values.pop(f, None)
        return [values[o] for o in self._outputs]

    def profile(self, inputs: Sequence[torch.Tensor]) -> ExecutionProfile:
        """Run once at these inputs and count what executing the program costs.

        Kernels are the tensor ops executed (each one torch call here), by kind;
        workspace is the peak of live intermediate bytes (inputs, constants and
        parameters excluded), i.e. the memory a buffer planner would need.
        """
        values = self._bind(inputs)
        nodes = self.graph.nodes
        kernels = {"memory_bound": 0, "library": 0, "fallback": 0}
        live: dict[int, int] = {}
        peak = 0
        fallback_results: dict = {}
        for slot, fn, attrs, operands, free in self._steps:
            if "results" in attrs:
                attrs = {**attrs, "results": fallback_results}
            values[slot] = fn(*[values[i] for i in operands], **attrs)
            node = nodes[slot]
            kind = kernel_kind(node.op, node.type)
            if kind is not None:
                kernels[kind] += 1
                out = values[slot]
                live[slot] = out.numel() * out.element_size() if isinstance(out, torch.Tensor) else 0
                peak = max(peak, sum(live.values()))
            for f in free:
                values.pop(f, None)
                live.pop(f, None)
        return ExecutionProfile(kernels=kernels, workspace_bytes=peak)


@dataclass
class ExecutionProfile:
    """What one execution of a program cost: kernels launched by kind, peak workspace bytes."""

    kernels: dict[str, int]
    workspace_bytes: int
