"""One C++ function per fused group: loop, input (reduction) and stitch kernels.

A kernel iterates over one index space and computes each value it needs *at
an index*, walking from the group's outputs back to the buffers it reads:
elementwise ops keep the index, ``broadcast_in_dim``/``transpose``/``slice``
/``index_select``... map it, ``reshape`` keeps the linear position. A value
asked for twice at the same index is computed once (CSE of values and of
index arithmetic). Dims are runtime values from the ``Shapes`` struct, so
one kernel serves every shape, and kernels of identical structure (the same
fusion in each layer) print to the same text and are emitted once.

Schedules:
- loop: one flat parallel loop over the elements when no op needs the
  multi-index; else rows x innermost dim, the inner loop vectorisable;
- input/stitch: parallel over rows; per row one pass per dependent
  reduction (LayerNorm: mean, then variance), then one pass writing the
  outputs, so the row is re-read from cache, never written in between.

Speculation: a kernel may be generated in several versions, each with a
C++ condition over the run-time dims; the first whose condition holds runs.
- broadcast: where a broadcast may or may not happen (a dim that may be 1),
  a version assuming no broadcast (contiguous, vectorisable loads);
- reduction schedule by row length: rows that fit a per-thread row cache
  (``ROW_CACHE_MAX``) keep each computed reduction operand there, so later
  passes read it instead of recomputing it (softmax computes exp once); few
  long rows split each pass across threads instead of giving one row to one
  thread; otherwise passes recompute their operands. A row spanning several
  reduced dims is walked by nested loops, one per dim. Reductions over
  leading dims (bias gradients, column sums, NHWC BatchNorm) are not per-row
  at all: they run in memory order, rows outer and kept elements inner, into
  one partial row per thread combined at the end, one walk per reduction
  level (the ``column`` schedule);
- tiny work runs on one thread (OpenMP ``if``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from disc.codegen.cpu.cexpr import SymbolNames, c_product
from disc.codegen.cpu.ops import (
    BINARY,
    C_TYPES,
    FLOATS,
    INT_DIVISION,
    INT_WRAPPING,
    NARROW,
    REDUCE_INIT,
    REDUCE_INIT_INT,
    REDUCE_STEP,
    SIMD_REDUCTION,
    UNARY,
    WIDEN,
    bitcast,
    literal,
    storage_type,
)
from disc.codegen.groups import (
    column_space,
    output_source,
    reads,
    reduced_index,
    reduction_domain,
    reduction_levels,
    runtime_broadcasts,
    written_per_row,
)
from disc.codegen.index import Idx, IndexEmitter, reshaped
from disc.codegen.lowering import ELEMENTWISE_OWN_FORMS, KernelStep, Unsupported
from disc.ir.graph import Node
from disc.ir.ops.nn import pooled_dims
from disc.ir.ops.random import site_offset
from disc.ir.ops.reduction import spreads_back_onto_its_rows
from disc.ir.registry import ELEMENTWISE, get_spec
from disc.ir.types import INT_DTYPES

# A parallel region costs ~1 us on 2 threads here (fork, join, the other core's cache lines), so
# each thread is given at least a grain of elements: 2048 of plain arithmetic or copies, 1024 for
# kernels with a reduction (they walk each row more than once), 512 where an element costs a
# transcendental function. Measured per kernel on GPT-2 decode at 2-31 tokens (DISC_PROFILE=1,
# 2-core Emerald Rapids): tanh-GELU on 16 x 1024 ran 14 -> 7.7 us, softmax on 4 x 20 x 20 rows
# 7 -> 4 us, LayerNorm on 24 x 256 6.0 -> 4.2 us; a 1536-element bias add lost 0.7 us when split.
GRAIN_ELEMENTS = 2048
GRAIN_REDUCTION = 1024
GRAIN_TRANSCENDENTAL = 512
TRANSCENDENTAL_OPS = frozenset(
    "exp expm1 log log1p log2 log10 tanh sigmoid sin cos tan erf asin acos atan sinh cosh asinh acosh atanh "
    "gelu gelu_tanh silu pow atan2".split()
)
ROW_CACHE_MAX = 8192  # elements per cached row: a few of them fit L1/L2 and the stack of a worker thread
ROW_CACHE_BUFFERS = 3  # reduction operands cached per row, at most
MAX_VERSIONS = 8  # per kernel; the profiling counters reserve this many slots a step
WINDOW_UNROLL_MAX = 64  # pooling windows up to this many positions are unrolled (GCC vectorises innermost loops only)
SPLIT_ROW_MIN = 32768  # a row this long is worth a parallel region of its own when rows are too few


@dataclass
class KernelSource:
    name: str
    text: str  # the C++ functions, one per version
    versions: list[str]  # speculation versions, e.g. ["no-broadcast", "general"]
    conditions: list[str]  # per version, the C++ condition (over s.) under which it may run; the last is "true"
    params: list[Node] = field(default_factory=list)  # buffers in parameter order: outputs, then inputs
    declarations: list[str] = field(default_factory=list)  # one prototype per version (the host flow may sit in another unit)

    def function(self, k: int) -> str:
        """The C++ name of version ``k``."""
        return self.name if len(self.versions) == 1 else f"{self.name}_v{k}"


class _Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.depth = 1

    def __call__(self, line: str) -> None:
        self.lines.append("  " * self.depth + line)


class _Emitter(IndexEmitter):
    """Emits the statements computing values of one group at indices."""

    def __init__(self, step: KernelStep, names: SymbolNames, assume_no_broadcast: bool) -> None:
        self.step = step
        self.names = names
        self.c = names.c
        self.members = set(step.group.nodes)
        self.buffers: dict[Node, str] = {}
        for i, n in enumerate(step.outputs):
            self.buffers[n] = f"out{i}"
        for i, n in enumerate(step.inputs):
            self.buffers.setdefault(n, f"in{i}")
        self.w = _Writer()
        self.scopes: list[dict] = [{}]
        self.counter = 0
        self.assume_no_broadcast = assume_no_broadcast
        self.maybe_broadcast = False  # did any broadcast need a run-time decision?
        self.delinearized = False
        self.accs: dict[Node, tuple[str, tuple[str, ...]]] = {}  # reduce node -> (variable, row index it holds)
        self.row_cache: dict[Node, str] = {}  # value -> per-row buffer holding it at every j of the row
        self.columns: dict[Node, str] = {}  # column schedule: reduce node -> array of its values (kept dims)
        self.column_kept = 0  # column schedule: how many trailing dims are kept (the j loop's)
        self.column_inner: tuple[str, ...] = ()  # column schedule: the kept dims' indices in the current j loop
        self.pass_dims: tuple[str, ...] | None = None  # the index of the row pass being emitted
        self.rows = self.cols = ""  # reduction kernels: the C++ row count and row length (host-evaluable)
        self.cached: list[Node] = []  # reduction kernels: the values kept in row caches
        self.hoisted: dict[str, str] = {}  # C++ dim expression -> the local holding it
        self.window_interior = False  # windows along the innermost dim lie inside the input (no padding check)
        self.rows_interior = False  # windows along the outer dims lie inside the input, for this row

    # -- small helpers --------------------------------------------------------
    def dim(self, d) -> str:
        # Dims with a floor division become function-level constants: inside a loop the
        # call's branches keep GCC from vectorising even though the value is invariant.
        text = self.names.expr(d)
        if "disc_floordiv_i" not in text:
            return text
        if text not in self.hoisted:
            self.hoisted[text] = f"dim{len(self.hoisted)}"
        return self.hoisted[text]

    def prologue(self) -> list[str]:
        """Declarations of the hoisted dims, to open the function with."""
        return [f"  const int64_t {name} = {text};" for text, name in self.hoisted.items()]

    def broadcast_index(self, size: str, index: str) -> str:
        return f"({size} == 1 ? 0 : {index})"

    def fresh(self, prefix: str = "v") -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def let(self, ctype: str, expr: str, prefix: str = "v") -> str:
        name = self.fresh(prefix)
        self.w(f"const {ctype} {name} = {expr};")
        return name

    def dims_of(self, idx: Idx) -> tuple[str, ...]:
        if idx.dims is None:
            key = ("delin", idx.shape, idx.linear)
            got = self.memo_get(key)
            if got is None:
                self.delinearized = True
                rest = idx.linear if idx.linear.isidentifier() or " " not in idx.linear else f"({idx.linear})"
                out = []
                for k in range(len(idx.shape) - 1, -1, -1):
                    size = idx.shape[k]
                    if size == "1":
                        out.append("0")
                    elif k == 0:
                        out.append(rest)
                    else:
                        out.append(self.let("int64_t", f"{rest} % {_atomic(size)}", "i"))
                        rest = self.let("int64_t", f"{rest} / {_atomic(size)}", "q")
                got = tuple(reversed(out))
                self.scopes[-1][key] = got
            idx.dims = got
        return idx.dims

    def linear_of(self, idx: Idx) -> str:
        if idx.linear is None:
            expr = "0"
            for size, i in zip(idx.shape, idx.dims or ()):
                if expr == "0":
                    expr = i
                elif size == "1":
                    continue
                else:
                    expr = f"{_atomic(expr)} * {_atomic(size)} + {i}"
            idx.linear = expr if len(expr) < 24 or expr.isidentifier() else self.let("int64_t", expr, "l")
        return idx.linear

    # -- values -----------------------------------------------------------------
    def value(self, n: Node, idx: Idx) -> str:
        if n.is_literal:
            return literal(n.attrs["value"], n.dtype)
        key = (n, idx.dims, idx.linear)
        got = self.memo_get(key)
        if got is not None:
            return got
        if n in self.row_cache and idx.dims is not None and idx.dims == self.pass_dims:
            expr = f"{self.row_cache[n]}[j]"
        elif n not in self.members:
            if n not in self.buffers:
                raise Unsupported(f"%{n.name} is read by a kernel but has no buffer")
            expr = f"{self.buffers[n]}[{self.linear_of(idx)}]"
            if n.dtype == "i1":
                expr = f"disc_load_bool(&{expr})"
            elif n.dtype in WIDEN:
                expr = WIDEN[n.dtype].format(expr)
        else:
            expr = self._compute(n, idx)
        name = self.let(C_TYPES[n.dtype], expr)
        self.scopes[-1][key] = name
        return name

    def _compute(self, n: Node, idx: Idx) -> str:
        op = n.op
        t = C_TYPES[n.dtype]
        spec = get_spec(op)
        if op == "exp" and minus_its_max(n.inputs[0]):
            return f"disc_exp_nonpositive_arg({self.value(n.inputs[0], idx)})"
        if op in INT_WRAPPING and n.dtype in INT_DTYPES:
            return INT_WRAPPING[op].format(*(self.value(x, idx) for x in n.inputs))
        if op in UNARY:
            return UNARY[op].format(self.value(n.inputs[0], idx))
        if op == "div" and n.dtype in FLOATS and self._row_invariant(n.inputs[1]):
            # A row divided by its own reduction (softmax's sum): one reciprocal per row, which
            # GCC hoists out of the column loop, and a multiply per element, as eager's softmax
            # does. A vector division costs several multiplies' throughput on AVX2.
            a, b = (self.value(x, idx) for x in n.inputs)
            return f"({a} * ({t}(1) / {b}))"
        if op in INT_DIVISION and n.inputs[0].dtype not in FLOATS:
            return INT_DIVISION[op].format(*(self.value(x, idx) for x in n.inputs))
        if op in BINARY:
            return BINARY[op].format(*(self.value(x, idx) for x in n.inputs))
        if op == "select":
            p, a, b = (self.value(x, idx) for x in n.inputs)
            return f"({p} ? {a} : {b})"
        if op == "bitcast":
            return bitcast(self.value(n.inputs[0], idx), n.inputs[0].dtype, n.dtype)
        if op == "convert":
            x = self.value(n.inputs[0], idx)
            if n.dtype == "i1":
                return f"({x} != 0)"
            if n.inputs[0].type.dtype == "i1":  # a select: GCC does not vectorise bool -> float casts on AVX2
                return f"({x} ? {t}(1) : {t}(0))"
            if n.dtype in NARROW:  # rounded to 16 bits where the program says so, then computed on in float
                return WIDEN[n.dtype].format(NARROW[n.dtype].format(f"static_cast<float>({x})"))
            return f"static_cast<{t}>({x})"
        if spec.category == ELEMENTWISE:
            raise Unsupported(f"no C++ for elementwise op {op}", [n])
        handler = getattr(self, f"_op_{op}", None)
        if handler is None:
            raise Unsupported(f"no C++ kernel form for op {op} (%{n.name})", [n])
        return handler(n, idx)

    def _row_invariant(self, x: Node) -> bool:
        """Whether ``x`` spreads a value of this kernel's current row back along it: a reduction of
        the row, or arithmetic on such reductions and literals (``F.normalize``'s
        ``max(sqrt(sum(x^2)), eps)``). Those are locals of the row, so what is computed from them
        is hoisted out of the column loop."""
        if x.op != "broadcast_in_dim":
            return False
        found = self._row_reductions(x.inputs[0], 0)
        return bool(found) and all(spreads_back_onto_its_rows(x, r) for r in found)

    def _row_reductions(self, v: Node, depth: int) -> list[Node] | None:
        """The current row's reductions ``v`` is computed from, if it is computed from nothing
        else (them, scalar literals, elementwise ops); None otherwise."""
        if v in self.accs:
            return [v]
        if v.is_literal or (v.op == "broadcast_in_dim" and v.inputs[0].is_literal and not v.inputs[0].shape):
            return []
        if depth > 8 or v not in self.members or get_spec(v.op).category != ELEMENTWISE:
            return None
        found: list[Node] = []
        for x in v.inputs:
            sub = self._row_reductions(x, depth + 1)
            if sub is None:
                return None
            found += sub
        return found

    def _op_reshape(self, n: Node, idx: Idx) -> str:
        x = n.inputs[0]
        if idx.dims is None or (idx.linear is not None and x not in self.members):
            # A buffer read at the same linear position needs no dims of its own.
            return self.value(x, Idx(self.shape(x), None, self.linear_of(idx)))
        return self.value(x, reshaped(self, idx, n.shape, x.shape))

    def _op_iota(self, n: Node, idx: Idx) -> str:
        return f"static_cast<{C_TYPES[n.dtype]}>({self.dims_of(idx)[0]})"

    def _op_index_to_tensor(self, n: Node, idx: Idx) -> str:
        return f"static_cast<{C_TYPES[n.dtype]}>({self.dim(n.inputs[0].type.value)})"

    def _op_random_uniform(self, n: Node, idx: Idx) -> str:
        seed = self.value(n.inputs[0], Idx(("1",), ("0",)))
        return f"disc_uniform({seed}, {site_offset(n.attrs['site'])}ull, {self.linear_of(idx)})"

    def _op_slice(self, n: Node, idx: Idx) -> str:
        x, start, _ = n.inputs
        axis, step = n.attrs["axis"], n.attrs["step"]
        dims = list(self.dims_of(idx))
        step_part = dims[axis] if step == 1 else f"{dims[axis]} * {step}"
        dims[axis] = f"({self._index_scalar(start)} + {step_part})"
        return self.value(x, self._operand_idx(x, dims))

    def _op_index_select(self, n: Node, idx: Idx) -> str:
        index = n.inputs[1]
        axis = n.attrs["axis"] % len(n.shape)
        dims = list(self.dims_of(idx))
        i = self.value(index, Idx(self.shape(index), (dims[axis],)))
        return self._gathered(n, dims, axis, i)

    def _op_gather(self, n: Node, idx: Idx) -> str:
        index = n.inputs[1]
        axis = n.attrs["axis"] % len(n.shape)
        dims = list(self.dims_of(idx))
        i = self.value(index, Idx(self.shape(index), tuple(dims)))
        return self._gathered(n, dims, axis, i)

    def _gathered(self, n: Node, dims: list[str], axis: int, i: str) -> str:
        """``x`` at ``dims`` with the ``axis`` position taken from index value ``i``, checked: an
        index out of range (negative ones count from the end under ``wrap_negative``) faults, an
        IndexError for the call, and reads nothing."""
        x = n.inputs[0]
        wrap = "true" if n.attrs["wrap_negative"] else "false"
        dims[axis] = self.let("int64_t", f"disc_checked_index(int64_t({i}), {self.dim(x.shape[axis])}, {wrap}, s.fault)", "g")
        load = lambda: self.value(x, self._operand_idx(x, dims))  # noqa: E731
        return self._branch(C_TYPES[n.dtype], [(f"{dims[axis]} >= 0", load), (None, lambda: f"{C_TYPES[n.dtype]}(0)")])

    def _branch(self, ctype: str, cases: list[tuple[str | None, object]]) -> str:
        """``if (cond) {...} else if ...``: each case computes its value in its own scope (no out-of-range loads)."""
        result = self.fresh("b")
        self.w(f"{ctype} {result};")
        for k, (cond, compute) in enumerate(cases):
            head = "" if k == 0 else "} else "
            self.w(f"{head}if ({cond}) {{" if cond is not None else f"{head}{{")
            self.w.depth += 1
            self.scopes.append({})
            self.w(f"{result} = {compute()};")  # type: ignore[operator]
            self.scopes.pop()
            self.w.depth -= 1
        self.w("}")
        return result

    def _op_concat(self, n: Node, idx: Idx) -> str:
        axis = n.attrs["axis"] % len(n.shape)
        dims = self.dims_of(idx)
        cases = []
        offset = "0"
        for k, x in enumerate(n.inputs):
            size = self.dim(x.shape[axis])
            local = list(dims)
            local[axis] = dims[axis] if offset == "0" else f"({dims[axis]} - {_atomic(offset)})"
            end = size if offset == "0" else f"{offset} + {size}"
            last = k == len(n.inputs) - 1
            cases.append((None if last else f"{dims[axis]} < {end}", lambda x=x, local=local: self.value(x, self._operand_idx(x, local))))
            offset = end
        return self._branch(C_TYPES[n.dtype], cases)

    def _op_pad(self, n: Node, idx: Idx) -> str:
        x = n.inputs[0]
        dims = self.dims_of(idx)
        local, conds = [], []
        for k, lo in enumerate(n.attrs["low"]):
            i = dims[k] if lo == 0 else f"({dims[k]} - {lo})"
            local.append(i)
            if lo > 0:
                conds.append(f"{i} >= 0")
            if n.attrs["high"][k] > 0 or lo > 0:
                conds.append(f"{i} < {self.dim(x.shape[k])}")
        if not conds:
            return self.value(x, self._operand_idx(x, local))
        fill = literal(n.attrs["value"], n.dtype)
        return self._branch(C_TYPES[n.dtype], [(" && ".join(conds), lambda: self.value(x, self._operand_idx(x, local))), (None, lambda: fill)])

    def _op_argreduce(self, n: Node, idx: Idx) -> str:
        """The index of the first (``last``: the last) largest (smallest) element along the axis, by
        a loop per output element (argreduce fuses with nothing: its kernel is this loop). A NaN is
        larger and smaller than anything, and the first (last) NaN wins, as in torch.argmax (of the
        flipped axis); an empty axis is refused by the op's shape rule before the program runs."""
        x = n.inputs[0]
        axis = n.attrs["axis"] % len(x.shape)
        out = list(self.dims_of(idx))
        t = C_TYPES[x.dtype]
        best, at, k = self.fresh("v"), self.fresh("a"), self.fresh("k")
        self.w(f"{t} {best} = {t}(0);")
        self.w(f"int64_t {at} = -1;")
        self.w(f"for (int64_t {k} = 0; {k} < {self.dim(x.shape[axis])}; ++{k}) {{")
        self.w.depth += 1
        self.scopes.append({})
        dims = [*out[:axis], k, *out[axis + (1 if n.attrs["keepdim"] else 0) :]]
        v = self.let(t, self.value(x, self._operand_idx(x, dims)), "e")
        last = n.attrs["last"]  # ties go to the later element
        beats = f"{v} {'>' if n.attrs['kind'] == 'argmax' else '<'}{'=' if last else ''} {best}"
        if x.dtype in FLOATS and last:  # a NaN replaces anything, an earlier NaN included; numbers never replace one
            beats = f"({v} != {v} || ({best} == {best} && {beats}))"
        elif x.dtype in FLOATS:  # once best is NaN nothing replaces it; a NaN replaces any number
            beats = f"({best} == {best} && ({v} != {v} || {beats}))"
        self.w(f"if ({at} < 0 || {beats}) {{ {best} = {v}; {at} = {k}; }}")
        self.scopes.pop()
        self.w.depth -= 1
        self.w("}")
        return at

    def _op_reduce_window(self, n: Node, idx: Idx) -> str:
        x = n.inputs[0]
        kind = n.attrs["kind"]
        rank = len(n.shape)
        window, strides, dilation, padding = _window_attrs(n)
        out = self.dims_of(idx)
        t = C_TYPES[x.dtype]
        acc = self.fresh("w")
        init = _reduce_init("max" if kind == "argmax" else kind, x.dtype)
        self.w(f"{t} {acc} = {init};")
        if kind == "argmax":
            at = self.fresh("a")  # the index of the best element so far; -1 until one is in bounds
            self.w(f"int64_t {at} = -1;")
        # Positions in the padding are masked, not branched around: the load reads a
        # clamped (always valid) position and a select drops it. In the interior of
        # the innermost dim (see _window_split) neither is needed and loads are affine
        # in j. Small windows are unrolled here: GCC vectorises only innermost loops,
        # so window loops inside the j loop would keep it scalar.
        windowed = pooled_dims(window, strides, padding)
        unroll = math.prod(window[d] for d in windowed) <= WINDOW_UNROLL_MAX
        first = True  # the first window position (unrolled): argmax takes it outright when nothing is masked
        offsets: dict[int, list[int | str]] = {}  # per windowed dim: the window positions, or a loop variable
        opened = 0
        for d in windowed:
            if unroll:
                offsets[d] = list(range(window[d]))
            else:
                k = self.fresh("k")
                self.w(f"for (int64_t {k} = 0; {k} < {window[d]}; ++{k}) {{")
                self.w.depth += 1
                opened += 1
                offsets[d] = [k]
        self.scopes.append({})
        for combo in itertools.product(*(offsets[d] for d in windowed)):
            local, conds = list(out), []
            unclamped = list(out)
            for d, k in zip(windowed, combo):
                lo = padding[d][0]
                shift = f"{k * dilation[d] - lo}" if isinstance(k, int) else f"{k} * {dilation[d]} - {lo}"
                pos = self.let("int64_t", f"{out[d]} * {strides[d]} + {shift}", "p")
                unclamped[d] = pos
                inside = self.window_interior if d == rank - 1 else self.rows_interior
                if inside:  # no clamp, no mask
                    local[d] = pos
                    continue
                size = self.dim(x.shape[d])
                conds.append(f"({pos} >= 0) & ({pos} < {size})")
                local[d] = self.let("int64_t", f"std::max<int64_t>(std::min<int64_t>({pos}, {size} - 1), 0)", "c")
            v = self.value(x, self._operand_idx(x, local))
            if kind == "argmax":
                self._argmax_step(n, v, conds, unclamped, acc, at, seeded=unroll and not conds, first=first)
                first = False
                continue
            if conds:  # `&`, not `&&`: a branch-free mask keeps the loop vectorisable
                v = self.let(t, f"({' & '.join(conds)}) ? {v} : {t}({init})")
            self.w(REDUCE_STEP[kind].format(acc=acc, x=v) + ";")
        self.scopes.pop()
        for _ in range(opened):
            self.w.depth -= 1
            self.w("}")
        return at if kind == "argmax" else acc

    def _argmax_step(self, n: Node, v: str, conds: list[str], pos: list[str], best: str, at: str, *, seeded: bool, first: bool) -> None:
        """One window position of max-pool's index rule, branch-free.

        The first in-bounds element is taken, then any larger one or any NaN, so
        equal maxima keep the first and NaNs the last (the walk is in index order).
        Where no position is masked and the window is unrolled (``seeded``), the
        first position is taken outright and the ``at < 0`` test dropped: a 64-bit
        test among 32-bit float masks keeps GCC from vectorising (interior rows of
        ResNet's 3x3 pool at 8x48x52x32: 0.76 -> 0.10 ms).
        """
        x = n.inputs[0]
        flat = ""
        for d in n.attrs["index_dims"]:
            flat = f"({flat}) * {self.dim(x.shape[d])} + {pos[d]}" if flat else pos[d]
        if seeded and first:
            self.w(f"{best} = {v};")
            self.w(f"{at} = {flat};")
            return
        better = f"({v} > {best})" + (f" | ({v} != {v})" if x.dtype in FLOATS else "") + ("" if seeded else f" | ({at} < 0)")
        take = self.let("bool", f"({' & '.join(conds)}) & ({better})" if conds else f"({better})", "t")
        self.w(f"{best} = {take} ? {v} : {best};")
        self.w(f"{at} = {take} ? {flat} : {at};")

    def _op_reduce(self, n: Node, idx: Idx) -> str:
        if n in self.columns:  # a column schedule's combined row (of the current outer index), by the kept dims
            kept = self.dims_of(idx)[-self.column_kept :]
            if tuple(kept) == self.column_inner:
                return f"{self.columns[n]}[j]"
            return f"{self.columns[n]}[{self.linear_of(Idx(self.shape(n)[-self.column_kept :], tuple(kept)))}]"
        if n not in self.accs:
            raise Unsupported(f"reduction %{n.name} used outside its row loop")
        var, row = self.accs[n]
        if self.dims_of(idx) != row:
            raise Unsupported(f"reduction %{n.name} is read at another row than the one being computed")
        return var


