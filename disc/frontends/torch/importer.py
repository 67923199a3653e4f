"""FX (core ATen) graph -> disc IR.

The importer walks an ATen-level FX graph (from ``torch.export`` or from the
torch.compile backend), maps torch's shape symbols onto disc symbols, turns
SymInt arithmetic into shape-computation ops, and lowers each op through the
table in ``lowering.py``. Ops without a lowering become ``host_call``
nodes: they run in PyTorch, are listed by ``disc.explain``, and never crash
the import.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch
import torch.fx

from disc.ir.builder import GraphBuilder, LoweringError
from disc.ir.graph import Node
from disc.ir.ops.shape_ops import settle_minted_symbols
from disc.ir.types import TensorType, dtype_of_torch
from disc.shape.expr import DimLike, SymExpr, as_expr, exact_divide, simplify_dim


@dataclass
class InputSpec:
    """How a graph input maps onto disc: its name and per-axis symbolic dim names."""

    name: str
    dims: dict[int, str] = field(default_factory=dict)


@dataclass
class Fallback:
    """One op that runs in PyTorch: the target and how to rebuild its arguments."""

    target: Any
    args: Any  # the original args with disc Nodes replaced by _Slot(i)
    kwargs: Any
    output_index: int | None
    op_name: str = ""  # the FX node: outputs of one op share it

    def call(self, values: Sequence[Any], results: dict | None = None) -> torch.Tensor:
        """Run the op (once per execution for all its outputs, when ``results`` is given)."""
        if results is not None and self.output_index is not None and self.op_name in results:
            out = results[self.op_name]
        else:
            args = _fill(self.args, values)
            for position, fix in ARGUMENT_LAYOUTS.get(self.target, ()):
                if len(args) > position and args[position] is not None:
                    args = (*args[:position], fix(args[position]), *args[position + 1 :])
            out = self.target(*args, **_fill(self.kwargs, values))
            if results is not None and self.output_index is not None:
                results[self.op_name] = out
        return out[self.output_index] if self.output_index is not None else out

    def to_json(self) -> dict[str, Any]:
        """This call as JSON (``disc.save``); ValueError names what cannot be written."""
        if not isinstance(self.target, torch._ops.OpOverload):
            raise ValueError(f"{self.op_name} calls {self.target!r}, which is not an ATen operator")
        where = f"{self.target} ({self.op_name})"
        return {
            "target": f"{self.target.namespace}::{self.target._schema.name.split('::')[-1]}.{self.target._overloadname}",
            "args": _encode(self.args, where),
            "kwargs": _encode(self.kwargs, where),
            "output_index": self.output_index,
            "op_name": self.op_name,
        }

    @staticmethod
    def from_json(data: dict[str, Any]) -> Fallback:
        """The call ``to_json`` wrote; ValueError if this torch has no such operator."""
        namespace, rest = data["target"].split("::", 1)
        name, overload = rest.rsplit(".", 1)
        try:
            target = getattr(getattr(getattr(torch.ops, namespace), name), overload)
        except (AttributeError, RuntimeError) as e:
            raise ValueError(f"this torch has no operator {data['target']} ({e})") from e
        return Fallback(target, _decode(data["args"]), _decode(data["kwargs"]), data["output_index"], data["op_name"])


# Literal argument kinds a saved fallback may hold, beyond JSON's own (str, int, float, bool, None).
_TORCH_LITERALS: dict[str, tuple[type, Callable[[Any], str], Callable[[str], Any]]] = {
    "dtype": (torch.dtype, lambda v: str(v).removeprefix("torch."), lambda s: getattr(torch, s)),
    "device": (torch.device, str, torch.device),
    "layout": (torch.layout, lambda v: str(v).removeprefix("torch."), lambda s: getattr(torch, s)),
    "memory_format": (torch.memory_format, lambda v: str(v).removeprefix("torch."), lambda s: getattr(torch, s)),
}


def _encode(tree: Any, where: str) -> Any:
    # Tagged one-key objects keep tuples, slots and torch literals apart from plain lists and strings.
    if isinstance(tree, _Slot):
        return {"slot": tree.index}
    if tree is None or isinstance(tree, (bool, int, float, str)):
        return tree
    if isinstance(tree, (list, tuple)):
        return {"tuple" if isinstance(tree, tuple) else "list": [_encode(x, where) for x in tree]}  # FX's immutable_list is a list
    if isinstance(tree, dict) and all(isinstance(k, str) for k in tree):
        return {"dict": {k: _encode(v, where) for k, v in tree.items()}}
    for kind, (cls, write, _) in _TORCH_LITERALS.items():
        if isinstance(tree, cls):
            return {kind: write(tree)}
    raise ValueError(f"{where} has an argument of type {type(tree).__name__} ({tree!r}), which cannot be saved")


def _decode(data: Any) -> Any:
    if not isinstance(data, dict):
        return data
    ((kind, value),) = data.items()
    if kind == "slot":
        return _Slot(value)
    if kind in ("list", "tuple"):
        items = [_decode(x) for x in value]
        return items if kind == "list" else tuple(items)
    if kind == "dict":
        return {k: _decode(v) for k, v in value.items()}
    return _TORCH_LITERALS[kind][2](value)


RNG_SEED_INPUT = "rng_seed"  # the graph input (i64[1]) seeding every random op of a call


@dataclass(frozen=True)
class Unavailable:
    """A non-tensor value disc does not compute; importing an op that reads it fails with ``reason``."""

    reason: str


@dataclass(frozen=True)
class _Slot:
    index: int


def aligned_attention_bias(bias: torch.Tensor, elements: int = 16) -> torch.Tensor:
    """``bias`` laid out as CUDA's memory-efficient attention kernel reads it: every stride but the
    last a multiple of 16 bytes. Eager's SDPA pads the mask's last dim the same way and passes a
    view of the padded buffer; a broadcast (stride-0) dim stays broadcast."""
    align = max(16 // bias.element_size(), 1)
    if all(st % align == 0 for st in bias.stride()[:-1]):
        return bias
    base = bias
    for d, (size, st) in enumerate(zip(bias.shape, bias.stride())):
        if st == 0 and size > 1:
            base = base.narrow(d, 0, 1)
    n = bias.shape[-1]
    padded = base.new_zeros(*base.shape[:-1], n + (-n) % elements)
    padded[..., :n] = base
    return padded[..., :n].expand(bias.shape)


# Fallback arguments a PyTorch kernel needs in a particular layout, which disc's buffers need not
# have: op -> [(argument position, the function that lays it out)].
ARGUMENT_LAYOUTS: dict[Any, list[tuple[int, Callable[[torch.Tensor], torch.Tensor]]]] = {
    torch.ops.aten._scaled_dot_product_efficient_attention.default: [(3, aligned_attention_bias)],
    torch.ops.aten._scaled_dot_product_efficient_attention_backward.default: [(4, aligned_attention_bias)],
}


def _fill(tree: Any, values: Sequence[Any]) -> Any:
    if isinstance(tree, _Slot):
        return values[tree.index]
    if isinstance(tree, (list, tuple)):
        return type(tree)(_fill(x, values) for x in tree)
    if isinstance(tree, dict):
        return {k: _fill(v, values) for k, v in tree.items()}
    return tree


class Importer(GraphBuilder):
    """Holds the state of one import; ``lowering.py`` functions receive it as ``ctx``."""

    def __init__(self, name: str = "main") -> None:
        super().__init__(name)
        self.symbols: dict[sympy.Symbol, SymExpr] = {}
        self.examples: dict[sympy.Symbol, sympy.Integer] = {}  # torch's hints: each symbol's traced value
        self.mask_positions: dict[Node, Node] = {}  # a boolean mask -> its nonzero (one count per mask)
        self.fallbacks: dict[str, Fallback] = {}
        self.fallback_counts: dict[str, int] = {}
        self.env: dict[torch.fx.Node, Any] = {}
        self.output_layout: list[Any] = []  # per FX output: graph output index, or the FX value itself
        # Random ops compile to counter-based generators seeded by an extra input the caller
        # fills per call (``RNG_SEED_INPUT``); callers that cannot leave them to PyTorch.
        self.allow_rng = False
        self.rng_seed: Node | None = None
        self.rng_sites = 0

    # -- symbols and index values -------------------------------------------------------
    def sym_to_expr(self, s: Any) -> DimLike:
        """A torch size (int, SymInt or sympy expression) as a disc dim."""
        if isinstance(s, int):
            return s
        if isinstance(s, torch.SymInt):
            expr = s.node.expr
        else:
            expr = s
        return simplify_dim(self._sympy(sympy.sympify(expr)))

    def _sympy(self, e: sympy.Expr) -> SymExpr:
        if e.is_Integer:
            return SymExpr.const(int(e))
        if e.is_Symbol:
            if e not in self.symbols:
                self.symbols[e] = self.graph.constraints.new_symbol("u", source=f"torch symbol {e}", example=self._example(e))
            return self.symbols[e]
        if isinstance(e, sympy.Add):
            out = SymExpr.const(0)
            for a in e.args:
                out = out + self._sympy(a)
            return out
        if isinstance(e, sympy.Mul):
            out = SymExpr.const(1)
            for a in e.args:
                out = out * self._sympy(a)
            return out
        if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) >= 0:
            out = SymExpr.const(1)
            for _ in range(int(e.exp)):
                out = out * self._sympy(e.base)
            return out
        name = type(e).__name__
        if name == "FloorDiv" and e.args[1].is_Integer:
            return self._sympy(e.args[0]) // int(e.args[1])
        key = sympy.Symbol(f"__expr_{e}")
        if name == "FloorDiv" and key not in self.symbols:
            # A division by a size (a window count's -1 in a view): exact where the divisor is a
            # factor of the dividend (a padded size over its number of windows), else computed.
            num, den = (self.graph.constraints.normalize(self._sympy(a)) for a in e.args)
            quotient = exact_divide(num, den)
            if quotient is not None:
                return quotient
            try:
                return self._index_op("ifloordiv", [num, den])
            except LoweringError:
                pass
        if name in ("Mod", "PythonMod") and e.args[1].is_Integer and int(e.args[1]) > 0:
            x = self._sympy(e.args[0])
            return x - (x // int(e.args[1])) * int(e.args[1])
        if name in ("Max", "Min") and key not in self.symbols:
            # A padding's size (max(0, k - n % s)) that a backward receives as a number: computed
            # from its operands by index ops, whose shape rule names it, where they have values.
            try:
                return self._index_op("imax" if name == "Max" else "imin", [self._sympy(a) for a in e.args])
            except LoweringError:
                pass
        # Anything else (CeilToInt, ...): a fresh symbol, computed at run time by the op that
        # produces the tensor.
        if key not in self.symbols:
            self.symbols[key] = self.graph.constraints.new_symbol("u", source=f"torch expression {e}", example=self._example(e))
        return self.symbols[key]

    def _example(self, e: sympy.Expr) -> int | None:
        """``e``'s value in the example torch traced (its symbols' hints), where it has one."""
        try:
            value = e.xreplace(self.examples) if self.examples else None
            return int(value) if value is not None and value.is_Integer else None
        except (TypeError, ValueError, ZeroDivisionError):
            return None

    def _index_op(self, op: str, args: Sequence[SymExpr]) -> SymExpr:
        """The value of index op ``op`` folded over ``args`` (each computed from known values)."""
        node = self.index(args[0])
        for arg in args[1:]:
            node = self.graph.add(op, (node, self.index(arg)))
        value = self.graph.constraints.normalize(as_expr(node.type.value))
        self.index_cache.setdefault(value, node)
        return value

    # -- random numbers -------------------------------------------------------------------
    def random_uniform(self, shape: Sequence[DimLike]) -> Node:
        """Uniform [0, 1) floats of ``shape``, from a site of their own of this call's seed."""
        if not self.allow_rng:
            raise LoweringError("random ops need a per-call seed, which this caller does not supply")
        if self.rng_seed is None:
            self.rng_seed = self.graph.add_input(RNG_SEED_INPUT, TensorType("i64", (1,)))
        site = self.rng_sites
        self.rng_sites += 1
        return self.graph.add("random_uniform", (self.rng_seed, *self.sizes(shape)), {"site": site})

    # -- fallback -----------------------------------------------------------------------
    def fallback(self, fx_node: torch.fx.Node, reason: str) -> Any:
        """Run ``fx_node`` in PyTorch: one ``host_call`` node per tensor result."""
        operands: list[Node] = []

        def slot(v: Any) -> Any:
            # Disc values become operands; everything else is kept as the call's literal.
            if isinstance(v, Node):
                operands.append(v)
                return _Slot(len(operands) - 1)
            if isinstance(v, Unavailable):
                raise LoweringError(v.reason)
            if isinstance(v, (list, tuple)):
                return type(v)(slot(x) for x in v)
            if isinstance(v, dict):
                return {k: slot(x) for k, x in v.items()}
            return v

        args = slot(torch.fx.node.map_arg(fx_node.args, lambda n: self.env[n]))
        kwargs = slot(dict(torch.fx.node.map_arg(fx_node.kwargs, lambda n: self.env[n])))
        if isinstance(fx_node.meta.get("val"), torch.SymInt):
            # A size computed by an op disc has no lowering for (math.ceil of a size ratio):
            # torch's trace knows it as an expression over the graph's symbols.
            try:
                return self.index(self.sym_to_expr(fx_node.meta["val"]))
            except (LoweringError, NotImplementedError, TypeError, ValueError):
                pass
        target_name = str(fx_node.target)
        self.fallback_counts[target_name] = self.fallback_counts.get(target_name, 0) + 1
        val = fx_node.meta.get("val")
        outs = list(val) if isinstance(val, (list, tuple)) else [val]
        if not any(isinstance(v, torch.Tensor) for v in outs):
            # A value disc cannot hold (a SymFloat, a SymBool for a torch._check): fine while
            # nothing reads it; an op that does cannot be imported (see ``slot``).
            return Unavailable(f"{fx_node.target} ({fx_node.name}) produces a {type(val).__name__}, which disc cannot compute ({reason})")
        results: list[Any] = []
        for i, v in enumerate(outs):
            if not isinstance(v, torch.Tensor):
                results.append(None)
                continue
            key = f"{fx_node.name}" + (f"#{i}" if isinstance(val, (list, tuple)) else "")
            self.fallbacks[key] = Fallback(fx_node.target, args, kwargs, i if isinstance(val, (list, tuple)) else None, fx_node.name)
            # Result dims come from torch's meta; data-dependent ones are fresh symbols.
            shape = tuple(self.sym_to_expr(d) for d in v.shape)
            node = self.graph.add(
                "host_call",
                operands,
                {"host": "torch", "call": key, "target": target_name, "reason": reason, "dtype": dtype_of_torch(v.dtype), "shape": _shape_attr(shape)},
            )
            self.register_dims(node)
            results.append(node)
        return results if isinstance(val, (list, tuple)) else results[0]


