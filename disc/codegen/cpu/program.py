"""The whole compiled program as one C++ translation unit: kernels plus host flow.

The generated host flow is what DISC calls the host side of the program:

- ``compute_shapes``: every root symbol from the input shapes, then the
  run-time checks the compiler could not prove (shape calculation is code,
  not re-derived per op);
- ``disc_shapes``: output dims and workspace bytes, so the caller can
  allocate them (as torch tensors in plug-in mode, zero-copy);
- ``disc_run``: carves every intermediate out of the workspace, picks each
  kernel's speculation version from the actual dims, and calls kernels and,
  through the RAL, the GEMM and convolution library.

A ``nonzero`` (boolean-mask indexing) makes a dim known only mid-call: its
count. ``compute_shapes`` sets the count to its bound (the mask's length), so
``disc_shapes`` sizes outputs and the workspace for the most it can be; the
host flow then runs the ``nonzero``, sets the count to what it found, and every
later step uses it. ``disc_run`` reports the outputs' actual dims, and the
caller views the leading part of each output buffer at that shape.

The buffer plan is symbolic (which buffers share a slot: provably equal
sizes, disjoint lifetimes); where each slot sits is decided per call from
the slot sizes at that shape, packing slots that are never live together
into the same bytes (``disc_place_slots``): which of two symbolic sizes is
larger depends on the shape, so only then can the packing be tight.

Nothing here links against torch or a library: library calls go through the
``disc_ral`` table. The program keeps no state between calls.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from disc.codegen.cpu.cexpr import SymbolNames, c_product
from disc.codegen.cpu.kernel import MAX_VERSIONS, KernelSource, emit_kernel, kernel_form_refusal
from disc.codegen.cpu.ops import PRELUDE, storage_type
from disc.codegen.cpu.signature import signature_text
from disc.codegen.cpu.toolchain import UNIT_MARKER
from disc.codegen.lowering import (
    KernelStep,
    LibraryStep,
    LoweredProgram,
    Unsupported,
    View,
    batch_parts,
    contiguous_strides,
    defines_a_count,
    lower,
)
from disc.ir.graph import Graph, Node
from disc.ir.ops.nn import channels_first_axes
from disc.ir.registry import kernel_kind
from disc.ir.types import IndexType
from disc.shape.expr import SymExpr, as_expr

# The RAL routine of each convolution op (all take a disc_conv2d_args).
CONV_CALLS = {"convolution": "conv2d", "convolution_backward_input": "conv2d_backward_data", "convolution_backward_weight": "conv2d_backward_weights"}


def refusal(n: Node) -> str | None:
    """Why the CPU program cannot hold ``n`` (None: it can). The ops this backend takes, declared:
    the lowering refuses them all at once, before planning, and the driver runs them on the host.
    (Refusals that depend on the plan, such as a view a library call cannot describe, are still
    found while lowering.)"""
    kind = kernel_kind(n.op, n.type)
    if kind == "library":
        if n.op in CONV_CALLS and (n.attrs.get("transposed") or len(n.shape) != 4):
            return f"%{n.name}: only 2-D, non-transposed convolutions and their gradients have library calls"
        return None if n.op == "dot_general" or n.op in CONV_CALLS else f"%{n.name}: no library call for {n.op}"
    return kernel_form_refusal(n) if kind == "memory_bound" else None


@dataclass
class KernelCall:
    step: KernelStep
    kernel: KernelSource  # shared by structurally identical groups


@dataclass
class NativeSource:
    text: str
    kernels: list[KernelSource]  # unique kernel functions
    calls: list[KernelCall | LibraryStep]  # in execution order
    constants: list[str]  # payload names, in the order of the `consts` pointer array
    workspace_bound: SymExpr  # bytes: every slot side by side; the run-time placement never needs more
    output_dims: list[tuple]  # per output buffer: its symbolic shape
    symbols: dict[str, str] = field(default_factory=dict)  # root symbol -> C field
    counts: dict[str, str] = field(default_factory=dict)  # root symbol known mid-call (a nonzero's count) -> its bound

    @property
    def data_dependent(self) -> bool:
        """Are some output dims known only once the program has run (``disc_run`` reports them)?"""
        return bool(self.counts)


GEMM_DTYPES = {"bf16": "DISC_GEMM_BF16", "f16": "DISC_GEMM_F16"}  # disc_gemm_args.dtype of 16-bit GEMMs


class _ProgramEmitter:
    def __init__(self, lp: LoweredProgram) -> None:
        self.lp = lp
        self.g = lp.graph
        self.c = lp.graph.constraints
        self.names = SymbolNames(self.c)
        self.constants: list[str] = []
        self.lines: list[str] = []
        self.counts = self._counts()  # root symbol -> the nonzero whose count it is

    def _counts(self) -> dict[str, Node]:
        out = {}
        for n in self.g.nodes:
            if n.op != "nonzero":
                continue
            sym = self.c.normalize(n.shape[0]).as_symbol()
            if sym is None:  # proven equal to a size of the inputs: nothing would check that it is
                raise Unsupported(f"%{n.name}: its count is {self.c.normalize(n.shape[0])}, a size the program would have to check", [n])
            out[sym] = n
        return out

    def emit(self) -> NativeSource:
        kernels, calls = self._kernels()
        body = self._run_body(calls)
        shapes = self._shape_code()  # after the bodies: it must bind every symbol they use
        ws_expr = SymExpr.const(0)
        for slot in self.lp.slots:
            ws_expr = ws_expr + slot.size + 63
        fields = sorted(set(self.names.fields.values()))
        # Sections after the first UNIT_MARKER are compiled as separate translation units (in
        # parallel), each after the common part before it: the prelude, Shapes and every
        # kernel's prototype.
        parts = [
            "// Generated by disc: the native CPU program for graph " + self.g.name,
            PRELUDE,
            "struct Shapes {",
            *[f"  int64_t {f} = 0;" for f in fields],
            "  int32_t* fault = nullptr;  // set by a kernel: 1 an integer division by zero, 2 an index out of range",
            "};",
            "",
            *[d for k in kernels for d in k.declarations],
            "",
            *[f"{UNIT_MARKER}\n{k.text}\n" for k in kernels],
            UNIT_MARKER,
            # The host flow is straight-line calls, not loops: -O3's unrolling and vectorising
            # only cost compile time here (BERT-base: its unit builds ~0.15 s faster at -O1).
            '#pragma GCC optimize("O1")',
            _profile_macros(len(calls)),
            *shapes,
            "",
            *self._entry_points(body),
        ]
        return NativeSource(
            "\n".join(parts),
            kernels,
            calls,
            self.constants,
            ws_expr,
            [o.shape for o in self.lp.output_buffers],
            dict(self.names.fields),
            {sym: str(n.inputs[0].shape[0]) for sym, n in self.counts.items()},
        )

    # -- kernels ------------------------------------------------------------------
    def _kernels(self) -> tuple[list[KernelSource], list[KernelCall | LibraryStep]]:
        unique: dict[str, KernelSource] = {}
        calls: list[KernelCall | LibraryStep] = []
        for step in self.lp.steps:
            if isinstance(step, LibraryStep):
                calls.append(step)
                continue
            if defines_a_count(step):  # the prelude's disc_nonzero, called by the host flow
                calls.append(KernelCall(step, KernelSource("disc_nonzero", "", ["positions"], [], [*step.outputs, *step.inputs])))
                continue
            draft = emit_kernel(step, self.names, "KERNEL")
            key = draft.text
            if key not in unique:
                name = f"{step.kind}_{len(unique)}"
                decls = [d.replace("KERNEL", name) for d in draft.declarations]
                unique[key] = KernelSource(name, draft.text.replace("KERNEL", name), draft.versions, draft.conditions, draft.params, decls)
            shared = unique[key]
            calls.append(KernelCall(step, KernelSource(shared.name, shared.text, shared.versions, shared.conditions, draft.params)))
        return list(unique.values()), calls

    # -- host flow --------------------------------------------------------------------
    def _ptr(self, n: Node) -> str:
        kind, where = self.lp.location[n]
        t = storage_type(n.dtype)
        if kind == "input":
            return f"static_cast<{t}*>(inputs[{where}])"
        if kind == "output":
            return f"static_cast<{t}*>(outputs[{where}])"
        if kind == "const":
            if where not in self.constants:
                self.constants.append(str(where))
            return f"static_cast<{t}*>(consts[{self.constants.index(str(where))}])"
        return f"reinterpret_cast<{t}*>(ws + off{where})"

    def _at(self, view: View) -> str:
        """The address of a view's first element."""
        offset = self.c.normalize(view.offset)
        return self._ptr(view.base) if offset == SymExpr.const(0) else f"{self._ptr(view.base)} + {self.names.expr(offset)}"

    def _placement(self) -> list[str]:
        """C++ placing every slot at this call's sizes; defines ``off<k>`` and ``ws_bytes``."""
        slots = self.lp.slots
        if not slots:
            return ["  const int64_t ws_bytes = 0;"]
        n = len(slots)
        # Which slots are live together is known now; only their sizes wait for the call.
        clash_start, clash = [0], []
        for a in slots:
            clash += [k for k, b in enumerate(slots) if b is not a and a.live_with(b)]
            clash_start.append(len(clash))
        out = [
            f"  static const int32_t clash_start[{n + 1}] = {{{', '.join(map(str, clash_start))}}};",
            f"  static const int32_t clash[{max(len(clash), 1)}] = {{{', '.join(map(str, clash)) or '0'}}};",
            f"  const int64_t slot_bytes[{n}] = {{{', '.join(self.names.expr(x.size) for x in slots)}}};",
            f"  int64_t slot_off[{n}];",
            f"  const int64_t ws_bytes = disc_place_slots({n}, slot_bytes, clash_start, clash, slot_off);",
        ]
        out += [f"  const int64_t off{k} = slot_off[{k}];" for k in range(n)]
        return out

    def _run_body(self, calls: list[KernelCall | LibraryStep]) -> list[str]:
        out = self._placement()
        for k, call in enumerate(calls):
            out.append(f"  DISC_STEP_BEGIN({k});")
            if isinstance(call, LibraryStep):
                out += self._library_call(call)
                out.append(f"  DISC_STEP_END({k}, 0);")
                continue
            if defines_a_count(call.step):
                out += self._nonzero_call(call.step)
                out.append(f"  DISC_STEP_END({k}, 0);")
                continue
            args = ", ".join(["s"] + [self._ptr(n) for n in call.kernel.params])
            ops = ", ".join(n.op for n in call.step.group.nodes)
            out.append(f"  // step {k}: {call.step.kind} -> %{call.step.group.nodes[-1].name} [{ops}]")
            kernel = call.kernel
            if len(kernel.versions) == 1:
                out.append(f"  {kernel.name}({args});")
                out.append(f"  DISC_STEP_END({k}, 0);")
                continue
            out.append(f"  int version{k} = {len(kernel.versions) - 1};  // {kernel.versions[-1]}")
            for v, (label, cond) in enumerate(zip(kernel.versions[:-1], kernel.conditions)):
                out.append(f"  {'if' if v == 0 else 'else if'} ({cond}) version{k} = {v};  // {label}")
            out.append(f"  switch (version{k}) {{")
            for v in range(len(kernel.versions)):
                out.append(f"    case {v}: {kernel.function(v)}({args}); break;")
            out.append("  }")
            out.append(f"  DISC_STEP_END({k}, version{k});")
        return out

    def _nonzero_call(self, step: KernelStep) -> list[str]:
        """The count of a ``nonzero`` replaces its bound from here on, then the checks on it run."""
        n = step.group.nodes[-1]
        [mask] = step.inputs
        sym = self.c.normalize(n.shape[0]).as_symbol()
        lines = [
            f"  // %{n.name} = nonzero(%{mask.name}): its count {sym} is known from here on",
            f"  s.{self.names.field(sym)} = disc_nonzero({self._ptr(mask)}, {self.names.expr(mask.shape[0])}, {self._ptr(n)});",
        ]
        known_in_order = list(self.counts)  # graph order, so the order they become known in
        for chk in self.c.checks:  # those whose last count to be known is this one
            lhs, rhs = self.c.normalize(chk.lhs), self.c.normalize(chk.rhs)
            counts = (lhs.symbols() | rhs.symbols()) & set(self.counts)
            if counts and max(counts, key=known_in_order.index) == sym:
                lines += _check_lines(chk.op, self.names.expr(lhs), self.names.expr(rhs), f"{chk.lhs} {chk.op} {chk.rhs} ({chk.reason})")
        return lines

    def _output_dims(self, array: str, indent: str = "  ") -> list[str]:
        """C++ writing every output buffer's dims, in order, into ``array``."""
        dims = [d for o in self.lp.output_buffers for d in o.shape]
        return [f"{indent}{array}[{k}] = {self.names.expr(d)};" for k, d in enumerate(dims)]

    def _entry_points(self, body: list[str]) -> list[str]:
        # Where a count is known only mid-call, disc_run reports the dims it ran at.
        actual = ["  if (actual_dims) {", *self._output_dims("actual_dims", "    "), "  }"] if self.counts else []
        signature = signature_text(
            [len(n.shape) for n in self.g.inputs], [(o.tensor_type.dtype, len(o.shape)) for o in self.lp.output_buffers], len(self.constants), bool(self.counts)
        )
        return [
            'extern "C" int32_t disc_abi_version(void) { return DISC_RAL_ABI_VERSION; }',
            f'extern "C" const char* disc_signature(void) {{ return "{signature}"; }}',
            "",
            'extern "C" int32_t disc_shapes(const int64_t* dims, int64_t* out_dims, int64_t* workspace_bytes, disc_ral_ctx* ctx) {',
            "  Shapes s;",
            "  if (int32_t rc = compute_shapes(dims, s, ctx)) return rc;",
            *self._output_dims("out_dims"),
            *self._placement(),
            "  *workspace_bytes = ws_bytes;",
            "  return 0;",
            "}",
            "",
            'extern "C" int32_t disc_run(const disc_ral* ral, disc_ral_ctx* ctx, const int64_t* dims, void* const* inputs,',
            "                            void* const* consts, void* const* outputs, void* workspace, int64_t* actual_dims) {",
            "  (void)ral; (void)consts; (void)outputs; (void)inputs; (void)actual_dims;",
            "  Shapes s;",
            "  if (int32_t rc = compute_shapes(dims, s, ctx)) return rc;",
            "  char* ws = static_cast<char*>(workspace);",
            "  (void)ws;",
            "  int32_t fault = 0;",
            "  s.fault = &fault;",
            *body,
            "  if (ctx->failed) return 1;",
            "  switch (__atomic_load_n(&fault, __ATOMIC_RELAXED)) {",
            '    case 0: break;',
            '    case 2: ral->error(ctx, "IndexError: an index out of range in a gather or an embedding (each must be in [-size, size) of the dim it selects along)"); return 1;',
            '    default: ral->error(ctx, "ZeroDivisionError: an integer division or remainder by zero"); return 1;',
            "  }",
            *actual,
            "  return 0;",
            "}",
        ]

    # -- library calls ------------------------------------------------------------
    def _library_call(self, step: LibraryStep) -> list[str]:
        n = step.node
        if n.op == "dot_general":
            return self._gemm(step)
        if n.op in CONV_CALLS:
            return self._conv(step)
        raise Unsupported(f"no library call for {n.op}", [n])

    def _merge(self, view: View, axes: list[int], what: str) -> tuple[str, str]:
        """Extent and stride of ``axes`` of a view taken as one dim (they must be laid out contiguously)."""
        if not axes:
            return "1", "0"
        live = [a for a in axes if not self.c.prove_is_one(view.shape[a])] or axes[-1:]
        for a, b in zip(live, live[1:]):
            if not self.c.prove_equal(view.strides[a], as_expr(view.strides[b]) * as_expr(view.shape[b])):
                raise Unsupported(f"{what}: dims {axes} of %{view.base.name} are not one strided dim")
        extent = c_product([self.names.expr(view.shape[a]) for a in axes])
        return extent, self.names.expr(view.strides[live[-1]])

    def _gemm(self, step: LibraryStep) -> list[str]:
        n = step.node
        lhs, rhs = step.operands
        a = n.attrs
        lb, lc, rb, rc = list(a["lhs_batch"]), list(a["lhs_contract"]), list(a["rhs_batch"]), list(a["rhs_contract"])
        lfree = [k for k in range(len(lhs.shape)) if k not in lb + lc]
        rfree = [k for k in range(len(rhs.shape)) if k not in rb + rc]
        if len(lb) > 6:
            raise Unsupported(f"%{n.name}: more than 6 batch dims")
        m, a_rs = self._merge(lhs, lfree, f"%{n.name} lhs rows")
        k, a_cs = self._merge(lhs, lc, f"%{n.name} lhs contraction")
        _, b_rs = self._merge(rhs, rc, f"%{n.name} rhs contraction")
        nn, b_cs = self._merge(rhs, rfree, f"%{n.name} rhs columns")
        out = step.result or View(n, n.shape, contiguous_strides(n.shape))
        out_strides = out.strides
        rows = list(range(len(lb), len(lb) + len(lfree)))
        c_rs = self._merge(out, rows, f"%{n.name} result rows")[1] if lfree else nn
        lines = [f"  {{  // %{n.name} = dot_general: [{', '.join(str(d) for d in n.shape)}]", "    disc_gemm_args g{};"]
        lines.append(f"    g.m = {m}; g.n = {nn}; g.k = {k};")
        batch = []
        for i, (x, y) in enumerate(zip(lb, rb)):
            batch += batch_parts(self.c, n, lhs.strides[x], rhs.strides[y], out_strides[i], n.shape[i])
        if len(batch) > 6:
            raise Unsupported(f"%{n.name}: more than 6 batch dims")
        lines.append(f"    g.batch_rank = {len(batch)};")
        e = self.names.expr
        for i, (size, sa, sb, sc) in enumerate(batch):
            lines.append(f"    g.batch_shape[{i}] = {e(size)}; g.a_bs[{i}] = {e(sa)}; g.b_bs[{i}] = {e(sb)}; g.c_bs[{i}] = {e(sc)};")
        lines.append(f"    g.a = {self._at(lhs)}; g.a_rs = {a_rs}; g.a_cs = {a_cs};")
        lines.append(f"    g.b = {self._at(rhs)}; g.b_rs = {b_rs}; g.b_cs = {b_cs};")
        lines.append(f"    g.c = {self._ptr(out.base)}; g.c_rs = {c_rs}; g.alpha = 1.0f; g.beta = 0.0f;")
        # A weight read from its first element: the RAL may keep it packed, freed with the
        # program, which holds the buffers by their base addresses.
        if n.dtype in GEMM_DTYPES:  # 16-bit operands and result, accumulated in f32 by the RAL
            lines.append(f"    g.dtype = {GEMM_DTYPES[n.dtype]};")
        if self.lp.location[rhs.base][0] == "const" and self.c.normalize(rhs.offset) == SymExpr.const(0):
            lines.append("    g.b_is_constant = 1;")
        lines.append("    if (ral->gemm(ctx, &g)) return 1;")
        lines.append("  }")
        return lines

    def _conv(self, step: LibraryStep) -> list[str]:
        n = step.node
        a = n.attrs
        if a.get("transposed") or len(n.shape) != 4:
            raise Unsupported(f"%{n.name}: only 2-D, non-transposed convolutions and their gradients have library calls", [n])
        for v in step.operands:
            if v.base.shape != v.shape:
                raise Unsupported(f"%{n.name}: convolution operand is a view", [n])
        # The arguments describe the forward problem (x, w -> y); a gradient call writes x or w.
        first, second = (v.base for v in step.operands)
        x, w, y = {"convolution": (first, second, n), "convolution_backward_input": (n, second, first)}.get(n.op, (first, n, second))
        epilogue = step.epilogue
        e = self.names.expr
        axes = channels_first_axes(4, a["channels_last"])  # N, C, H, W of x and of y
        xs, ws, ys = [x.shape[i] for i in axes], w.shape, [y.shape[i] for i in axes]
        constant = n.op == "convolution" and self.lp.location[w][0] == "const"
        after = f", then {epilogue.describe()}" if epilogue is not None else ""
        return [
            f"  {{  // %{n.name} = {n.op}" + (" (channels last)" if a["channels_last"] else "") + after,
            "    disc_conv2d_args c{};",
            f"    c.n = {e(xs[0])}; c.ci = {e(xs[1])}; c.h = {e(xs[2])}; c.w = {e(xs[3])};",
            f"    c.co = {e(ws[0])}; c.kh = {e(ws[2])}; c.kw = {e(ws[3])}; c.oh = {e(ys[2])}; c.ow = {e(ys[3])};",
            f"    c.stride[0] = {a['stride'][0]}; c.stride[1] = {a['stride'][1]};",
            f"    c.dilation[0] = {a['dilation'][0]}; c.dilation[1] = {a['dilation'][1]};",
            f"    c.pad_lo[0] = c.pad_hi[0] = {a['padding'][0]}; c.pad_lo[1] = c.pad_hi[1] = {a['padding'][1]};",
            f"    c.groups = {a['groups']}; c.channels_last = {int(a['channels_last'])};",
            f"    c.input = {self._ptr(x)}; c.weight = {self._ptr(w)}; c.output = {self._ptr(step.writes if epilogue else y)};",
            f"    c.weight_is_constant = {int(constant)};",
            *(
                [f"    c.bias = {self._ptr(epilogue.bias) if epilogue.bias is not None else 'nullptr'}; c.relu = {int(epilogue.relu)};"]
                if epilogue is not None
                else []
            ),
            f"    if (ral->{CONV_CALLS[n.op]}(ctx, &c)) return 1;",
            "  }",
        ]

    # -- shapes -------------------------------------------------------------------------
    def _shape_code(self) -> list[str]:
        c = self.c
        lines = ["static int32_t compute_shapes(const int64_t* dims, Shapes& s, disc_ral_ctx* ctx) {"]
        bound: set[str] = set()
        checks: list[tuple[str, SymExpr | str, SymExpr, str]] = []  # (op, lhs, rhs, message)
        offset = 0
        input_dims: dict[tuple[int, int], str] = {}
        for pos, node in enumerate(self.g.inputs):
            for axis, d in enumerate(node.shape):
                src = f"dims[{offset + axis}]"
                input_dims[(pos, axis)] = src
                e = c.normalize(d)
                sym = e.as_symbol()
                if sym is not None and sym not in bound:
                    lines.append(f"  s.{self.names.field(sym)} = {src};  // input {pos} dim {axis}")
                    bound.add(sym)
                else:
                    checks.append(("==", src, e, f"input {pos} dim {axis} must equal {e}"))
            offset += len(node.shape)
        # Index nodes that introduce symbols of their own (e.g. pooled sizes named by the frontend).
        values: dict[Node, str] = {}
        for n in self.g.nodes:
            if not isinstance(n.type, IndexType):
                continue
            code = self._index_code(n, values, input_dims, bound)
            if code is None:
                continue
            values[n] = code
            sym = c.normalize(n.type.value).as_symbol()
            if sym is not None and sym not in bound:
                lines.append(f"  s.{self.names.field(sym)} = {code};  // %{n.name}")
                bound.add(sym)
        for sym, n in self.counts.items():  # in graph order: a mask's length may be an earlier count's bound
            most = c.normalize(n.inputs[0].shape[0])
            if not most.symbols() <= bound:
                raise Unsupported(f"%{n.name}: the length {most} of its mask is not computable from the input shapes", [n])
            lines.append(f"  s.{self.names.field(sym)} = {self.names.expr(most)};  // %{n.name}: the most its count can be, until it has run")
            bound.add(sym)
        for chk in c.checks:
            lhs, rhs = c.normalize(chk.lhs), c.normalize(chk.rhs)
            if not (lhs.symbols() | rhs.symbols()) <= bound - set(self.counts):
                continue  # a check on a count runs once the count is known (_nonzero_call)
            checks.append((chk.op, lhs, rhs, f"{chk.lhs} {chk.op} {chk.rhs} ({chk.reason})"))
        used = set(self.names.fields)
        missing = sorted(used - bound)
        if missing:
            raise Unsupported(f"dims {missing} are not computable from the input shapes (data-dependent sizes)")
        for op, lhs, rhs, msg in checks:
            exprs = [x for x in (lhs, rhs) if not isinstance(x, str)]
            if not all(x.symbols() <= bound for x in exprs):
                continue  # not decidable from the shapes; the Python-side input checks cover input dims
            lines += _check_lines(op, lhs if isinstance(lhs, str) else self.names.expr(lhs), self.names.expr(rhs), msg)
        lines += ["  return 0;", "}"]
        return lines

    def _index_code(self, n: Node, values: dict[Node, str], input_dims: dict[tuple[int, int], str], bound: set[str]) -> str | None:
        e = self.c.normalize(n.type.value)
        if e.symbols() <= bound:
            return self.names.expr(e) if e.symbols() else str(e.const_value)
        if n.op == "dim":
            x, axis = n.inputs[0], n.attrs["axis"]
            if x.op == "input":
                return input_dims[(self.g.inputs.index(x), axis)]
            return None
        ops = {"iadd": "+", "isub": "-", "imul": "*"}
        ins = [values.get(i) for i in n.inputs]
        if any(v is None for v in ins):
            return None
        if n.op in ops:
            return f"({ins[0]} {ops[n.op]} {ins[1]})"
        if n.op == "ifloordiv":
            return f"disc_floordiv_i({ins[0]}, {ins[1]})"
        if n.op in ("imax", "imin"):
            return f"std::{n.op[1:]}<int64_t>({ins[0]}, {ins[1]})"
        return None