def kernel_form_refusal(n: Node) -> str | None:
    """Why a fused C++ kernel cannot compute ``n`` (None: it can): the forms ``_Emitter`` has,
    read by the CPU's declared support (``program.refusal``) before anything is lowered."""
    op = n.op
    if get_spec(op).category == ELEMENTWISE:
        ok = op in UNARY or op in BINARY or op in INT_DIVISION or op in ELEMENTWISE_OWN_FORMS
        return None if ok else f"no C++ for elementwise op {op}"
    if op == "scatter_add":  # a kernel of its own (emit_scatter_add)
        return f"scatter_add %{n.name} in {n.dtype}: no 16-bit C++ form" if n.dtype in NARROW else None
    if op == "nonzero" or hasattr(_Emitter, f"_op_{op}"):
        return None
    return f"no C++ kernel form for op {op} (%{n.name})"


def _reduce_init(kind: str, dtype: str) -> str:
    """The C++ identity of a reduction ``kind`` in ``dtype`` (integers have no infinity)."""
    table = REDUCE_INIT_INT if dtype not in FLOATS and kind in REDUCE_INIT_INT else REDUCE_INIT
    return table[kind].format(t=C_TYPES[dtype])


def minus_its_max(x: Node) -> bool:
    """Whether ``x`` is ``a - max(a)``, the max taken over some dims of ``a`` and broadcast back
    along them: then every element is <= 0 or NaN (a - b rounds to <= 0 where a <= b)."""
    if x.op != "sub" or x.inputs[1].op != "broadcast_in_dim":
        return False
    a, spread = x.inputs
    peak = spread.inputs[0]
    return peak.op == "reduce" and peak.attrs["kind"] == "max" and peak.inputs[0] is a and spreads_back_onto_its_rows(spread, peak)


