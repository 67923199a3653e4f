"""RNN, GRU and LSTM, unrolled over a sequence length known at compile time."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from disc.frontends.onnx.importer import OnnxImporter
from disc.frontends.onnx.ops import onnx_op
from disc.frontends.onnx.ops.common import known_dim, matmul
from disc.ir.builder import (
    LoweringError,
    broadcast_to,
    convert,
    elementwise,
    reshape,
    scalar,
    select,
)
from disc.ir.graph import Node
from disc.shape.expr import as_expr

_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
_DEFAULT_ACTIVATIONS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}
_ACTIVATIONS = {"Tanh": "tanh", "Sigmoid": "sigmoid", "Relu": "relu"}


@onnx_op("RNN", "GRU", "LSTM")
def _recurrent(
    imp: OnnxImporter, node: Any, x: Any, w: Any, r: Any, b: Any = None, sequence_lens: Any = None, initial_h: Any = None, initial_c: Any = None, p: Any = None,
    activations: Sequence[str] | None = None, activation_alpha: Any = None, activation_beta: Any = None, clip: float | None = None,
    direction: str = "forward", hidden_size: int | None = None, layout: int = 0, linear_before_reset: int = 0, input_forget: int = 0,
) -> list[Node]:
    """RNN, GRU and LSTM unrolled over a sequence length known when the model is compiled (batch
    may vary): the input projection for every step in one GEMM, then per step the recurrent GEMM
    and the gates. ``sequence_lens`` holds a finished entry's state and zeroes its outputs."""
    kind = node.op_type
    gates = _GATES[kind]
    x, w, r = imp.tensor(x), imp.tensor(w), imp.tensor(r)
    if layout:
        x = imp.graph.add("transpose", (x,), {"perm": (1, 0, 2)})
    steps = known_dim(x.shape[0])
    if steps is None:
        raise LoweringError(f"{kind} over a sequence of run-time length ({x.shape[0]}): disc unrolls recurrent layers over a known length")
    if direction not in ("forward", "reverse", "bidirectional"):
        raise LoweringError(f"{kind} direction={direction!r}")
    if input_forget:
        raise LoweringError("LSTM with input_forget")
    dirs = 2 if direction == "bidirectional" else 1
    hidden = hidden_size or known_dim(r.shape[2])
    names = list(activations) if activations else _DEFAULT_ACTIVATIONS[kind] * dirs
    if len(names) == len(_DEFAULT_ACTIVATIONS[kind]) and dirs == 2:
        names = names * 2
    for name in names:
        if name not in _ACTIVATIONS:
            raise LoweringError(f"{kind} activation {name!r} (disc takes {', '.join(_ACTIVATIONS)})")
    batch = x.shape[1]
    dt = x.dtype
    lens = convert(imp, imp.tensor(sequence_lens), "i64") if sequence_lens is not None else None

    def pick(t: Node, d: int) -> Node:  # direction d of a [dirs, ...] tensor
        return reshape(imp, imp.graph.add("slice", (t, imp.index(d), imp.index(d + 1)), {"axis": 0, "step": 1}), list(t.shape[1:]))

    def cols(t: Node, g: int) -> Node:  # gate g's columns of a [..., gates * hidden] tensor
        return imp.graph.add("slice", (t, imp.index(g * hidden), imp.index((g + 1) * hidden)), {"axis": t.tensor_type.rank - 1, "step": 1})

    def state(v: Any, d: int) -> Node:
        if v is None:
            return broadcast_to(imp, scalar(imp, 0.0, dt), [batch, hidden])
        return pick(imp.tensor(v), d)

    outs, last_h, last_c = [], [], []
    for d in range(dirs):
        act = [_ACTIVATIONS[n] for n in names[d * len(_DEFAULT_ACTIVATIONS[kind]) : (d + 1) * len(_DEFAULT_ACTIVATIONS[kind])]]
        wt = imp.graph.add("transpose", (pick(w, d),), {"perm": (1, 0)})  # [input, gates * hidden]
        rt = imp.graph.add("transpose", (pick(r, d),), {"perm": (1, 0)})
        bias = pick(imp.tensor(b), d) if b is not None else None
        wb = cols_bias = None  # the input and the recurrent halves of B
        if bias is not None:
            wb = imp.graph.add("slice", (bias, imp.index(0), imp.index(gates * hidden)), {"axis": 0, "step": 1})
            cols_bias = imp.graph.add("slice", (bias, imp.index(gates * hidden), imp.index(2 * gates * hidden)), {"axis": 0, "step": 1})
        flat = reshape(imp, x, [as_expr(x.shape[0]) * batch, x.shape[2]])
        projected = matmul(imp, flat, wt)
        if wb is not None:  # (the recurrent bias Rb goes with the recurrent GEMM: GRU's reset gate scales it)
            projected = elementwise(imp, "add", [projected, wb], dt)
        projected = reshape(imp, projected, [x.shape[0], batch, gates * hidden])
        peep = pick(imp.tensor(p), d) if p is not None else None
        h, c = state(initial_h, d), state(initial_c, d)
        backwards = direction == "reverse" or d == 1
        order = reversed(range(steps)) if backwards else range(steps)
        ys: dict[int, Node] = {}
        for t in order:
            xt = reshape(imp, imp.graph.add("slice", (projected, imp.index(t), imp.index(t + 1)), {"axis": 0, "step": 1}), [batch, gates * hidden])
            if kind == "GRU":
                hr = matmul(imp, h, rt)
                if cols_bias is not None:
                    hr = elementwise(imp, "add", [hr, cols_bias], dt)
                z = _gate(imp, act[0], elementwise(imp, "add", [cols(xt, 0), cols(hr, 0)], dt), clip)
                rr = _gate(imp, act[0], elementwise(imp, "add", [cols(xt, 1), cols(hr, 1)], dt), clip)
                if linear_before_reset:
                    cand_in = elementwise(imp, "add", [cols(xt, 2), elementwise(imp, "mul", [rr, cols(hr, 2)], dt)], dt)
                else:
                    rh = matmul(imp, elementwise(imp, "mul", [rr, h], dt), cols(rt, 2))
                    if cols_bias is not None:
                        rh = elementwise(imp, "add", [rh, cols(cols_bias, 2)], dt)
                    cand_in = elementwise(imp, "add", [cols(xt, 2), rh], dt)
                cand = _gate(imp, act[1], cand_in, clip)
                new_h = elementwise(imp, "add", [elementwise(imp, "mul", [elementwise(imp, "sub", [1.0, z], dt), cand], dt), elementwise(imp, "mul", [z, h], dt)], dt)
                new_c = c
            else:
                pre = elementwise(imp, "add", [xt, matmul(imp, h, rt)], dt)
                if cols_bias is not None:
                    pre = elementwise(imp, "add", [pre, cols_bias], dt)
                if kind == "RNN":
                    new_h, new_c = _gate(imp, act[0], pre, clip), c
                else:  # gates i, o, f, c; peepholes i, o, f

                    def peeped(g: int, k: int, cell: Node) -> Node:
                        v = cols(pre, g)
                        return v if peep is None else elementwise(imp, "add", [v, elementwise(imp, "mul", [cols(peep, k), cell], dt)], dt)

                    i = _gate(imp, act[0], peeped(0, 0, c), clip)
                    f = _gate(imp, act[0], peeped(2, 2, c), clip)
                    cand = _gate(imp, act[1], cols(pre, 3), clip)
                    new_c = elementwise(imp, "add", [elementwise(imp, "mul", [f, c], dt), elementwise(imp, "mul", [i, cand], dt)], dt)
                    o = _gate(imp, act[0], peeped(1, 1, new_c), clip)
                    new_h = elementwise(imp, "mul", [o, imp.graph.add(act[2], (new_c,))], dt)
            if lens is not None:  # an entry past its length keeps its state and outputs zeros
                live = reshape(imp, elementwise(imp, "gt", [lens, t], "i64"), [batch, 1])
                new_h, new_c = select(imp, live, new_h, h, dt), select(imp, live, new_c, c, dt)
                ys[t] = select(imp, live, new_h, 0.0, dt)
            else:
                ys[t] = new_h
            h, c = new_h, new_c
        outs.append(imp.graph.add("concat", [reshape(imp, ys[t], [1, 1, batch, hidden]) for t in range(steps)], {"axis": 0}) if steps > 1 else reshape(imp, ys[0], [1, 1, batch, hidden]))
        last_h.append(reshape(imp, h, [1, batch, hidden]))
        last_c.append(reshape(imp, c, [1, batch, hidden]))

    def joined(parts: list[Node], axis: int) -> Node:
        return parts[0] if len(parts) == 1 else imp.graph.add("concat", parts, {"axis": axis})

    y, yh, yc = joined(outs, 1), joined(last_h, 0), joined(last_c, 0)
    if layout:
        y = imp.graph.add("transpose", (y,), {"perm": (2, 0, 1, 3)})
        yh, yc = (imp.graph.add("transpose", (v,), {"perm": (1, 0, 2)}) for v in (yh, yc))
    return [y, yh, yc] if kind == "LSTM" else [y, yh]


def _gate(imp: OnnxImporter, op: str, x: Node, clip: float | None) -> Node:
    if clip is not None:
        x = elementwise(imp, "minimum", [elementwise(imp, "maximum", [x, -clip], x.dtype), clip], x.dtype)
    return imp.graph.add(op, (x,))
