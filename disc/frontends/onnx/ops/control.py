"""Loops whose iteration count is known when the model is compiled: Loop, Scan and SequenceMap
lowered by running their body once per iteration at import time (unrolled).

A loop whose count or continuation is known only at run time has no such form: it is refused
with the reason, as is one of more than ``MAX_UNROLLED`` iterations (its program would grow
with the count).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from disc.frontends.arrays import NeedsValue, known_array
from disc.frontends.onnx.importer import OnnxImporter
from disc.frontends.onnx.ops import onnx_op
from disc.frontends.onnx.ops.common import known_dim
from disc.frontends.onnx.ops.sequence import SequenceValue
from disc.ir.builder import LoweringError, flip, reshape
from disc.ir.graph import Node
from disc.ir.registry import normalize_axis

MAX_UNROLLED = 256


def _stack(imp: OnnxImporter, parts: list[Any], axis: int, what: str) -> Node:
    """Per-iteration values joined along a new ``axis`` (a scan output)."""
    if not parts:
        raise LoweringError(f"{what}: a scan output of no iterations (its element shape is unknown)")
    tensors = [imp.tensor(p) for p in parts]
    rank = tensors[0].tensor_type.rank
    axis = normalize_axis(axis, rank + 1, what)
    expanded = [reshape(imp, t, [*t.shape[:axis], 1, *t.shape[axis:]]) for t in tensors]
    return expanded[0] if len(expanded) == 1 else imp.graph.add("concat", tuple(expanded), {"axis": axis})


def _flag(v: Any, what: str) -> bool:
    """A loop's continuation, known when the model is compiled (from a caller's input: per value)."""
    return bool(_known_loop_value(v, what)[0])


def _known_loop_value(v: Any, what: str) -> np.ndarray:
    try:
        return known_array(v, what)
    except NeedsValue:
        raise
    except LoweringError:
        raise LoweringError(f"{what} is computed at run time: disc unrolls loops whose count and continuation are known when the model is compiled") from None


@onnx_op("Loop")
def _loop(imp: OnnxImporter, node: Any, trip_count: Any = None, cond: Any = None, *carried: Any, body: Any) -> list[Any]:
    """The body run while its condition holds, up to the trip count: each run's loop-carried
    outputs feed the next; scan outputs are stacked along a new first axis."""
    limit = int(_known_loop_value(trip_count, "Loop's trip count")[0]) if trip_count is not None else None
    going = _flag(cond, "Loop's condition") if cond is not None else True
    state = list(carried)
    scans: list[list[Any]] = []
    i = 0
    while going and (limit is None or i < limit):
        if i >= MAX_UNROLLED:
            raise LoweringError(f"Loop of more than {MAX_UNROLLED} iterations: disc unrolls loops, and stops there")
        outs = imp.call_graph(body, [np.array(i, np.int64), np.array(going), *state])
        if len(outs) < 1 + len(state):
            raise LoweringError(f"Loop's body gives {len(outs)} outputs for {len(state)} loop-carried values")
        going = _flag(outs[0], "Loop's condition")
        state = outs[1 : 1 + len(state)]
        step_scans = outs[1 + len(carried) :]
        if not scans:
            scans = [[] for _ in step_scans]
        for kept, v in zip(scans, step_scans):
            kept.append(v)
        i += 1
    if i == 0:
        scan_count = len(body.output) - 1 - len(carried)
        if scan_count:
            raise LoweringError("Loop of no iterations with scan outputs (their element shape is unknown)")
    return state + [_stack(imp, kept, 0, "Loop") for kept in scans]


@onnx_op("Scan")
def _scan(
    imp: OnnxImporter, node: Any, *operands: Any, body: Any, num_scan_inputs: int, scan_input_axes: Any = None, scan_input_directions: Any = None,
    scan_output_axes: Any = None, scan_output_directions: Any = None,
) -> list[Any]:
    """The body run once per slice of the scan inputs along their axes (backwards where a
    direction is 1), carrying its state values; scan outputs stacked along their axes."""
    state = list(operands[: len(operands) - num_scan_inputs])
    inputs = [imp.tensor(v) for v in operands[len(operands) - num_scan_inputs :]]
    in_axes = [normalize_axis(a, t.tensor_type.rank, "Scan") for a, t in zip(scan_input_axes or [0] * len(inputs), inputs)]
    in_dirs = list(scan_input_directions or [0] * len(inputs))
    lengths = {known_dim(t.shape[a]) for t, a in zip(inputs, in_axes)}
    if len(lengths) != 1 or None in lengths:
        raise LoweringError(f"Scan over lengths {[t.shape[a] for t, a in zip(inputs, in_axes)]}: disc unrolls scans whose length is known when the model is compiled (and one for all inputs)")
    (steps,) = lengths
    if steps > MAX_UNROLLED:
        raise LoweringError(f"Scan of {steps} steps: disc unrolls scans, up to {MAX_UNROLLED} steps")
    scans: list[list[Any]] = []
    for step in range(steps):
        slices = []
        for t, a, d in zip(inputs, in_axes, in_dirs):
            at = steps - 1 - step if d else step
            piece = imp.graph.add("slice", (t, imp.index(at), imp.index(at + 1)), {"axis": a, "step": 1})
            slices.append(reshape(imp, piece, [s for j, s in enumerate(t.shape) if j != a]))
        outs = imp.call_graph(body, [*state, *slices])
        state = outs[: len(state)]
        if not scans:
            scans = [[] for _ in outs[len(state) :]]
        for kept, v in zip(scans, outs[len(state) :]):
            kept.append(v)
    out_axes = list(scan_output_axes or [0] * len(scans))
    out_dirs = list(scan_output_directions or [0] * len(scans))
    stacked = []
    for kept, a, d in zip(scans, out_axes, out_dirs):
        joined = _stack(imp, kept, a, "Scan")
        stacked.append(flip(imp, joined, [normalize_axis(a, joined.tensor_type.rank, "Scan")]) if d else joined)
    return state + stacked


@onnx_op("SequenceMap")
def _sequence_map(imp: OnnxImporter, node: Any, sequence: Any, *others: Any, body: Any) -> list[SequenceValue]:
    """The body applied to each position of the sequences (a tensor operand is passed whole to
    every application); each body output becomes a sequence."""
    if not isinstance(sequence, SequenceValue):
        raise LoweringError("SequenceMap's first input must be a sequence")
    count = len(sequence.items)
    for v in others:
        if isinstance(v, SequenceValue) and len(v.items) != count:
            raise LoweringError(f"SequenceMap over sequences of {count} and {len(v.items)} elements")
    results: list[list[Any]] = [[] for _ in body.output]
    for i in range(count):
        args = [sequence.items[i], *(v.items[i] if isinstance(v, SequenceValue) else v for v in others)]
        for kept, v in zip(results, imp.call_graph(body, args)):
            kept.append(v)
    return [SequenceValue(tuple(kept)) for kept in results]