def _atomic(expr: str) -> str:
    """``expr`` safe as an operand of ``*``, ``/`` or ``%``."""
    if expr.replace(".", "_").isidentifier() or expr.lstrip("-").isdigit():
        return expr
    depth = 0
    for k, ch in enumerate(expr):  # already one parenthesised group (or a call)?
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0 and k < len(expr) - 1 and ch == ")":
            return f"({expr})"
    if expr.endswith(")") and " " not in expr.split("(", 1)[0]:
        return expr
    return f"({expr})"


def _stored(out: Node, value: str) -> str:
    """``value`` (computed in ``out``'s compute type) as ``out``'s buffer holds it."""
    return NARROW[out.dtype].format(value) if out.dtype in NARROW else value


# -- kernel functions -----------------------------------------------------------------
def _signature(name: str, step: KernelStep) -> str:
    params = ["const Shapes& s"]
    params += [f"{storage_type(n.dtype)}* __restrict__ out{i}" for i, n in enumerate(step.outputs)]
    seen = set(step.outputs)
    k = 0
    for n in step.inputs:
        if n in seen:
            continue
        params.append(f"const {storage_type(n.dtype)}* __restrict__ in{k}")
        k += 1
    return f"DISC_HIDDEN void {name}({', '.join(params)})"


def _grain(step: KernelStep) -> int:
    """Elements a thread should get at least, by what one element of this kernel costs."""
    ops = {n.op for n in step.group.nodes}
    if ops & TRANSCENDENTAL_OPS:
        return GRAIN_TRANSCENDENTAL
    return GRAIN_REDUCTION if "reduce" in ops else GRAIN_ELEMENTS


