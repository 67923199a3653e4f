"""One Triton kernel per fused group: loop, input (reduction) and stitch kernels.

The GPU counterpart of ``codegen/cpu/kernel.py``, over the same lowered
steps: a kernel computes each value it needs *at an index*, walking from the
group's outputs back to the buffers it reads, but an index here is a block
of positions (Triton tensors of int64), so every value is a block and every
load is masked. Dims are kernel arguments computed by the host (each
distinct dim expression the kernel uses is one ``d<k>`` argument), so one
kernel serves every shape; structurally identical groups print the same
text and share one kernel.

Schedules (a kernel's *versions*; the host picks one per call from the
actual dims, the last always applies):

- loop: a 1-D grid over the elements, ``BLOCK`` of them per program; a
  ``small`` launch (fewer, narrower programs) for tiny work;
- row reductions (input and stitch groups; LayerNorm, softmax): ``block-row``
  holds ``BLOCK_M`` whole rows in registers (``BLOCK_N`` >= the row length),
  so every pass reuses the loaded and computed row: the stitch through
  registers; ``loop-row`` gives a program one row and loops over it in
  chunks, once per dependent reduction and once to write, recomputing
  operands (any row length);
- column reductions (over leading dims: bias gradients): a program owns a
  block of kept elements and walks the reduced rows in memory order;
- broadcast speculation as on the CPU: where a dim may or may not be 1, a
  ``no-broadcast`` version reads operands at the output's own index.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from disc.codegen.groups import (
    leading_reduction,
    output_source,
    reduced_index,
    reduction_domain,
    reduction_levels,
    runtime_broadcasts,
    written_per_row,
)
from disc.codegen.index import Idx, IndexEmitter, reshaped
from disc.codegen.lowering import ELEMENTWISE_OWN_FORMS, KernelStep, Unsupported
from disc.codegen.triton.ops import REDUCE_COMBINE, TL_STORAGE, TL_TYPES, binary, literal, reduce_init, unary
from disc.ir.graph import Node
from disc.ir.ops.nn import pooled_dims
from disc.ir.ops.random import site_offset
from disc.ir.registry import ELEMENTWISE, get_spec
from disc.shape.constraints import ShapeConstraints
from disc.shape.expr import DimLike, SymExpr, as_expr

LOOP_BLOCK = 1024  # elements per program of a loop kernel
SMALL_WORK = 16384  # below this, the ``small`` launch (BLOCK 128, one warp)
ROW_BLOCK_MAX = 4096  # longest row a ``block-row`` reduction holds in registers
ROW_TILE = 4096  # elements of a block-row tile: BLOCK_M = ROW_TILE // BLOCK_N rows per program
MIN_ROW_BLOCK = 16  # narrowest block-row tile: shorter rows are masked (fewer compiled forms)
LOOP_ROW_BLOCK = 1024  # chunk of a ``loop-row`` reduction
COLUMN_BLOCK = (32, 64)  # (rows, kept elements) of a column-reduction tile
WINDOW_UNROLL_MAX = 256  # pooling windows are unrolled; larger ones are not generated


@dataclass
class Version:
    label: str
    condition: str  # Python over the kernel's dim arguments (d0, d1, ...), evaluated by the host
    function: str  # the @triton.jit function's name
    grid: str  # Python: the number of programs
    constexprs: dict[str, str]  # constexpr name -> Python value expression
    num_warps: int = 4
    # Every value the constexprs can take, so each compiled form is built with the model, not at a call.
    choices: list[dict[str, int]] = field(default_factory=list)


@dataclass
class TritonKernel:
    name: str
    text: str  # the @triton.jit functions, one per distinct body
    versions: list[Version]
    params: list[Node] = field(default_factory=list)  # buffers in parameter order: outputs, then inputs
    dims: list[SymExpr] = field(default_factory=list)  # the dim arguments d0, d1, ... in order


class DimArgs:
    """The dims one kernel uses, each a ``d<k>`` argument; the host passes their values."""

    def __init__(self, c: ShapeConstraints) -> None:
        self.c = c
        self.exprs: list[SymExpr] = []
        self.names: dict[SymExpr, str] = {}

    def __call__(self, d: DimLike) -> str:
        e = self.c.normalize(as_expr(d))
        if e.is_const:
            return str(e.const_value)
        if e not in self.names:
            self.names[e] = f"d{len(self.exprs)}"
            self.exprs.append(e)
        return self.names[e]

    def product(self, dims: list[DimLike]) -> str:
        """One argument for the product of ``dims`` (never multiplied in the kernel: 32-bit arguments could overflow)."""
        p = SymExpr.const(1)
        for d in dims:
            p = p * as_expr(d)
        return self(p)


class _Writer:
    def __init__(self, depth: int = 1) -> None:
        self.lines: list[str] = []
        self.depth = depth

    def __call__(self, line: str) -> None:
        self.lines.append("    " * self.depth + line)


_NAME = re.compile(r"[A-Za-z_]\w*")


def _is_literal(expr: str) -> bool:
    return expr.lstrip("-").replace(".", "", 1).replace("e-", "").replace("e+", "").isdigit() or expr.startswith("float(")


class _Emitter(IndexEmitter):
    """Emits the statements computing values of one group at blocks of indices."""

    def __init__(self, step: KernelStep, dims: DimArgs, assume_no_broadcast: bool) -> None:
        self.step = step
        self.d = dims
        self.c = dims.c
        self.members = set(step.group.nodes)
        self.buffers: dict[Node, str] = {}
        for i, n in enumerate(step.outputs):
            self.buffers[n] = f"out{i}"
        k = 0
        for n in step.inputs:
            if n not in self.buffers:
                self.buffers[n] = f"in{k}"
                k += 1
        self.w = _Writer()
        self.scopes: list[dict] = [{}]
        self.masks: list[str] = ["mask"]
        self.counter = 0
        self.assume_no_broadcast = assume_no_broadcast
        self.maybe_broadcast = False
        self.accs: dict[Node, tuple[str, tuple[str, ...]]] = {}  # reduce node -> (variable, row index it holds)
        self.uniform: set[str] = set()  # scalar loop variables: one value for every lane of the block
        # The block axes each variable spans ("x": a loop kernel's lanes; "m", "n": a 2-D tile's
        # rows and columns); a name not here is a scalar. Triton wants a load's or store's pointer
        # to span its mask's axes, which an index constant along one of them does not.
        self.axes: dict[str, frozenset[str]] = {}

    # -- small helpers ----------------------------------------------------------------
    def dim(self, d: DimLike) -> str:
        return self.d(d)

    def broadcast_index(self, size: str, index: str) -> str:
        return self.let(f"tl.where({size} == 1, 0, {index})", "b")

    def fresh(self, prefix: str = "v") -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def let(self, expr: str, prefix: str = "v") -> str:
        if expr.isidentifier() or _is_literal(expr):
            return expr
        name = self.fresh(prefix)
        self.define(name, expr)
        return name

    def define(self, name: str, expr: str, axes: Iterable[str] | None = None) -> None:
        """``name = expr``, spanning ``axes`` (by default those of the variables ``expr`` reads)."""
        self.w(f"{name} = {expr}")
        self.axes[name] = frozenset(axes) if axes is not None else self.axes_of(expr)

    def axes_of(self, expr: str) -> frozenset[str]:
        out: frozenset[str] = frozenset()
        for name in _NAME.findall(expr):
            out |= self.axes.get(name, frozenset())
        return out

    def address(self, buffer: str, linear: str) -> str:
        """The pointer to ``buffer`` at ``linear`` under the current mask, spanning the mask's axes:
        an index the same for every lane, or for every column of a row, is broadcast (masked-off
        lanes point at element 0, which they never touch)."""
        mask = self.masks[-1]
        if self.axes_of(mask) <= self.axes_of(linear):
            return f"{buffer} + {linear}"
        return f"{buffer} + tl.where({mask}, {linear}, 0)"

    def push(self, mask: str | None = None) -> None:
        self.scopes.append({})
        self.masks.append(mask or self.masks[-1])

    def pop(self) -> None:
        self.scopes.pop()
        self.masks.pop()

    def dims_of(self, idx: Idx) -> tuple[str, ...]:
        if idx.dims is None:
            key = ("delin", idx.shape, idx.linear)
            got = self.memo_get(key)
            if got is None:
                rest = idx.linear
                out = []
                for k in range(len(idx.shape) - 1, -1, -1):
                    size = idx.shape[k]
                    if size == "1":
                        out.append("0")
                    elif k == 0:
                        out.append(rest)
                    else:
                        out.append(self.let(f"{rest} % {size}", "i"))
                        rest = self.let(f"{rest} // {size}", "q")
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
                    expr = f"({expr}) * {size} + {i}"
            idx.linear = self.let(expr, "l")
        return idx.linear

    def load(self, n: Node, idx: Idx) -> str:
        lin = self.linear_of(idx)
        if _is_literal(lin) or lin in self.uniform:  # one element for every lane: a scalar load
            loaded = f"tl.load({self.buffers[n]} + {lin})"
        else:
            loaded = f"tl.load({self.address(self.buffers[n], lin)}, mask={self.masks[-1]}, other=0)"
        return f"{loaded}.to(tl.float32)" if n.dtype in TL_STORAGE else loaded

    def store(self, buffer: str, out: Node, linear: str, value: str) -> None:
        """``value`` (computed in ``out``'s compute type) stored into ``out``'s dtype."""
        if out.dtype in TL_STORAGE:
            value = TL_STORAGE[out.dtype].format(_cast(value, "tl.float32"))
        self.w(f"tl.store({self.address(buffer, linear)}, {value}, mask={self.masks[-1]})")

    # -- values -------------------------------------------------------------------------
    def value(self, n: Node, idx: Idx) -> str:
        if n.is_literal:
            return literal(n.attrs["value"], n.dtype)
        key = (n, idx.dims, idx.linear)
        got = self.memo_get(key)
        if got is not None:
            return got
        if n not in self.members:
            if n not in self.buffers:
                raise Unsupported(f"%{n.name} is read by a kernel but has no buffer")
            expr = self.load(n, idx)
        else:
            expr = self._compute(n, idx)
        name = self.let(expr)
        self.scopes[-1][key] = name
        return name

    def _compute(self, n: Node, idx: Idx) -> str:
        op = n.op
        if get_spec(op).category == ELEMENTWISE and op not in ELEMENTWISE_OWN_FORMS:
            operand_dtype = n.inputs[0].dtype
            form = unary(op, operand_dtype) if len(n.inputs) == 1 else binary(op, operand_dtype)
            if form is None:
                raise Unsupported(f"no Triton form for elementwise op {op} on {operand_dtype}", [n])
            return form.format(*(self.value(x, idx) for x in n.inputs))
        if op == "select":
            p, a, b = (self.value(x, idx) for x in n.inputs)
            return f"tl.where({p}, {a}, {b})"
        if op == "bitcast":
            return _bitcast(self.value(n.inputs[0], idx), n.inputs[0].dtype, n.dtype)
        if op == "convert":
            x = self.value(n.inputs[0], idx)
            if n.dtype == "i1":
                return f"({x} != 0)"
            if n.dtype in TL_STORAGE:  # rounded to 16 bits where the program says so, then computed on in f32
                return f"{TL_STORAGE[n.dtype].format(_cast(x, 'tl.float32'))}.to(tl.float32)"
            return _cast(x, TL_TYPES[n.dtype])
        handler = getattr(self, f"_op_{op}", None)
        if handler is None:
            raise Unsupported(f"no Triton kernel form for op {op} (%{n.name})", [n])
        return handler(n, idx)

    def _op_reshape(self, n: Node, idx: Idx) -> str:
        x = n.inputs[0]
        if idx.dims is None:
            return self.value(x, Idx(self.shape(x), None, self.linear_of(idx)))
        return self.value(x, reshaped(self, idx, n.shape, x.shape))

    def _op_iota(self, n: Node, idx: Idx) -> str:
        return _cast(self.dims_of(idx)[0], TL_TYPES[n.dtype])  # a size-1 iota's index is the literal 0

    def _op_index_to_tensor(self, n: Node, idx: Idx) -> str:
        value = self.dim(n.inputs[0].type.value)
        return f"tl.full([], {value}, {TL_TYPES[n.dtype]})"

    def _op_random_uniform(self, n: Node, idx: Idx) -> str:
        seed = self.value(n.inputs[0], Idx(("1",), ("0",)))
        site = site_offset(n.attrs["site"])
        site_arg = f"tl.full([], {site}, tl.uint64)" if site < (1 << 63) else f"tl.full([], {site - (1 << 64)}, tl.int64).to(tl.uint64, bitcast=True)"
        return f"disc_uniform({seed}, {site_arg}, {self.linear_of(idx)})"

    def _op_slice(self, n: Node, idx: Idx) -> str:
        x, start, _ = n.inputs
        axis, step = n.attrs["axis"], n.attrs["step"]
        dims = list(self.dims_of(idx))
        step_part = dims[axis] if step == 1 else f"{dims[axis]} * {step}"
        dims[axis] = self.let(f"{self._index_scalar(start)} + {step_part}", "s")
        return self.value(x, self._operand_idx(x, dims))

    def _gathered(self, n: Node, dims: list[str], axis: int, i: str) -> str:
        """``x`` at ``dims`` with the ``axis`` index taken from ``i`` (negative counts from the end
        under ``wrap_negative``; out of range reads nothing: the GPU program reports no IndexError yet)."""
        x = n.inputs[0]
        size = self.dim(x.shape[axis])
        g = self.let(f"tl.where({i} < 0, {i} + {size}, {i})", "g") if n.attrs["wrap_negative"] else i
        dims[axis] = g
        self.push(self.let(f"{self.masks[-1]} & ({g} >= 0) & ({g} < {size})", "m"))
        v = self.value(x, self._operand_idx(x, dims))
        self.pop()
        return v

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

    def _op_concat(self, n: Node, idx: Idx) -> str:
        axis = n.attrs["axis"] % len(n.shape)
        dims = self.dims_of(idx)
        cases: list[tuple[str, str]] = []
        offset = "0"
        for x in n.inputs:
            size = self.dim(x.shape[axis])
            end = size if offset == "0" else self.let(f"{offset} + {size}", "e")
            local = list(dims)
            local[axis] = dims[axis] if offset == "0" else self.let(f"{dims[axis]} - {offset}", "c")
            inside = self.let(f"({dims[axis]} >= {offset}) & ({dims[axis]} < {end})", "c")
            self.push(self.let(f"{self.masks[-1]} & {inside}", "m"))
            cases.append((inside, self.value(x, self._operand_idx(x, local))))
            self.pop()
            offset = end
        expr = cases[-1][1]
        for cond, v in reversed(cases[:-1]):
            expr = f"tl.where({cond}, {v}, {expr})"
        return expr

    def _op_pad(self, n: Node, idx: Idx) -> str:
        x = n.inputs[0]
        dims = self.dims_of(idx)
        local, conds = [], []
        for k, lo in enumerate(n.attrs["low"]):
            i = dims[k] if lo == 0 else self.let(f"{dims[k]} - {lo}", "p")
            local.append(i)
            if lo > 0:
                conds.append(f"({i} >= 0)")
            if n.attrs["high"][k] > 0 or lo > 0:
                conds.append(f"({i} < {self.dim(x.shape[k])})")
        if not conds:
            return self.value(x, self._operand_idx(x, local))
        inside = self.let(" & ".join(conds), "c")
        self.push(self.let(f"{self.masks[-1]} & {inside}", "m"))
        v = self.value(x, self._operand_idx(x, local))
        self.pop()
        return f"tl.where({inside}, {v}, {literal(n.attrs['value'], n.dtype)})"

    def _op_reduce_window(self, n: Node, idx: Idx) -> str:
        x = n.inputs[0]
        kind = n.attrs["kind"]
        rank = len(n.shape)
        window, strides = n.attrs["window"], n.attrs["strides"]
        dilation = n.attrs["dilation"] or (1,) * rank
        padding = n.attrs["padding"] or ((0, 0),) * rank
        windowed = pooled_dims(window, strides, padding)
        positions = [[]]
        for d in windowed:
            positions = [p + [k] for p in positions for k in range(window[d])]
        if len(positions) > WINDOW_UNROLL_MAX:
            raise Unsupported(f"reduce_window of {len(positions)} positions (at most {WINDOW_UNROLL_MAX} are unrolled)")
        out = self.dims_of(idx)
        init = reduce_init("max" if kind == "argmax" else kind, x.dtype)
        acc = at = None
        for combo in positions:
            local, conds = list(out), []
            for d, k in zip(windowed, combo):
                pos = self.let(f"{out[d]} * {strides[d]} + {k * dilation[d] - padding[d][0]}", "p")
                local[d] = pos
                if padding[d] != (0, 0):
                    conds.append(f"({pos} >= 0) & ({pos} < {self.dim(x.shape[d])})")
            inside = " & ".join(conds) if conds else None
            self.push(self.let(f"{self.masks[-1]} & {inside}", "m") if inside else None)
            v = self.value(x, self._operand_idx(x, local))
            self.pop()
            if kind == "argmax":
                acc, at = self._argmax_step(n, local, v, inside, acc, at)
                continue
            if inside:
                v = self.let(f"tl.where({inside}, {v}, {init})")
            acc = v if acc is None else self.let(f"disc_max({acc}, {v})" if kind == "max" else f"{acc} + {v}", "w")
        if kind == "argmax":
            return at
        return acc or init

    def _argmax_step(self, n: Node, local: list[str], v: str, inside: str | None, best: str | None, at: str | None) -> tuple[str, str]:
        """One window position of max-pool's index rule: take the first in-bounds element, then any larger one or NaN."""
        x = n.inputs[0]
        flat = ""
        for d in n.attrs["index_dims"]:
            flat = f"({flat}) * {self.dim(x.shape[d])} + {local[d]}" if flat else local[d]
        if best is None:  # the first position: taken wherever it is in bounds
            if inside is None:
                return v, self.let(f"{flat} + tl.zeros_like({v}).to(tl.int64)", "a")
            init = reduce_init("max", x.dtype)
            return self.let(f"tl.where({inside}, {v}, {init})", "w"), self.let(f"tl.where({inside}, {flat}, -1)", "a")
        nan = f" | ({v} != {v})" if x.dtype in ("f16", "bf16", "f32", "f64") else ""
        better = f"({v} > {best}){nan} | ({at} < 0)"
        take = self.let(f"({inside}) & ({better})" if inside else better, "t")
        return self.let(f"tl.where({take}, {v}, {best})", "w"), self.let(f"tl.where({take}, {flat}, {at})", "a")

    def _op_reduce(self, n: Node, idx: Idx) -> str:
        if n not in self.accs:
            raise Unsupported(f"reduction %{n.name} used outside its pass")
        var, row = self.accs[n]
        if self.dims_of(idx) != row:
            raise Unsupported(f"reduction %{n.name} is read at another row than the one being computed")
        return var


# -- schedules ------------------------------------------------------------------------------
def _write_outputs(em: _Emitter, step: KernelStep, space: Node, idx: Idx, only: list[Node] | None = None) -> None:
    for i, out in enumerate(step.outputs):
        if only is not None and out not in only:
            continue
        source = output_source(out, em.members)
        if em.c.prove_same_shape(out.shape, space.shape):
            at = idx
            v = em.value(out, at)
        elif source is not out and em.c.prove_same_shape(source.shape, space.shape):
            at = idx
            v = em.value(source, idx)
        elif em.c.prove_same_numel(out.shape, space.shape):
            # The space's index regrouped as the output's (a row keeps its index through [1, h, s, s]
            # -> [h, s, s], so a reduction under it is read at the row being computed)
            at = reshaped(em, idx, space.shape, out.shape) if idx.dims is not None else Idx(em.shape(out), None, em.linear_of(idx))
            v = em.value(out, at)
        else:
            raise Unsupported(f"output %{out.name} {out.type} is not in the kernel's space {space.type}")
        em.store(f"out{i}", out, em.linear_of(at), v)


def _loop_body(step: KernelStep, dims: DimArgs, assume: bool) -> tuple[_Emitter, str]:
    em = _Emitter(step, dims, assume)
    root = step.group.nodes[-1]
    n = dims.product(list(root.shape))
    em.define("offs", "tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)", "x")
    em.define("mask", f"offs < {n}")
    _write_outputs(em, step, root, Idx(em.shape(root), None, "offs"))
    return em, n


def _combine_tile(kind: str, dtype: str, x: str, axis: int) -> str:
    """``x`` (a tile whose masked positions hold the identity; int32 for bools, see ``_masked``)
    reduced along ``axis``, keeping the dim."""
    if kind == "sum":
        return f"tl.sum({x}, axis={axis}, keep_dims=True)"
    out = f"tl.reduce({x}, {axis}, {REDUCE_COMBINE[kind]}, keep_dims=True)"
    return f"({out} != 0)" if dtype == "i1" else out


def _reduced(em: _Emitter, r: Node, tile: str, axis: int) -> str:
    """``tile`` combined along ``axis`` into a variable: it spans the tile's axes but that one."""
    name = em.fresh("red")
    em.define(name, _combine_tile(r.attrs["kind"], r.dtype, tile, axis), em.axes_of(tile) - {"mn"[axis]})
    return name


def _masked(em: _Emitter, r: Node, x: str) -> str:
    """``x`` as the reduction's dtype with positions outside the mask set to the identity."""
    if r.inputs[0].dtype != r.dtype:
        x = _cast(x, TL_TYPES[r.dtype])
    init = reduce_init(r.attrs["kind"], r.dtype)
    masked = f"tl.where({em.masks[-1]}, {x}, {init})"
    return em.let(f"{masked}.to(tl.int32)" if r.dtype == "i1" else masked, "x")


def _accumulator(r: Node) -> str:
    """A reduction's running tile. any/all over bools accumulate in int32: compiled Triton's
    maximum of two int1 tiles is an int32, and a loop-carried variable must keep its type."""
    dtype = "tl.int32" if r.dtype == "i1" else TL_TYPES[r.dtype]
    return f"tl.full([BLOCK_M, BLOCK_N], {reduce_init(r.attrs['kind'], r.dtype)}, {dtype})"


def kernel_form_refusal(n: Node) -> str | None:
    """Why a fused Triton kernel cannot compute ``n`` (None: it can): the forms ``_Emitter`` has,
    read by the GPU's declared support (``program.refusal``) before anything is lowered."""
    op = n.op
    if get_spec(op).category == ELEMENTWISE and op not in ELEMENTWISE_OWN_FORMS:
        dtype = n.inputs[0].dtype
        form = unary(op, dtype) if len(n.inputs) == 1 else binary(op, dtype)
        return None if form is not None else f"no Triton form for elementwise op {op} on {dtype}"
    if op == "scatter_add":  # a kernel of its own (scatter_kernel)
        return f"scatter_add %{n.name} in {n.dtype}: no 16-bit Triton form" if n.dtype in TL_STORAGE else None
    if op in ELEMENTWISE_OWN_FORMS or op == "nonzero" or hasattr(_Emitter, f"_op_{op}"):
        return None
    return f"no Triton kernel form for op {op} (%{n.name})"


def _bitcast(x: str, source: str, target: str) -> str:
    """``x`` (a ``source`` value, as computed) with its bits read as ``target``; a 16-bit float is
    computed in f32, so its bits are those of its rounding (exact: it holds a 16-bit value)."""
    store = {"f16": "tl.float16", "bf16": "tl.bfloat16", "i1": "tl.uint8"}
    bits = _cast(x, store.get(source, TL_TYPES[source]))
    out = f"{bits}.to({store.get(target, TL_TYPES[target])}, bitcast=True)"
    if target == "i1":
        return f"({out} != 0)"
    return f"{out}.to(tl.float32)" if target in TL_STORAGE else out


def _cast(x: str, tl_type: str) -> str:
    """``x`` as ``tl_type``; a Python number (a literal, a size-1 dim's index 0) has no .to()."""
    return f"tl.full([], {x}, {tl_type})" if _is_literal(x) else f"({x}).to({tl_type})"


def _reduction_body(step: KernelStep, dims: DimArgs, assume: bool, schedule: str) -> tuple[_Emitter, str, str]:
    """Rows x reduced elements; ``schedule`` is "block-row" (whole rows in registers) or "loop-row" (chunks)."""
    em = _Emitter(step, dims, assume)
    reductions, domain, rdims = reduction_domain(step, em.c)
    shape = em.shape(domain)
    outer_axes = [k for k in range(len(shape)) if k not in rdims]
    rows = dims.product([domain.shape[k] for k in outer_axes])
    cols = dims.product([domain.shape[k] for k in rdims])
    em.define("r", "tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]", "m")
    em.define("row_mask", f"r < {rows}")
    outer = em.dims_of(Idx(tuple(shape[k] for k in outer_axes), None, "r"))
    row_of: dict[Node, tuple[str, ...]] = {}
    for r in reductions:
        it, out = iter(outer), []
        for k in range(len(shape)):
            if k not in rdims:
                out.append(next(it))
            elif r.attrs["keepdim"]:
                out.append("0")
        row_of[r] = tuple(out)
    trailing = list(rdims) == list(range(len(shape) - len(rdims), len(shape)))

    def open_pass(start: str) -> Idx:
        em.define("j", f"{start}tl.arange(0, BLOCK_N)[None, :]", "n")
        em.define("mask", f"row_mask & (j < {cols})")
        inner = em.dims_of(Idx(tuple(shape[k] for k in rdims), None, "j"))
        full, it_o, it_i = [], iter(outer), iter(inner)
        for k in range(len(shape)):
            full.append(next(it_i) if k in rdims else next(it_o))
        return Idx(shape, tuple(full), em.let(f"r * {cols} + j", "l") if trailing else None)

    level = reduction_levels(step)
    row_outputs = written_per_row(em.c, step.outputs, reductions, domain, em.members)
    full_outputs = [o for o in step.outputs if o not in row_outputs]
    looped = schedule == "loop-row"
    if not looped:
        em.push()
        idx = open_pass("")
    for lvl in range(1, max(level[r] for r in reductions) + 1):
        batch = [r for r in reductions if level[r] == lvl]
        if looped:
            tiles = {r: em.fresh("acc") for r in batch}
            for r in batch:
                em.define(tiles[r], _accumulator(r), "mn")
            em.w(f"for j0 in range(0, {cols}, BLOCK_N):")
            em.w.depth += 1
            em.push()
            idx = open_pass("j0 + ")
            for r in batch:
                x = _masked(em, r, em.value(r.inputs[0], idx))
                em.w(f"{tiles[r]} = {REDUCE_COMBINE[r.attrs['kind']]}({tiles[r]}, {x})")
            em.pop()
            em.w.depth -= 1
            for r in batch:
                em.accs[r] = (_reduced(em, r, tiles[r], 1), row_of[r])
        else:
            for r in batch:
                x = _masked(em, r, em.value(r.inputs[0], idx))
                em.accs[r] = (_reduced(em, r, x, 1), row_of[r])
    if full_outputs:
        if looped:
            em.w(f"for j0 in range(0, {cols}, BLOCK_N):")
            em.w.depth += 1
            em.push()
            idx = open_pass("j0 + ")
        _write_outputs(em, step, domain, idx, full_outputs)
        if looped:
            em.pop()
            em.w.depth -= 1
    em.push("row_mask")
    _write_row_outputs(em, step, reductions, row_outputs, row_of)
    em.pop()
    return em, rows, cols


def _write_row_outputs(em: _Emitter, step: KernelStep, reductions: list[Node], row_outputs: list[Node], row_of) -> None:
    for i, o in enumerate(step.outputs):
        if o not in row_outputs:
            continue
        source = output_source(o, em.members)  # a reshaped row value (a bias gradient [1, n] -> [n])
        dims = reduced_index(em.c, source, reductions, row_of.__getitem__)
        if dims is None:
            raise Unsupported(f"output %{o.name} {o.type} is neither a row space nor the reduced space")
        at = Idx(em.shape(source), dims)
        em.store(f"out{i}", o, em.linear_of(at), em.value(source, at))


def _column_body(step: KernelStep, dims: DimArgs, assume: bool, lead: int) -> tuple[_Emitter, str, str]:
    """Reductions over the ``lead`` leading dims: a program owns BLOCK_N kept elements and walks every row."""
    em = _Emitter(step, dims, assume)
    reductions, domain, _ = reduction_domain(step, em.c)
    shape = em.shape(domain)
    rows = dims.product(list(domain.shape[:lead]))
    cols = dims.product(list(domain.shape[lead:]))
    em.define("j", "tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]", "n")
    em.define("col_mask", f"j < {cols}")
    inner = em.dims_of(Idx(shape[lead:], None, "j"))
    tiles = {r: em.fresh("acc") for r in reductions}
    for r in reductions:
        em.define(tiles[r], _accumulator(r), "mn")
    row_outputs = written_per_row(em.c, step.outputs, reductions, domain, em.members)
    full_outputs = [o for o in step.outputs if o not in row_outputs]
    em.w(f"for r0 in range(0, {rows}, BLOCK_M):")
    em.w.depth += 1
    em.push()
    em.define("r", "r0 + tl.arange(0, BLOCK_M)[:, None]", "m")
    em.define("mask", f"col_mask & (r < {rows})")
    outer = em.dims_of(Idx(shape[:lead], None, "r"))
    idx = Idx(shape, tuple(outer) + tuple(inner), em.let(f"r * {cols} + j", "l"))
    for r in reductions:
        x = _masked(em, r, em.value(r.inputs[0], idx))
        em.w(f"{tiles[r]} = {REDUCE_COMBINE[r.attrs['kind']]}({tiles[r]}, {x})")
    _write_outputs(em, step, domain, idx, full_outputs)
    em.pop()
    em.w.depth -= 1
    row_of = {}
    for r in reductions:
        row_of[r] = (("0",) * lead if r.attrs["keepdim"] else ()) + tuple(inner)
        em.accs[r] = (_reduced(em, r, tiles[r], 0), row_of[r])
    em.push("col_mask")
    _write_row_outputs(em, step, reductions, row_outputs, row_of)
    em.pop()
    return em, rows, cols


SCATTER_BLOCK = 128  # lanes (positions off the scatter axis) one program owns


def _scatter_body(step: KernelStep, dims: DimArgs) -> tuple[_Emitter, str]:
    """``scatter_add``: each lane owns one position of the dims other than the axis.

    A lane copies ``x`` along the axis at its position, then walks the index
    along the axis in order, adding each source element at the row its index
    names. Lanes never share an output element, so the sums are in a fixed
    order (reproducible); the adds are atomic only so that a repeated row is
    read back after its previous add. Lanes run over the dims after the axis
    fastest (coalesced when there are some), and over those before it too, so
    a scatter along the last axis (max-pool's backward) is still parallel. An
    index outside the output adds nothing.
    """
    em = _Emitter(step, dims, False)
    n = step.group.root  # after the cheap operands it recomputes
    x, index, src = n.inputs
    rank = len(n.shape)
    axis = n.attrs["axis"] % rank
    if n.dtype in TL_STORAGE:  # its adds are atomic, and 16-bit atomics would round every partial sum
        raise Unsupported(f"scatter_add %{n.name} in {n.dtype}: no 16-bit Triton form", [n])
    for k in range(rank):
        if k != axis and not dims.c.prove_equal(n.shape[k], index.shape[k]):
            raise Unsupported(f"scatter_add %{n.name}: the index covers part of dim {k} of the output (the Triton kernel needs all of it)")
    out_shape, it_shape = em.shape(n), em.shape(index)
    outer = dims.product(list(index.shape[:axis]))
    inner = dims.product(list(index.shape[axis + 1 :]))
    size, length = dims(n.shape[axis]), dims(index.shape[axis])
    em.define("lane", "tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)", "x")
    em.define("mask", f"lane < {outer} * {inner}")
    em.define("o", f"lane // {inner}")
    em.define("j", f"lane % {inner}")
    o_dims = em.dims_of(Idx(out_shape[:axis], None, "o")) if axis else ()
    j_dims = em.dims_of(Idx(out_shape[axis + 1 :], None, "j")) if axis < rank - 1 else ()
    em.w(f"for k in range(0, {size}):")
    em.w.depth += 1
    em.push()
    at = Idx(out_shape, (*o_dims, "k", *j_dims))
    em.store("out0", n, em.linear_of(at), em.value(x, at))  # a rank-1 scatter's index is the lanes' one: broadcast
    em.pop()
    em.w.depth -= 1
    em.w(f"for k in range(0, {length}):")
    em.w.depth += 1
    em.push()
    em.uniform.add("k")  # an index broadcast along the lanes (an embedding's token ids) is read once
    it = (*o_dims, "k", *j_dims)
    g = em.value(index, Idx(it_shape, it))
    v = em.value(src, em._operand_idx(src, list(it)))
    row = em.let(f"tl.where({g} < 0, {g} + {size}, {g})", "g")
    target = Idx(out_shape, (*o_dims, row, *j_dims))
    em.push(em.let(f"mask & ({row} >= 0) & ({row} < {size})", "m"))
    em.w(f"tl.atomic_add({em.address('out0', em.linear_of(target))}, {v}, mask={em.masks[-1]})")
    em.pop()
    em.pop()
    em.w.depth -= 1
    return em, f"triton.cdiv({outer} * {inner}, {SCATTER_BLOCK})"


# -- versions -------------------------------------------------------------------------------------
def _conj(*conds: str) -> str:
    parts = [c for c in conds if c and c != "True"]
    return " and ".join(parts) or "True"


def _signature(name: str, step: KernelStep, dims: DimArgs, constexprs: list[str]) -> str:
    params = [f"out{i}" for i in range(len(step.outputs))]
    seen = set(step.outputs)
    params += [f"in{k}" for k in range(len([n for n in dict.fromkeys(step.inputs) if n not in seen]))]
    dim_params = [f"d{k}" for k in range(len(dims.exprs))]
    params += dim_params + [f"{c}: tl.constexpr" for c in constexprs]
    # Triton would otherwise compile a kernel again for each dim that is 1 or a multiple of 16:
    # a per-shape JIT. Dims are plain runtime arguments; one compiled form serves every shape.
    deco = f"@triton.jit(do_not_specialize={dim_params!r})" if dim_params else "@triton.jit"
    return f"{deco}\ndef {name}({', '.join(params)}):"


@dataclass
class _Body:
    """One speculation version before its function is named: the emitted body and its launch."""

    label: str
    condition: str
    em: _Emitter
    constexprs: dict[str, str]  # name -> Python value expression
    grid: str
    num_warps: int = 4
    choices: list[dict[str, int]] | None = None  # every value of the constexprs; None: they are literals

    @property
    def text(self) -> str:
        return "\n".join(self.em.w.lines)

    def all_choices(self) -> list[dict[str, int]]:
        return self.choices if self.choices is not None else [{k: int(v) for k, v in self.constexprs.items()}]


def _pow2_at_least(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1): ``triton.next_power_of_2`` at codegen time."""
    return 1 << max(n - 1, 0).bit_length()


def _schedules(step: KernelStep, dims: DimArgs, lead: int, assume: bool, cond: str, prefix: str) -> list[_Body]:
    """The versions of one broadcast assumption: per schedule, its condition on the dims and its launch."""
    tag = f"{prefix} " if prefix else ""
    has_reduce = any(n.op == "reduce" for n in step.group.nodes)
    if lead:
        em, _, cols = _column_body(step, dims, assume, lead)
        bm, bn = COLUMN_BLOCK
        return [_Body(f"{tag}column", cond, em, {"BLOCK_M": str(bm), "BLOCK_N": str(bn)}, f"triton.cdiv({cols}, {bn})")]
    if has_reduce:
        out = []
        em, rows, cols = _reduction_body(step, dims, assume, "block-row")
        fits = f"{cols} <= {ROW_BLOCK_MAX}" if not cols.isdigit() else ("True" if int(cols) <= ROW_BLOCK_MAX else "")
        if fits:  # whole rows in registers: BLOCK_M rows of BLOCK_N >= cols per program
            if cols.isdigit():
                width = max(MIN_ROW_BLOCK, _pow2_at_least(int(cols)))
                bn, bm, widths = str(width), str(ROW_TILE // width), [width]
            else:  # one compiled form per power of two: built with the model, picked by the row length
                bn = f"max({MIN_ROW_BLOCK}, triton.next_power_of_2({cols}))"
                bm = f"{ROW_TILE} // {bn}"
                widths = [1 << k for k in range(MIN_ROW_BLOCK.bit_length() - 1, ROW_BLOCK_MAX.bit_length())]
            choices = [{"BLOCK_M": ROW_TILE // w, "BLOCK_N": w} for w in widths]
            out.append(_Body(f"{tag}block-row", _conj(cond, fits), em, {"BLOCK_M": bm, "BLOCK_N": bn}, f"triton.cdiv({rows}, {bm})", choices=choices))
        em, rows, cols = _reduction_body(step, dims, assume, "loop-row")
        # Reached only by rows too long for block-row (or static ones): chunks of LOOP_ROW_BLOCK.
        width = min(LOOP_ROW_BLOCK, _pow2_at_least(int(cols))) if cols.isdigit() else LOOP_ROW_BLOCK
        out.append(_Body(f"{tag}loop-row", cond, em, {"BLOCK_M": "1", "BLOCK_N": str(width)}, str(rows)))
        return out
    em, n = _loop_body(step, dims, assume)
    return [
        _Body(f"{tag}small", _conj(cond, f"{n} < {SMALL_WORK}"), em, {"BLOCK": "128"}, f"triton.cdiv({n}, 128)", num_warps=1),
        _Body(f"{tag}large" if tag else "general", cond, em, {"BLOCK": str(LOOP_BLOCK)}, f"triton.cdiv({n}, {LOOP_BLOCK})"),
    ]


def emit_kernel(step: KernelStep, c: ShapeConstraints, name: str) -> TritonKernel:
    """The Triton source of one fused group, with its speculation versions."""
    dims = DimArgs(c)
    if step.group.root.op == "scatter_add":
        em, grid = _scatter_body(step, dims)
        body = _Body("general", "True", em, {"BLOCK": str(SCATTER_BLOCK)}, grid)
        text = "\n".join(["# scatter kernel: scatter_add", _signature(name, step, dims, ["BLOCK"]), body.text, ""])
        params = list(step.outputs) + [n for n in dict.fromkeys(step.inputs) if n not in set(step.outputs)]
        return TritonKernel(name, text, [Version("general", "True", name, grid, body.constexprs, 4, body.all_choices())], params, list(dims.exprs))
    lead = leading_reduction(step, c) if any(n.op == "reduce" for n in step.group.nodes) else 0
    # The general versions first: emitting them registers every dim the broadcast conditions name.
    general = _schedules(step, dims, lead, False, "True", "")
    bodies: list[_Body] = []
    if any(b.em.maybe_broadcast for b in general):
        conditions = list(dict.fromkeys(f"{dims(src)} == {dims(dst)}" for src, dst in runtime_broadcasts(step, c)))
        bodies = _schedules(step, dims, lead, True, _conj(*conditions), "no-broadcast")
    bodies += general
    kept: list[_Body] = []
    for b in bodies:  # drop versions an earlier one always pre-empts
        if b.condition not in {k.condition for k in kept}:
            kept.append(b)
        if b.condition == "True":
            break
    functions: dict[str, str] = {}  # body text -> function name (versions differing only in launch share one)
    for b in kept:
        functions.setdefault(b.text, name if len(kept) == 1 else f"{name}_v{len(functions)}")
    parts = [f"# {step.kind} kernel fusing: " + ", ".join(n.op for n in step.group.nodes)]
    for text, fn in functions.items():
        first = next(b for b in kept if b.text == text)
        labels = ", ".join(b.label for b in kept if b.text == text)
        parts += [f"# versions: {labels}", _signature(fn, step, dims, list(first.constexprs)), text, ""]
    versions = [Version(b.label, b.condition, functions[b.text], b.grid, b.constexprs, b.num_warps, b.all_choices()) for b in kept]
    params = list(step.outputs) + [n for n in dict.fromkeys(step.inputs) if n not in set(step.outputs)]
    return TritonKernel(name, "\n".join(parts), versions, params, list(dims.exprs))
