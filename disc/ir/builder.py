"""Building IR the way every frontend needs: index values, broadcasting, conversions.

A frontend turns its framework's ops into ``Graph`` nodes; these are the steps they all share,
independent of any framework: an index node for any symbolic dim (built from the dims of the
inputs by index arithmetic, each computed once), numpy broadcasting decided by shape proofs,
scalar literals, dtype conversions, reshapes and reductions. ``GraphBuilder`` holds one graph
being built; the helpers take it as their first argument (the PyTorch importer is one).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from disc.ir.graph import Graph, Node
from disc.ir.types import FLOAT_DTYPES, numpy_dtype
from disc.shape.expr import DimLike, SymExpr, as_expr, product, simplify_dim


class LoweringError(Exception):
    """A frontend op cannot be expressed in the IR (it becomes a fallback, or an error naming it)."""


class GraphBuilder:
    """One graph being built, with the index values its dims are computed from."""

    def __init__(self, name: str = "main") -> None:
        self.graph = Graph(name=name)
        self.index_cache: dict[SymExpr, Node] = {}

    def index(self, d: DimLike) -> Node:
        """An index node with value ``d``, built from known index values by arithmetic."""
        c = self.graph.constraints
        e = c.normalize(as_expr(d))
        if e in self.index_cache:
            return self.index_cache[e]
        if e.is_const:
            node = self.graph.add("index_const", (), {"value": e.const_value})
        else:
            node = self._materialize(e)
        self.index_cache[e] = node
        return node

    def _materialize(self, e: SymExpr) -> Node:
        total: Node | None = None
        for mono, coeff in e.terms:
            term = self.index(SymExpr.const(abs(coeff))) if (abs(coeff) != 1 or not mono) else None
            for atom in mono:
                a = self._atom(atom)
                term = a if term is None else self.graph.add("imul", (term, a))
            assert term is not None
            if total is None:
                total = term if coeff > 0 else self.graph.add("isub", (self.index(0), term))
            else:
                total = self.graph.add("iadd" if coeff > 0 else "isub", (total, term))
        assert total is not None
        return total

    def _atom(self, atom: Any) -> Node:
        from disc.shape.expr import FloorDiv

        if isinstance(atom, FloorDiv):
            return self.graph.add("ifloordiv", (self.index(atom.num), self.index(atom.den)))
        e = SymExpr.symbol(atom.name)
        if e in self.index_cache:
            return self.index_cache[e]
        raise LoweringError(f"no value in the program computes symbol {atom.name}")

    def register_dims(self, node: Node) -> None:
        """Make every symbolic dim of ``node`` available as an index value."""
        for axis, d in enumerate(node.shape):
            if isinstance(d, SymExpr):
                e = self.graph.constraints.normalize(d)
                if e not in self.index_cache and e.as_symbol():
                    self.index_cache[e] = self.graph.add("dim", (node,), {"axis": axis})

    def index_op(self, op: str, a: DimLike, b: DimLike) -> Node:
        """``op`` (``imin``, ``imax``, ...) of two index values; a fresh symbol it yields stays
        computable from this node (a later reshape may name it)."""
        node = self.graph.add(op, (self.index(a), self.index(b)))
        e = self.graph.constraints.normalize(as_expr(node.type.value))
        self.index_cache.setdefault(e, node)
        return node

    def sizes(self, dims: Sequence[DimLike]) -> list[Node]:
        return [self.index(d) for d in dims]


def scalar(ctx: GraphBuilder, value: Any, dtype: str) -> Node:
    if isinstance(value, Node):
        return convert(ctx, value, dtype)
    if dtype == "i1":
        value = bool(value)
    elif dtype.startswith("f") or dtype == "bf16":
        value = float(value)
    else:
        value = int(value)
    return ctx.graph.add("constant", (), {"value": value, "dtype": dtype})


def convert(ctx: GraphBuilder, x: Node, dtype: str) -> Node:
    if x.is_index:
        x = ctx.graph.add("index_to_tensor", (x,), {"dtype": "i64"})
    return x if x.dtype == dtype else ctx.graph.add("convert", (x,), {"dtype": dtype})


def broadcast_shapes(ctx: GraphBuilder, shapes: Sequence[Sequence[DimLike]]) -> tuple[DimLike, ...]:
    """Numpy broadcasting over symbolic dims, decided by proofs only."""
    c = ctx.graph.constraints
    rank = max((len(s) for s in shapes), default=0)
    out: list[DimLike] = []
    for i in range(rank):
        dims = [s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0]
        chosen: DimLike = 1
        for d in dims:
            if c.prove_is_one(d):
                continue
            if c.prove_is_one(chosen) or c.prove_equal(chosen, d):
                chosen = d
                continue
            # Two dims neither provably equal nor provably 1: they must be equal, checked when
            # the program runs. A dim that is 1 only at run time is refused there with a named
            # error rather than broadcast: the kernels were built for equal dims, and reading
            # them as equal when they are not would give a wrong answer.
            try:
                c.assume_equal(chosen, d, f"broadcast: dim {i} of the operands ({chosen} and {d}) must be equal")
            except ValueError as e:  # provably different and neither provably 1: no shape can satisfy it
                raise LoweringError(f"broadcast of dims {chosen} and {d}: {e}") from None
            if c.prove_not_one(d) and not c.prove_not_one(chosen):
                chosen = d
        out.append(simplify_dim(chosen) if isinstance(chosen, SymExpr) else chosen)
    return tuple(out)


def broadcast_to(ctx: GraphBuilder, x: Node, shape: Sequence[DimLike]) -> Node:
    c = ctx.graph.constraints
    if c.prove_same_shape(x.shape, shape):
        return x
    rank = len(shape)
    if x.tensor_type.rank > rank:
        raise LoweringError(f"cannot broadcast rank {x.tensor_type.rank} to rank {rank}")
    dims = tuple(range(rank - x.tensor_type.rank, rank))
    return ctx.graph.add("broadcast_in_dim", (x, *ctx.sizes(shape)), {"dims": dims})


def elementwise(ctx: GraphBuilder, op: str, operands: Sequence[Any], compute_dtype: str) -> Node:
    nodes = [scalar(ctx, v, compute_dtype) for v in operands]
    shape = broadcast_shapes(ctx, [n.shape for n in nodes])
    nodes = [broadcast_to(ctx, n, shape) for n in nodes]
    return ctx.graph.add(op, nodes)


def arithmetic(ctx: GraphBuilder, compute_dtype: str) -> Callable[..., Node]:
    """``elementwise`` in one dtype with the operands as arguments, for formula-shaped lowerings:
    ``op = arithmetic(ctx, "f64"); op("add", op("mul", a, 2.0), b)``."""

    def op(name: str, *operands: Any) -> Node:
        return elementwise(ctx, name, operands, compute_dtype)

    return op


def reshape(ctx: GraphBuilder, x: Node, shape: Sequence[DimLike]) -> Node:
    if ctx.graph.constraints.prove_same_shape(x.shape, shape):
        return x
    return ctx.graph.add("reshape", (x, *ctx.sizes(shape)))


def reduce(ctx: GraphBuilder, x: Node, dims: Sequence[int], kind: str, keepdim: bool) -> Node:
    if x.tensor_type.rank == 0:
        dims = ()  # a 0-d tensor's dim 0 or -1 names the tensor itself: nothing reduces
    return ctx.graph.add("reduce", (x,), {"dims": tuple(sorted(dims)), "kind": kind, "keepdim": keepdim})


def floor_divide(ctx: GraphBuilder, num: DimLike, den: DimLike) -> SymExpr:
    """``num // den`` as a size: exact where the factors cancel, else an index op the program
    computes at run time, whose value is a new symbol the builder can compute from then on."""
    quotient = ctx.graph.add("ifloordiv", (ctx.index(num), ctx.index(den)))
    value = as_expr(quotient.type.value)  # type: ignore[union-attr]
    ctx.index_cache.setdefault(ctx.graph.constraints.normalize(value), quotient)
    return value


def dim_value(ctx: GraphBuilder, d: DimLike, dtype: str = "i64") -> Node:
    """The size ``d`` as a 0-d tensor of ``dtype`` (a shape value used as data: a resize's scale,
    a negative index wrapped, a flat offset); a constant where ``d`` is known."""
    e = as_expr(d)
    if e.is_const:
        return scalar(ctx, e.const_value, dtype)
    return ctx.graph.add("index_to_tensor", (ctx.index(e),), {"dtype": dtype})


def numel_of(ctx: GraphBuilder, x: Node, dims: Sequence[int], dtype: str) -> Node:
    """The element count of ``dims`` of ``x`` as a 0-d tensor (a shape value used as data)."""
    return dim_value(ctx, product(x.shape[d] for d in dims), dtype)


def mean(ctx: GraphBuilder, x: Node, dims: Sequence[int], keepdim: bool) -> Node:
    total = reduce(ctx, x, dims, "sum", keepdim)
    return elementwise(ctx, "div", [total, numel_of(ctx, x, dims, x.dtype)], x.dtype)


def normalize(ctx: GraphBuilder, x: Node, dims: Sequence[int], eps: float) -> tuple[Node, Node, Node]:
    """``(x - mean) * rstd`` over ``dims`` (LayerNorm's rows), with the mean and rstd (keepdim shapes).

    The variance is the mean of squared deviations (two passes: no cancellation). Where those
    squares overflow, rstd would be 0 and every output a finite, wrong 0; rstd is NaN there
    instead (``var - var`` is NaN only for an infinite var), as eager's overflowing one-pass
    variance gives NaN.
    """
    mu = mean(ctx, x, dims, True)
    centred = elementwise(ctx, "sub", [x, mu], x.dtype)
    var = mean(ctx, elementwise(ctx, "mul", [centred, centred], x.dtype), dims, True)
    rstd = ctx.graph.add("rsqrt", (elementwise(ctx, "add", [var, float(eps)], x.dtype),))
    rstd = elementwise(ctx, "add", [rstd, elementwise(ctx, "sub", [var, var], x.dtype)], x.dtype)
    return elementwise(ctx, "mul", [centred, rstd], x.dtype), mu, rstd


def select(ctx: GraphBuilder, cond: Any, a: Any, b: Any, dtype: str) -> Node:
    """``cond ? a : b`` in ``dtype``, every operand broadcast to their common shape."""
    nodes = [convert(ctx, cond, "i1"), scalar(ctx, a, dtype), scalar(ctx, b, dtype)]
    shape = broadcast_shapes(ctx, [n.shape for n in nodes])
    return ctx.graph.add("select", [broadcast_to(ctx, n, shape) for n in nodes])


def softmax(ctx: GraphBuilder, x: Node, axis: int) -> Node:
    """softmax over ``axis`` (non-negative), the row maximum subtracted first."""
    shifted = elementwise(ctx, "sub", [x, reduce(ctx, x, [axis], "max", True)], x.dtype)
    e = ctx.graph.add("exp", (shifted,))
    return elementwise(ctx, "div", [e, reduce(ctx, e, [axis], "sum", True)], x.dtype)


def log_softmax(ctx: GraphBuilder, x: Node, axis: int) -> Node:
    """log(softmax) over ``axis`` (non-negative), as ``shifted - log(sum(exp(shifted)))``."""
    shifted = elementwise(ctx, "sub", [x, reduce(ctx, x, [axis], "max", True)], x.dtype)
    total = reduce(ctx, ctx.graph.add("exp", (shifted,)), [axis], "sum", True)
    return elementwise(ctx, "sub", [shifted, ctx.graph.add("log", (total,))], x.dtype)


def flip(ctx: GraphBuilder, x: Node, axis: int) -> Node:
    """``x`` reversed along ``axis``: a gather at positions n-1, n-2, ... 0."""
    n = x.shape[axis]
    positions = ctx.graph.add("iota", (ctx.index(n),), {"dtype": "i64"})
    last = dim_value(ctx, as_expr(n) - 1)
    return ctx.graph.add("index_select", (x, elementwise(ctx, "sub", [last, positions], "i64")), {"axis": axis})


def cumulative_sum(ctx: GraphBuilder, x: Node, axis: int, exclusive: bool = False, reverse: bool = False) -> Node:
    """Running sums along ``axis`` (ONNX CumSum, TensorFlow Cumsum): ``exclusive`` leaves each
    element out of its own sum (a zero shifted in first, so sums stay exact), ``reverse`` runs
    from the end."""
    if reverse:
        x = flip(ctx, x, axis)
    if exclusive:
        rank = x.tensor_type.rank
        low, high = [0] * rank, [0] * rank
        low[axis], high[axis] = 1, -1  # one zero before, the last element dropped
        x = ctx.graph.add("pad", (x,), {"low": tuple(low), "high": tuple(high), "value": 0.0 if x.dtype in FLOAT_DTYPES else 0})
    out = ctx.graph.add("cumsum", (x,), {"axis": axis})
    return flip(ctx, out, axis) if reverse else out


def positions(ctx: GraphBuilder, shape: Sequence[DimLike], axis: int) -> Node:
    """An i64 tensor of ``shape`` holding each element's index along ``axis``."""
    along = ctx.graph.add("iota", (ctx.index(shape[axis]),), {"dtype": "i64"})
    return ctx.graph.add("broadcast_in_dim", (along, *ctx.sizes(shape)), {"dims": (axis,)})


TOPK_UNROLLED = 64  # top-k runs as k selections; a larger k is refused rather than unrolled


def top_k(ctx: GraphBuilder, x: Node, axis: int, k: int, largest: bool, what: str = "TopK") -> tuple[Node, Node]:
    """The ``k`` largest (or smallest) elements along ``axis`` in order, ties by the lower index,
    and their i64 indices: k rounds that each take the best element not taken yet (NaN counts as
    the largest, as in PyTorch). An axis not known to hold ``k`` elements is checked at run time."""
    if k > TOPK_UNROLLED:
        raise LoweringError(f"{what} with k={k}: disc unrolls top-k as k selections, up to k={TOPK_UNROLLED}")
    if k <= 0:
        raise LoweringError(f"{what} with k={k}")
    c = ctx.graph.constraints
    n = as_expr(x.shape[axis])
    if not c.prove_ge(n, k):
        if n.is_const:
            raise LoweringError(f"{what}: k={k} is larger than axis {axis} ({n.const_value})")
        c.assume(n, ">=", k, f"{what}: axis {axis} must have at least k={k} elements")
    floats = x.dtype in FLOAT_DTYPES
    if floats:
        worst: Any = -math.inf if largest else math.inf
    else:
        info = np.iinfo(numpy_dtype(x.dtype))
        worst = info.min if largest else info.max
    along = positions(ctx, x.shape, axis)
    taken = broadcast_to(ctx, scalar(ctx, False, "i1"), x.shape)
    values, indices = [], []
    for _ in range(k):
        open_ = select(ctx, taken, worst, x, x.dtype)
        best = reduce(ctx, open_, [axis], "max" if largest else "min", True)
        hit = elementwise(ctx, "eq", [x, best], x.dtype)
        if floats:  # a NaN is the best there is (max/min propagate it); x == NaN never holds
            nan_best = broadcast_to(ctx, ctx.graph.add("isnan", (best,)), x.shape)
            hit = elementwise(ctx, "logical_or", [hit, elementwise(ctx, "logical_and", [ctx.graph.add("isnan", (x,)), nan_best], "i1")], "i1")
        hit = elementwise(ctx, "logical_and", [hit, ctx.graph.add("logical_not", (taken,))], "i1")
        first = ctx.graph.add("argreduce", (convert(ctx, hit, "i32"),), {"axis": axis, "kind": "argmax", "keepdim": True, "last": False})
        indices.append(first)
        values.append(ctx.graph.add("gather", (x, first), {"axis": axis}))
        taken = elementwise(ctx, "logical_or", [taken, elementwise(ctx, "eq", [along, broadcast_to(ctx, first, x.shape)], "i64")], "i1")
    if k == 1:
        return values[0], indices[0]
    return ctx.graph.add("concat", values, {"axis": axis}), ctx.graph.add("concat", indices, {"axis": axis})


def triangle(ctx: GraphBuilder, rows: DimLike, cols: DimLike, upper: bool, diagonal: int = 0) -> Node:
    """A [rows, cols] bool mask: true on and above (``upper``) or below the ``diagonal``-th diagonal."""
    diff = ctx.graph.add("sub", (positions(ctx, [rows, cols], 1), positions(ctx, [rows, cols], 0)))  # col - row
    return elementwise(ctx, "ge" if upper else "le", [diff, diagonal], "i64")


def einsum(ctx: GraphBuilder, equation: str, operands: Sequence[Node]) -> Node:
    """``einsum(equation, *operands)`` for one or two operands, as transposes, sums and one GEMM.

    Two operands become one batched matmul of canonical form, ``[batch, M, K] x [batch, K, N]``:
    letters in both operands and the output are batch dims, letters in both but not the output
    are contracted, the rest are each side's free dims (a letter in one operand only and not in
    the output is summed first). No ellipsis, no repeated letter within an operand."""
    if "..." in equation:
        raise LoweringError(f"einsum {equation!r}: an ellipsis")
    lhs, _, out = equation.replace(" ", "").partition("->")
    subs = lhs.split(",")
    if not out and "->" not in equation:
        counts = {c: lhs.count(c) for c in lhs if c != ","}
        out = "".join(sorted(c for c, k in counts.items() if k == 1))
    if len(subs) != len(operands) or len(operands) not in (1, 2):
        raise LoweringError(f"einsum {equation!r}: {len(operands)} operands (one or two are supported)")
    for s, x in zip(subs, operands):
        if len(set(s)) != len(s) or len(s) != x.tensor_type.rank:
            raise LoweringError(f"einsum {equation!r}: subscripts {s!r} for an operand of rank {x.tensor_type.rank} (repeated letters are not supported)")
    others = [set("".join(subs[:i] + subs[i + 1 :])) | set(out) for i in range(len(subs))]
    parts = []
    for s, x, keep in zip(subs, operands, others):
        alone = [i for i, c in enumerate(s) if c not in keep]
        if alone:  # a letter nobody else reads: summed away first
            x = reduce(ctx, x, alone, "sum", False)
            s = "".join(c for c in s if c in keep)
        parts.append((s, x))
    dims = {c: d for s, x in parts for c, d in zip(s, x.shape)}
    if len(parts) == 1:
        s, x = parts[0]
        return _permuted(ctx, x, s, out)
    (ls, a), (rs, b) = parts
    batch = [c for c in ls if c in rs and c in out]
    contract = [c for c in ls if c in rs and c not in out]
    lfree = [c for c in ls if c not in rs]
    rfree = [c for c in rs if c not in ls]
    for c in batch + contract:
        ctx.graph.constraints.assume_equal(a.shape[ls.index(c)], b.shape[rs.index(c)], f"einsum {equation!r}: both operands' dim {c!r}")
    a = _permuted(ctx, a, ls, "".join(batch + lfree + contract))
    b = _permuted(ctx, b, rs, "".join(batch + contract + rfree))
    size = lambda letters: product(dims[c] for c in letters)
    bdims = [dims[c] for c in batch]
    a = reshape(ctx, a, [*bdims, size(lfree), size(contract)])
    b = reshape(ctx, b, [*bdims, size(contract), size(rfree)])
    nb = len(batch)
    batch_axes = tuple(range(nb))
    y = ctx.graph.add("dot_general", (a, b), {"lhs_batch": batch_axes, "rhs_batch": batch_axes, "lhs_contract": (nb + 1,), "rhs_contract": (nb,)})
    y = reshape(ctx, y, [*bdims, *(dims[c] for c in lfree), *(dims[c] for c in rfree)])
    return _permuted(ctx, y, "".join(batch + lfree + rfree), out)


def _permuted(ctx: GraphBuilder, x: Node, have: str, want: str) -> Node:
    if sorted(have) != sorted(want):
        raise LoweringError(f"einsum: output subscripts {want!r} are not a permutation of {have!r}")
    perm = tuple(have.index(c) for c in want)
    return x if perm == tuple(range(len(perm))) else ctx.graph.add("transpose", (x,), {"perm": perm})


def tile(ctx: GraphBuilder, x: Node, reps: Sequence[DimLike]) -> Node:
    """``x`` repeated ``reps[i]`` times along dim i: [d0, d1] -> broadcast to [r0, d0, r1, d1] -> [r0*d0, r1*d1]."""
    wide: list[DimLike] = []
    for r, d in zip(reps, x.shape):
        wide += [r, d]
    spread = ctx.graph.add("broadcast_in_dim", (x, *ctx.sizes(wide)), {"dims": tuple(range(1, 2 * len(reps), 2))})
    return reshape(ctx, spread, [as_expr(d) * r for r, d in zip(reps, x.shape)])


def batched_matmul(ctx: GraphBuilder, a: Node, b: Node) -> Node:
    """numpy's matmul of operands of rank >= 2: the batch dims broadcast; a 2-d rhs is one GEMM."""
    ra, rb = a.tensor_type.rank, b.tensor_type.rank
    if rb == 2:
        return ctx.graph.add("dot_general", (a, b), {"lhs_contract": (ra - 1,), "rhs_contract": (0,)})
    batch = broadcast_shapes(ctx, [a.shape[:-2], b.shape[:-2]])
    a = broadcast_to(ctx, a, [*batch, *a.shape[-2:]])
    b = broadcast_to(ctx, b, [*batch, *b.shape[-2:]])
    dims = tuple(range(len(batch)))
    return ctx.graph.add("dot_general", (a, b), {"lhs_batch": dims, "rhs_batch": dims, "lhs_contract": (len(batch) + 1,), "rhs_contract": (len(batch),)})


def slice_bound(ctx: GraphBuilder, n: DimLike, v: DimLike, end: int = 2**62) -> Node:
    """A slice bound as an index into a dim of size ``n``: a negative int counts from the end, and
    the bound clamps to [0, n] (at run time where ``n`` is a symbol); an int >= ``end`` means "to the end"."""
    c = ctx.graph.constraints
    if isinstance(v, int) and v < 0:
        e = as_expr(n) + v
        return ctx.index(e) if c.prove_ge(e, 0) else ctx.index_op("imax", e, 0)
    if isinstance(v, int) and (v >= end or (isinstance(n, int) and v >= n)):
        return ctx.index(n)
    return ctx.index(v) if c.prove_ge(n, v) else ctx.index_op("imin", v, n)