def _shape_attr(shape: Sequence[DimLike]) -> tuple[str, ...]:
    return tuple(str(d) for d in shape)


LoweringFn = Callable[..., Any]


def _traced_values(gm: torch.fx.GraphModule) -> dict[sympy.Symbol, sympy.Integer]:
    """The values torch's symbols had in the example it traced ``gm`` with (its shape env's hints)."""
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        sizes = [val] if isinstance(val, torch.SymInt) else list(val.shape) if isinstance(val, torch.Tensor) else []
        for s in sizes:
            if isinstance(s, torch.SymInt):
                env = s.node.shape_env
                # torch 2.13 renamed var_to_val (deprecated there) to backed_var_to_val.
                return dict(getattr(env, "backed_var_to_val", None) or env.var_to_val)
    return {}


def import_fx(
    gm: torch.fx.GraphModule,
    inputs: Sequence[InputSpec],
    constants: dict[str, torch.Tensor],
    *,
    name: str = "main",
    symbol_hints: dict[Any, str] | None = None,
    allow_host_outputs: bool = False,
    allow_rng: bool = False,
    size_inputs: frozenset[str] = frozenset(),
) -> Importer:
    """Import an ATen FX graph.

    ``inputs`` names the user inputs in placeholder order; placeholders listed
    in ``constants`` (parameters, buffers, lifted constants) become constants.
    With ``allow_host_outputs``, outputs that are not tensors (``None`` gradients,
    sizes a training forward saves for its backward) are left to the caller:
    ``output_layout`` says, per FX output, which graph output it is (an int) or
    which FX value the host must supply instead. With ``allow_rng``, random ops
    (dropout) compile to counter-based generators; the graph then gets a last
    input ``rng_seed`` (i64[1]) the caller fills with a fresh seed per call.
    """
    from disc.frontends.torch.lowering import LOWERINGS, SYMINT_OPS

    imp = Importer(name)
    imp.allow_rng = allow_rng
    imp.examples = _traced_values(gm)
    g = imp.graph
    user_inputs = iter(inputs)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    # Tensors first, so that SymInt inputs (torch.compile passes sizes
    # separately) resolve to dims of the tensors they describe.
    for node in placeholders:
        val = node.meta.get("val")
        if node.target in constants:
            imp.env[node] = g.add_constant(constants[node.target], _clean(node.target))
        elif isinstance(val, torch.Tensor):
            imp.env[node] = _add_input(imp, next(user_inputs), val)
        elif node.target in size_inputs:
            # A size no tensor input has as a dim (a backward's count of embedding rows): the
            # caller passes it as the first dim of an empty tensor, so it is checked and bound
            # like any other dim.
            size = imp.sym_to_expr(val)
            carrier = g.add_input(next(user_inputs).name, TensorType("i8", (size, 0)))
            imp.register_dims(carrier)
            imp.env[node] = imp.index(size)
    for node in placeholders:
        if node not in imp.env:
            imp.env[node] = imp.index(imp.sym_to_expr(node.meta.get("val")))
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            continue
        if node.op == "get_attr":
            imp.env[node] = g.add_constant(getattr(gm, node.target), _clean(node.target))
        elif node.op == "call_function":
            args = torch.fx.node.map_arg(node.args, lambda n: imp.env[n])
            kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: imp.env[n])
            if node.target in SYMINT_OPS:
                imp.env[node] = SYMINT_OPS[node.target](imp, *args)
                continue
            if node.target is operator.getitem:
                imp.env[node] = args[0][args[1]]
                continue
            fn = LOWERINGS.get(node.target) or LOWERINGS.get(getattr(node.target, "overloadpacket", None))
            if fn is None:
                imp.env[node] = imp.fallback(node, "no lowering")
                continue
            try:
                imp.env[node] = fn(imp, node, *args, **kwargs)
            except Exception as e:  # a lowering that cannot handle this case: PyTorch runs the op
                imp.env[node] = imp.fallback(node, f"{type(e).__name__}: {e}")
        elif node.op == "output":
            outs = node.args[0]
            flat = list(outs) if isinstance(outs, (list, tuple)) else [outs]
            g.outputs = []
            for o in flat:
                if isinstance(o, torch.fx.Node) and isinstance(o.meta.get("val"), torch.Tensor):
                    imp.output_layout.append(len(g.outputs))
                    g.outputs.append(imp.env[o] if isinstance(imp.env.get(o), Node) else _as_output(imp, imp.env[o]))
                elif allow_host_outputs:
                    imp.output_layout.append(o)
                else:
                    raise LoweringError(f"graph output {o!r} is not a tensor")
    settle_minted_symbols(g)
    return imp