def _parallel(em: _Emitter, work: str, simd: bool = False) -> str:
    grain = _grain(em.step)
    team = f"disc_team({work}, {grain})"
    return f"#pragma omp parallel for{' simd' if simd else ''} schedule(static) if({work} >= {2 * grain}) num_threads({team})"


def _loop_body(step: KernelStep, names: SymbolNames, assume: bool, nested: bool, short: bool = False) -> _Emitter:
    em = _Emitter(step, names, assume)
    root = step.group.nodes[-1]
    shape = em.shape(root)
    if not nested or len(shape) < 2:
        em.w(f"const int64_t n = {c_product(list(shape))};")
        em.w(_parallel(em, "n"))
        em.w("for (int64_t i = 0; i < n; ++i) {")
        em.w.depth += 1
        _write_outputs(em, step, root, Idx(shape, None, "i"))
        em.w.depth -= 1
        em.w("}")
        return em
    if short:
        return _short_row_body(em, step, root, shape)
    em.w(f"const int64_t rows = {c_product(list(shape[:-1]))}, cols = {shape[-1]};")
    em.w(_parallel(em, "rows * cols"))
    em.w("for (int64_t r = 0; r < rows; ++r) {")
    em.w.depth += 1
    outer = em.dims_of(Idx(shape[:-1], None, "r"))
    root_idx = Idx(shape, tuple(outer) + ("j",), "r * cols + j")
    columns = [("0", "cols", False)]  # (first, end, inside every window) column ranges
    split = _window_split(em, root)
    if split is not None:
        # Border columns check the padding; the interior between them does not.
        em.w(f"const int64_t j_lo = std::min<int64_t>({split[0]}, cols);")
        em.w(f"const int64_t j_hi = std::max<int64_t>(std::min<int64_t>({split[1]}, cols), j_lo);")
        columns = [("0", "j_lo", False), ("j_lo", "j_hi", True), ("j_hi", "cols", False)]
    inside = _window_rows(em, root, outer)
    if inside is not None:
        # Rows whose windows lie inside the input along the outer dims (most of them) read
        # without masks; GCC does not vectorise a loop with several loop-invariant masks.
        em.w(f"if ({inside}) {{")
        em.w.depth += 1
        em.rows_interior = True
        _column_ranges(em, step, root, root_idx, columns)
        em.rows_interior = False
        em.w.depth -= 1
        em.w("} else {")
        em.w.depth += 1
    _column_ranges(em, step, root, root_idx, columns)
    if inside is not None:
        em.w.depth -= 1
        em.w("}")
    em.w.depth -= 1
    em.w("}")
    return em