def _profile_macros(steps: int) -> str:
    """Per-step time and speculation-version counters, compiled in only for profiling builds (-DDISC_PROFILE)."""
    return f"""#ifdef DISC_PROFILE
#include <atomic>
#include <chrono>
extern "C" {{ std::atomic<int64_t> disc_profile_ns[{max(steps, 1)}]; std::atomic<int64_t> disc_profile_hits[{max(steps, 1)} * {MAX_VERSIONS}]; }}
extern "C" int32_t disc_profile_steps(void) {{ return {steps}; }}
#define DISC_STEP_BEGIN(k) const auto disc_t##k = std::chrono::steady_clock::now()
#define DISC_STEP_END(k, version) do {{ \\
    disc_profile_ns[k] += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - disc_t##k).count(); \\
    disc_profile_hits[{MAX_VERSIONS} * (k) + (version)] += 1; }} while (0)
#else
#define DISC_STEP_BEGIN(k)
#define DISC_STEP_END(k, version)
#endif
"""


def _check_lines(op: str, lhs: str, rhs: str, message: str) -> list[str]:
    """C++ returning 2 with ``message`` unless ``lhs op rhs`` holds."""
    safe = message.replace("\\", "\\\\").replace('"', "'").replace("%", "%%")
    return [
        f"  if (!({_check_cond(op, lhs, rhs)})) {{",
        f'    std::snprintf(ctx->error, sizeof ctx->error, "shape check failed: {safe}");',
        "    ctx->failed = 1;",
        "    return 2;",
        "  }",
    ]