def _as_output(imp: Importer, v: Any) -> Node:
    if isinstance(v, Node):
        return v
    raise LoweringError(f"graph output {v!r} is not a tensor")


def _clean(name: str) -> str:
    return name.replace(".", "_")


def _add_input(imp: Importer, spec: InputSpec, val: Any) -> Node:
    if not isinstance(val, torch.Tensor):
        raise LoweringError(f"input {spec.name!r} is not a tensor ({type(val).__name__})")
    c = imp.graph.constraints
    dims: list[DimLike] = []
    for axis, size in enumerate(val.shape):
        if axis in spec.dims:
            example = imp._example(size.node.expr) if isinstance(size, torch.SymInt) else int(size)
            sym = c.new_symbol(name=spec.dims[axis], lo=0, source=f"input '{spec.name}' dim {axis}", example=example)
            if isinstance(size, torch.SymInt) and size.node.expr.is_Symbol:
                prev = imp.symbols.get(size.node.expr)
                if prev is not None and prev != sym:
                    c.add_equal(prev, sym)
                imp.symbols.setdefault(size.node.expr, sym)
            dims.append(sym)
        elif isinstance(size, torch.SymInt):
            dims.append(imp.sym_to_expr(size))
        else:
            dims.append(int(size))
    node = imp.graph.add_input(spec.name, TensorType(dtype_of_torch(val.dtype), tuple(dims)))
    imp.register_dims(node)
    return node