def _column_ranges(em: _Emitter, step: KernelStep, root: Node, idx: Idx, columns: list[tuple[str, str, bool]]) -> None:
    for first, end, interior in columns:
        em.window_interior = interior
        _simd_columns(em, step, root, idx, first, end)
    em.window_interior = False


def _simd_columns(em: _Emitter, step: KernelStep, root: Node, idx: Idx, first: str, end: str) -> None:
    """The vectorised innermost loop over ``j`` in [first, end), writing the group's outputs at ``idx``."""
    em.w("#pragma omp simd")
    em.w(f"for (int64_t j = {first}; j < {end}; ++j) {{")
    em.w.depth += 1
    em.scopes.append({})
    _write_outputs(em, step, root, idx)
    em.scopes.pop()
    em.w.depth -= 1
    em.w("}")


SHORT_ROW = 8  # a static innermost extent up to this is nested under the next dim (an NCHW -> NHWC image: 3)


def short_rows(step: KernelStep, names: SymbolNames) -> str | None:
    """The condition for the short-row version of a loop group, or None when it has none.

    A static innermost extent up to ``SHORT_ROW`` (an NCHW -> NHWC image has 3) makes rows so
    short that recovering the outer index per row (a division per dim) costs more than the row.
    The short-row version nests the rows under the next dim and parallelises the dims before it,
    so it runs when those hold a row of work for every thread.
    """
    root = step.group.nodes[-1]
    shape = root.shape
    if len(shape) < 3 or not isinstance(shape[-1], int) or shape[-1] > SHORT_ROW:
        return None
    if any(n.op in ("reduce", "reduce_window", "scatter_add") for n in step.group.nodes):
        return None
    return f"{c_product([names.expr(d) for d in shape[:-2]])} >= disc_threads()"


def _short_row_body(em: _Emitter, step: KernelStep, root: Node, shape: tuple[str, ...]) -> _Emitter:
    """Rows of the last two dims, parallel over the dims before them: the outer index is recovered
    once per ``mid * cols`` elements, not once per ``cols``."""
    em.w(f"const int64_t rows = {c_product(list(shape[:-2]))}, mid = {shape[-2]}, cols = {shape[-1]};")
    em.w(_parallel(em, "rows * mid * cols"))
    em.w("for (int64_t r = 0; r < rows; ++r) {")
    em.w.depth += 1
    outer = em.dims_of(Idx(shape[:-2], None, "r"))
    em.w("for (int64_t m = 0; m < mid; ++m) {")
    em.w.depth += 1
    _simd_columns(em, step, root, Idx(shape, (*outer, "m", "j"), "(r * mid + m) * cols + j"), "0", "cols")
    em.w.depth -= 1
    em.w("}")
    em.w.depth -= 1
    em.w("}")
    return em


def _window_attrs(n: Node) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[tuple[int, int], ...]]:
    """A reduce_window's window, strides, dilation and (low, high) padding per dim, defaults filled in."""
    rank = len(n.shape)
    return n.attrs["window"], n.attrs["strides"], n.attrs["dilation"] or (1,) * rank, n.attrs["padding"] or ((0, 0),) * rank


def _windows_at_root_index(em: _Emitter, root: Node) -> list[Node] | None:
    """The group's reduce_windows when each is read at the root's own index (a group of windowed
    reductions and elementwise ops, every window of the root's shape); else None."""
    windows = [n for n in em.step.group.nodes if n.op == "reduce_window"]
    for n in em.step.group.nodes:
        if n.op != "reduce_window" and not (n.op in UNARY or n.op in BINARY or n.op in ELEMENTWISE_OWN_FORMS):
            return None
    if not all(em.c.prove_same_shape(n.shape, root.shape) for n in windows):
        return None
    return windows