def _check_cond(op: str, lhs: str, rhs: str) -> str:
    if op == "%":
        return f"{rhs} != 0 && {lhs} % {rhs} == 0"
    return f"{lhs} {op} {rhs}"


def emit_program(lp: LoweredProgram) -> NativeSource:
    """C++ source of the whole program (kernels, shape code, host flow)."""
    return _ProgramEmitter(lp).emit()


# Both flags let GCC vectorise loops it otherwise leaves scalar, and neither changes a result (NaN,
# inf and signed zeros included); they only drop side effects no kernel reads:
# - -fno-math-errno: libm calls (sqrt, log, pow) need not set errno, so they get vector versions;
# - -fno-trapping-math: float arithmetic under a select may run for every lane. Without AVX-512's
#   masked ops GCC otherwise refuses to if-convert such a select (it might raise an FP exception
#   flag), and on AVX2 the GELU and exp loops stayed scalar: bias + GELU at 8x256x1024, 10 -> 1 ms.
CODEGEN_FLAGS = ("-fno-math-errno", "-fno-trapping-math")


def native_source(graph: Graph) -> tuple[LoweredProgram, NativeSource]:
    """The CPU backend's lowering of ``graph`` and the C++ it generates (a saved program is reused
    only where this gives its source again). Convolutions take their bias and ReLU: the RAL
    applies them inside the call, and the host flow runs a ``nonzero`` itself."""
    lowered = lower(graph, conv_epilogues=True, data_dependent=True, refusal=refusal)
    return lowered, emit_program(lowered)


def build_options(profile: bool = False) -> dict:
    """The toolchain options of a native program (``flags``, ``libs``)."""
    return {"flags": CODEGEN_FLAGS + (("-DDISC_PROFILE",) if profile else ()), "libs": ("-lmvec",)}