def _window_split(em: _Emitter, root: Node) -> tuple[str, str] | None:
    """The column range ``[lo, hi)`` in which every window of the group lies inside its input.

    Only for groups of windowed reductions and elementwise ops whose values all have
    the root's shape, so each reduce_window is read at the root's own index.
    """
    windows = _windows_at_root_index(em, root)
    if not windows:
        return None
    los, his = [], []
    for n in windows:
        d = len(n.shape) - 1
        window, strides, dilation, padding = _window_attrs(n)
        w, s, dil, lo = window[d], strides[d], dilation[d], padding[d][0]
        if (w, s, lo) == (1, 1, 0):
            continue
        # j * s - lo >= 0 and j * s + (w - 1) * dil - lo <= size - 1
        los.append(str(-(-lo // s)))
        his.append(f"disc_floordiv_i({em.dim(n.inputs[0].shape[d])} - 1 + {lo - (w - 1) * dil}, {s}) + 1")
    if not los:
        return None
    lo_expr = los[0] if len(los) == 1 else f"std::max<int64_t>({{{', '.join(los)}}})"
    hi_expr = his[0] if len(his) == 1 else f"std::min<int64_t>({{{', '.join(his)}}})"
    return lo_expr, hi_expr


def _window_rows(em: _Emitter, root: Node, outer: Sequence[str]) -> str | None:
    """The C++ test that every window of the group lies inside its input along the outer dims, at
    the row whose indices are ``outer``; None where no window pools an outer dim.

    Under the same conditions as ``_window_split``: each reduce_window is read at the root's index.
    """
    conds = []
    for n in _windows_at_root_index(em, root) or []:
        window, strides, dilation, padding = _window_attrs(n)
        for d in pooled_dims(window, strides, padding):
            if d == len(n.shape) - 1:
                continue
            start = f"{outer[d]} * {strides[d]} - {padding[d][0]}"
            if padding[d][0] > 0:
                conds.append(f"({start} >= 0)")
            conds.append(f"({start} + {(window[d] - 1) * dilation[d]} < {em.dim(n.inputs[0].shape[d])})")
    return " & ".join(conds) if conds else None


def _write_outputs(em: _Emitter, step: KernelStep, space: Node, idx: Idx, only: list[Node] | None = None) -> None:
    for i, out in enumerate(step.outputs):
        if only is not None and out not in only:
            continue
        source = output_source(out, em.members)  # out[k] = source[k]
        if em.c.prove_same_shape(out.shape, space.shape):
            at = idx
        elif source is not out and em.c.prove_same_shape(source.shape, space.shape):
            # Read the source at the space's own index, so row values (a LayerNorm's
            # statistics) are found at the row being computed rather than re-derived.
            em.w(f"out{i}[{em.linear_of(idx)}] = {_stored(out, em.value(source, idx))};")
            continue
        elif em.c.prove_same_numel(out.shape, space.shape):
            at = reshaped(em, idx, space.shape, out.shape)
        else:
            raise Unsupported(f"output %{out.name} {out.type} is not in the kernel's space {space.type}")
        v = em.value(out, at)
        em.w(f"out{i}[{em.linear_of(at)}] = {_stored(out, v)};")


# OpenMP reduction identifiers, for splitting a row across threads (every kind has one).
_OMP_REDUCTION = {"sum": "+", "prod": "*", "max": "max", "min": "min", "any": "||", "all": "&&"}


def _cacheable(n: Node, em: _Emitter) -> bool:
    """Is ``n`` computed by the kernel (not a plain load), so that keeping it in a row cache saves work?"""
    return n in em.members and (n.op in UNARY or n.op in BINARY or n.op in ("select", "reduce_window"))


def _reduction_body(step: KernelStep, names: SymbolNames, assume: bool, schedule: str = "recompute") -> _Emitter:
    """Rows x reduced elements; ``schedule`` is "recompute", "row-cached" or "split-row" (see the module doc)."""
    em = _Emitter(step, names, assume)
    reductions, domain, rdims = reduction_domain(step, em.c)
    shape = em.shape(domain)
    outer_axes = [k for k in range(len(shape)) if k not in rdims]
    trailing = list(rdims) == list(range(len(shape) - len(rdims), len(shape)))
    # Spelled from the dims themselves, not the hoisted locals: the schedule conditions
    # built from these are evaluated by the host, outside the kernel function.
    spelled = [names.expr(d) for d in domain.shape]
    em.rows = c_product([spelled[k] for k in outer_axes])
    em.cols = c_product([spelled[k] for k in rdims])
    split = schedule == "split-row"
    em.w(f"const int64_t rows = {em.rows}, cols = {em.cols};")
    if not split:
        em.w(_parallel(em, "rows * cols"))
    em.w("for (int64_t r = 0; r < rows; ++r) {")
    em.w.depth += 1
    outer = em.dims_of(Idx(tuple(shape[k] for k in outer_axes), None, "r"))
    row_of = {}
    for r in reductions:
        keep = r.attrs["keepdim"]
        dims, it = [], iter(outer)
        for k in range(len(shape)):
            if k in rdims:
                if keep:
                    dims.append("0")
            else:
                dims.append(next(it))
        row_of[r] = tuple(dims)

    # Several reduced dims are walked by nested loops, the last one vectorised: splitting
    # one flat j into their indices would cost integer divisions at every element.
    looped = [k for k in rdims if shape[k] != "1"]  # a 1-sized dim is read at 0 (as a delinearised j gives)
    nested = not split and len(looped) > 1

    def open_cols(pragma: str | None) -> Idx:
        """Open the loop(s) over the reduced elements of a row; the index of the element they are at."""
        if nested:
            loops = {k: em.fresh("k") for k in looped}
            for k in looped[:-1]:
                em.w(f"for (int64_t {loops[k]} = 0; {loops[k]} < {shape[k]}; ++{loops[k]}) {{")
                em.w.depth += 1
        if pragma:
            em.w(pragma)
        if nested:
            last = loops[looped[-1]]
            em.w(f"for (int64_t {last} = 0; {last} < {shape[looped[-1]]}; ++{last}) {{")
        else:
            em.w("for (int64_t j = 0; j < cols; ++j) {")
        em.w.depth += 1
        em.scopes.append({})
        if nested:
            inner = [loops.get(k, "0") for k in rdims]
            em.w(f"const int64_t j = {em.linear_of(Idx(tuple(shape[k] for k in rdims), tuple(inner)))};")
        else:
            inner = em.dims_of(Idx(tuple(shape[k] for k in rdims), None, "j"))
        dims, it_o, it_i = [], iter(outer), iter(inner)
        for k in range(len(shape)):
            dims.append(next(it_i) if k in rdims else next(it_o))
        idx = Idx(shape, tuple(dims), "r * cols + j" if trailing else None)
        em.pass_dims = idx.dims
        return idx

    def close_cols() -> None:
        em.scopes.pop()
        for _ in range(len(looped) if nested else 1):
            em.w.depth -= 1
            em.w("}")

    level = reduction_levels(step)
    last_level = max(level[r] for r in reductions)
    row_outputs = written_per_row(em.c, step.outputs, reductions, domain, em.members)
    full_outputs = [o for o in step.outputs if o not in row_outputs]
    # Row cache: each computed operand of a reduction that a later pass reads again.
    to_cache: dict[Node, str] = {}
    if schedule == "row-cached":
        size = em.cols if em.cols.isdigit() else str(ROW_CACHE_MAX)
        for r in reductions:
            x = r.inputs[0]
            later = [q.inputs[0] for q in reductions if level[q] > level[r]] + full_outputs
            if _cacheable(x, em) and x not in to_cache and len(to_cache) < ROW_CACHE_BUFFERS and reads(later, x, em.members):
                to_cache[x] = f"row{len(to_cache)}"
                em.w(f"alignas(64) {C_TYPES[x.dtype]} {to_cache[x]}[{size}];")
        if not to_cache:
            raise Unsupported("no reduction operand worth caching")  # the caller drops this version
    em.cached = list(to_cache)

    t_of = {r: C_TYPES[r.dtype] for r in reductions}
    for lvl in range(1, last_level + 1):
        batch = [r for r in reductions if level[r] == lvl]
        for r in batch:
            acc = em.fresh("acc")
            em.w(f"{t_of[r]} {acc} = {_reduce_init(r.attrs['kind'], r.dtype)};")
            em.accs[r] = (acc, row_of[r])
        # max/min vectorise as plain compare-selects plus a NaN flag: torch propagates NaN, the
        # hardware max does not, so a row that saw a NaN gets NaN after the loop.
        nan_flags = {r: em.fresh("nan") for r in batch if r.attrs["kind"] in ("max", "min") and r.dtype in FLOATS}
        for flag in nan_flags.values():
            em.w(f"int {flag} = 0;")  # an int, not a bool: a bool |-reduction vectorises 2.3x slower
        simd = [f"{SIMD_REDUCTION[r.attrs['kind']]}:{em.accs[r][0]}" for r in batch if r.attrs["kind"] in SIMD_REDUCTION]
        simd += [f"{r.attrs['kind']}:{em.accs[r][0]}" for r in nan_flags]
        simd += [f"|:{flag}" for flag in nan_flags.values()]
        vectorise = len(simd) == len(batch) + len(nan_flags)
        pragma = None
        if split:  # threads share the row: every accumulator needs a reduction clause
            clauses = [f"{_OMP_REDUCTION[r.attrs['kind']]}:{em.accs[r][0]}" for r in batch]
            clauses += [f"|:{flag}" for flag in nan_flags.values()]
            pragma = f"#pragma omp parallel for{' simd' if vectorise else ''} schedule(static) " + " ".join(f"reduction({c})" for c in clauses)
        elif vectorise:
            pragma = "#pragma omp simd " + " ".join(f"reduction({clause})" for clause in simd)
        idx = open_cols(pragma)
        pending = dict(em.accs)
        for r in batch:
            del em.accs[r]  # inside its own pass the reduction is not yet a value
        for r in batch:
            x = em.value(r.inputs[0], idx)
            if r.inputs[0] in to_cache and r.inputs[0] not in em.row_cache:
                em.w(f"{to_cache[r.inputs[0]]}[j] = {x};")
                em.row_cache[r.inputs[0]] = to_cache[r.inputs[0]]  # read back from the next pass on
            acc = pending[r][0]
            if r in nan_flags:
                cmp = ">" if r.attrs["kind"] == "max" else "<"
                em.w(f"{acc} = {x} {cmp} {acc} ? {x} : {acc};")
                em.w(f"{nan_flags[r]} |= {x} != {x};")
            else:
                em.w(REDUCE_STEP[r.attrs["kind"]].format(acc=acc, x=x) + ";")
        em.accs = pending
        close_cols()
        for r, flag in nan_flags.items():
            em.w(f"if ({flag}) {pending[r][0]} = std::numeric_limits<{t_of[r]}>::quiet_NaN();")
    for i, o in enumerate(step.outputs):
        if o in row_outputs:
            source = output_source(o, em.members)  # a reshaped row value (a bias gradient [1, n] -> [n])
            # Reductions of one group share their rows but may differ in keepdim: index
            # the row by a reduction of the source's own shape (or a unit-dim view of it).
            dims = reduced_index(em.c, source, reductions, row_of.__getitem__)
            if dims is None:
                raise Unsupported(f"output %{o.name} {o.type} is neither a row space {reductions[0].type} nor the reduced space")
            at = Idx(em.shape(source), dims)
            v = em.value(source, at)
            em.w(f"out{i}[{em.linear_of(at)}] = {_stored(o, v)};")
    if full_outputs:
        idx = open_cols("#pragma omp parallel for simd schedule(static)" if split else "#pragma omp simd")
        _write_outputs(em, step, domain, idx, full_outputs)
        close_cols()
    em.w.depth -= 1
    em.w("}")
    return em


def _column_body(step: KernelStep, names: SymbolNames, assume: bool, outer: int, lead: int) -> _Emitter:
    """Reductions over ``lead`` dims after ``outer`` kept ones (a bias gradient, BatchNorm's
    statistics, an NHWC spatial mean): rows in memory order, one outer index at a time.

    Each thread owns a contiguous block of reduced rows and accumulates every
    kept element of them into its own partial row (no atomics); the partials
    are then combined in thread order (deterministic for a given thread
    count). One such walk per reduction level: a later level (the variance
    around a mean) reads the earlier ones' combined rows at its kept index.
    Full-size outputs are written in the first walk when they read no
    reduction (every element computed once), else in a last walk of their
    own. The row schedules would read such a space column by column.
    """
    em = _Emitter(step, names, assume)
    reductions = [n for n in step.group.nodes if n.op == "reduce"]
    domain = reductions[0].inputs[0]
    shape = em.shape(domain)
    spelled = [names.expr(d) for d in domain.shape]
    em.rows = c_product(spelled[outer : outer + lead])
    em.cols = c_product(spelled[outer + lead :])
    em.column_kept = len(shape) - outer - lead
    em.w(f"const int64_t rows = {em.rows}, cols = {em.cols};")
    em.w(f"const int64_t nt = std::min<int64_t>(disc_team(rows * cols, {_grain(step)}), std::max<int64_t>(rows, 1));")
    outer_dims: tuple[str, ...] = ()
    if outer:  # the rest of the kernel runs once per outer index o
        em.w(f"for (int64_t o = 0; o < {c_product(spelled[:outer])}; ++o) {{")
        em.w.depth += 1
        em.scopes.append({})
        outer_dims = tuple(em.dims_of(Idx(shape[:outer], None, "o")))
    at_row = "(o * rows + r) * cols + j" if outer else "r * cols + j"
    row_outputs = written_per_row(em.c, step.outputs, reductions, domain, em.members)
    full_outputs = [o for o in step.outputs if o not in row_outputs]
    level = reduction_levels(step)
    late = any(reads(full_outputs, r, em.members) for r in reductions)

    def walk(body) -> None:  # rows of this thread's block, kept elements innermost
        em.w("#pragma omp parallel for schedule(static) if(nt > 1) num_threads(nt)")
        em.w("for (int64_t t = 0; t < nt; ++t) {")
        em.w.depth += 1
        em.scopes.append({})
        body(start=True)
        em.w("for (int64_t r = rows * t / nt; r < rows * (t + 1) / nt; ++r) {")
        em.w.depth += 1
        reduced = em.dims_of(Idx(shape[outer : outer + lead], None, "r"))
        em.w("#pragma omp simd")
        em.w("for (int64_t j = 0; j < cols; ++j) {")
        em.w.depth += 1
        em.scopes.append({})
        inner = em.dims_of(Idx(shape[outer + lead :], None, "j"))
        em.column_inner = tuple(inner)
        body(idx=Idx(shape, outer_dims + tuple(reduced) + tuple(inner), at_row))
        em.scopes.pop()
        for _ in range(2):
            em.w.depth -= 1
            em.w("}")
        em.scopes.pop()
        em.w.depth -= 1
        em.w("}")

    for lvl in range(1, max(level[r] for r in reductions) + 1):
        batch = [r for r in reductions if level[r] == lvl]
        parts: dict[Node, str] = {}
        for r in batch:
            t, init = C_TYPES[r.dtype], _reduce_init(r.attrs["kind"], r.dtype)
            parts[r] = em.fresh("part")
            em.w(f"std::unique_ptr<{t}[]> {parts[r]}(new {t}[nt * cols]);")
            em.w(f"std::fill({parts[r]}.get(), {parts[r]}.get() + nt * cols, {t}({init}));")

        def accumulate(start: bool = False, idx: Idx | None = None, batch=batch, parts=parts, first=lvl == 1) -> None:
            for r in batch:
                if start:
                    em.w(f"{C_TYPES[r.dtype]}* __restrict__ {parts[r]}_t = {parts[r]}.get() + t * cols;")
                else:
                    x = em.value(r.inputs[0], idx)
                    em.w(REDUCE_STEP[r.attrs["kind"]].format(acc=f"{parts[r]}_t[j]", x=x) + ";")
            if idx is not None and first and not late:
                _write_outputs(em, step, domain, idx, full_outputs)

        walk(accumulate)
        # Combine the partial rows into the first one, which then holds the reduction: partial
        # by partial, so the loop over the row is innermost and vectorises (same order of sums).
        em.w("for (int64_t t = 1; t < nt; ++t) {")
        em.w.depth += 1
        for r in batch:  # restrict pointers: through the unique_ptr GCC reloads the base every element
            ctype = C_TYPES[r.dtype]
            em.w(f"{ctype}* __restrict__ {parts[r]}_0 = {parts[r]}.get();")
            em.w(f"const {ctype}* __restrict__ {parts[r]}_t = {parts[r]}.get() + t * cols;")
        em.w(_parallel(em, "cols * nt", simd=True))
        em.w("for (int64_t j = 0; j < cols; ++j) {")
        em.w.depth += 1
        for r in batch:
            em.w(REDUCE_STEP[r.attrs["kind"]].format(acc=f"{parts[r]}_0[j]", x=f"{parts[r]}_t[j]") + ";")
        for _ in range(2):
            em.w.depth -= 1
            em.w("}")
        for r in batch:
            em.columns[r] = f"{parts[r]}.get()"

    if late:

        def write(start: bool = False, idx: Idx | None = None) -> None:
            if idx is not None:
                _write_outputs(em, step, domain, idx, full_outputs)

        walk(write)
    if row_outputs:
        em.w(_parallel(em, "cols"))
        em.w("for (int64_t j = 0; j < cols; ++j) {")
        em.w.depth += 1
        em.scopes.append({})
        inner = em.dims_of(Idx(shape[outer + lead :], None, "j"))
        em.column_inner = tuple(inner)
        for i, out in enumerate(step.outputs):
            if out not in row_outputs:
                continue
            source = output_source(out, em.members)
            dims = reduced_index(em.c, source, reductions, lambda r: outer_dims + (("0",) * lead if r.attrs["keepdim"] else ()) + tuple(inner))
            if dims is None:
                raise Unsupported(f"output %{out.name} {out.type} is neither a reduced space nor the full space {domain.type}")
            at = Idx(em.shape(source), dims)
            em.w(f"out{i}[{em.linear_of(at)}] = {_stored(out, em.value(source, at))};")
        em.scopes.pop()
        em.w.depth -= 1
        em.w("}")
    if outer:
        em.scopes.pop()
        em.w.depth -= 1
        em.w("}")
    return em


SCATTER_BLOCK = 16  # columns one thread owns in a scatter: distinct columns never collide


def _scatter_body(step: KernelStep, names: SymbolNames) -> _Emitter:
    """``scatter_add``: copy ``x``, then add each ``src`` element at the row its index names.

    Written push-style (each source element adds into the output), unlike the
    other kernels, which compute an output element from its operands. Threads
    own blocks of the dims after the axis, and of those before it: two
    elements there never add into the same output element, so no atomics are
    needed; the axis itself is walked in order, so the sum order is fixed and
    results are reproducible. An index outside the output (which PyTorch
    reports as an error) adds nothing rather than writing out of bounds.
    """
    em = _Emitter(step, names, False)
    n = step.group.root  # after the cheap operands it recomputes
    if n.dtype in NARROW:  # its adds accumulate in the output's buffer, which would round each one
        raise Unsupported(f"scatter_add %{n.name} in {n.dtype}: no 16-bit C++ form", [n])
    x, index, src = n.inputs
    rank = len(n.shape)
    axis = n.attrs["axis"] % rank
    out_shape, it_shape = em.shape(n), em.shape(index)
    em.w(f"const int64_t n = {c_product(list(out_shape))};")
    em.w(_parallel(em, "n"))
    em.w("for (int64_t i = 0; i < n; ++i) {")
    em.w.depth += 1
    em.scopes.append({})
    em.w(f"out0[i] = {em.value(x, Idx(out_shape, None, 'i'))};")
    em.scopes.pop()
    em.w.depth -= 1
    em.w("}")
    outer, inner = list(it_shape[:axis]), list(it_shape[axis + 1 :])
    em.w(f"const int64_t outer = {c_product(outer)}, len = {it_shape[axis]}, inner = {c_product(inner)};")
    em.w(f"const int64_t blocks = (inner + {SCATTER_BLOCK - 1}) / {SCATTER_BLOCK};")
    em.w(_parallel(em, "outer * len * inner"))
    em.w("for (int64_t t = 0; t < outer * blocks; ++t) {")
    em.w.depth += 1
    em.w(f"const int64_t o = t / blocks, j0 = (t % blocks) * {SCATTER_BLOCK};")
    em.w(f"const int64_t j1 = std::min<int64_t>(j0 + {SCATTER_BLOCK}, inner);")
    outer_dims = em.dims_of(Idx(tuple(outer), None, "o")) if outer else ()
    em.w("for (int64_t k = 0; k < len; ++k) {")
    em.w.depth += 1
    em.w("for (int64_t j = j0; j < j1; ++j) {")
    em.w.depth += 1
    em.scopes.append({})
    inner_dims = em.dims_of(Idx(tuple(inner), None, "j")) if inner else ()
    dims = (*outer_dims, "k", *inner_dims)
    g = em.value(index, Idx(it_shape, dims))
    v = em.value(src, em._operand_idx(src, list(dims)))
    size = em.dim(n.shape[axis])
    row = em.let("int64_t", f"{g} < 0 ? {g} + {size} : int64_t({g})", "g")
    target = list(dims)
    target[axis] = row
    at = em.linear_of(Idx(out_shape, tuple(target)))
    em.w(f"if (static_cast<uint64_t>({row}) < static_cast<uint64_t>({size})) out0[{at}] += {v};")
    em.scopes.pop()
    for _ in range(3):
        em.w.depth -= 1
        em.w("}")
    return em


def _versions(step: KernelStep, names: SymbolNames) -> list[tuple[str, str, _Emitter]]:
    """The speculation versions of a group: (label, C++ condition, body), the last always "true"."""
    if step.group.root.op == "scatter_add":
        return [("general", "true", _scatter_body(step, names))]
    has_reduce = any(n.op == "reduce" for n in step.group.nodes)

    outer, lead = column_space(step, names.c, passes=True) if has_reduce else (0, 0)

    def body(assume: bool, schedule: str = "recompute") -> _Emitter:
        if lead:
            return _column_body(step, names, assume, outer, lead)
        if has_reduce:
            return _reduction_body(step, names, assume, schedule)
        em = _loop_body(step, names, assume, nested=False)
        return _loop_body(step, names, assume, nested=True) if em.delinearized else em

    general = body(False)
    versions: list[tuple[str, str, _Emitter]] = []  # (label, C++ condition, body)
    no_broadcast = " && ".join(sorted(_no_broadcast_conditions(step, names))) if general.maybe_broadcast else ""
    if has_reduce and not lead:
        for schedule in ("row-cached", "split-row"):
            try:
                em = body(bool(no_broadcast), schedule)
            except Unsupported:
                continue  # e.g. nothing worth caching
            cond = _schedule_condition(schedule, em.rows, em.cols)
            if cond is not None:
                label = f"no-broadcast {schedule}" if no_broadcast else schedule
                versions.append((label, _conj(no_broadcast, cond), em))
    # Only where the general version divides to find indices: a flat elementwise loop is already best.
    short = short_rows(step, names) if general.delinearized else None
    if short is not None:
        if no_broadcast:
            versions.append(("no-broadcast short-rows", _conj(no_broadcast, short), _loop_body(step, names, True, True, short=True)))
        versions.append(("short-rows", short, _loop_body(step, names, False, True, short=True)))
    if no_broadcast:
        versions.append(("no-broadcast", no_broadcast, body(True)))
    versions.append(("column" if lead else "general", "true", general))
    kept: list[tuple[str, str, _Emitter]] = []
    for version in versions:  # drop versions an earlier one always pre-empts
        if version[1] not in {v[1] for v in kept}:
            kept.append(version)
        if version[1] == "true":
            break
    return kept


def emit_kernel(step: KernelStep, names: SymbolNames, name: str) -> KernelSource:
    """The C++ of one fused group, with its speculation versions."""
    versions = _versions(step, names)
    header = f"// {step.kind} kernel fusing: " + ", ".join(n.op for n in step.group.nodes)
    sig = _signature(name, step)
    source = KernelSource(name, "", [v[0] for v in versions], [v[1] for v in versions], _params(step))
    parts = [header]
    for k, (label, cond, em) in enumerate(versions):
        if len(versions) > 1:
            cached = f"; row cache holds the {', '.join(n.op for n in em.cached)} values" if em.cached else ""
            parts.append(f"// version {label}: when {cond}{cached}")
        parts += [sig.replace(name, source.function(k)) + " {", *em.prologue(), *em.w.lines, "}"]
        source.declarations.append(sig.replace(name, source.function(k)) + ";")
    source.text = "\n".join(parts)
    return source


def _schedule_condition(schedule: str, rows: str, cols: str) -> str | None:
    """When a reduction schedule may run, as C++; None when it never can (a static row length rules it out)."""
    static = int(cols) if cols.isdigit() else None
    if schedule == "row-cached":
        if static is not None:
            return "true" if static <= ROW_CACHE_MAX else None
        return f"{_atomic(cols)} <= {ROW_CACHE_MAX}"
    if static is not None and static < SPLIT_ROW_MIN:
        return None
    long_rows = "" if static is not None else f"{_atomic(cols)} >= {SPLIT_ROW_MIN}"
    return _conj(f"{_atomic(rows)} < disc_threads()", long_rows)



def _conj(*conds: str) -> str:
    parts = [c for c in conds if c and c != "true"]
    return " && ".join(f"({c})" if "||" in c else c for c in parts) or "true"


def _no_broadcast_conditions(step: KernelStep, names: SymbolNames) -> set[str]:
    return {f"{names.expr(src)} == {names.expr(dst)}" for src, dst in runtime_broadcasts(step, names.c)}


def _params(step: KernelStep) -> list[Node]:
    seen = set(step.outputs)
    return list(step.outputs) + [n for n in step.inputs if n not in seen]
