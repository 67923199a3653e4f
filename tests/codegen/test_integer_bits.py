"""Unsigned integers (u8 to u64), shifts and bitcasts in the generated C++ and the reference.

Expected values come from Python integers (exact), not from either executor: unsigned
arithmetic wraps modulo 2^bits, division truncates (the floor, for non-negative operands), a
shift by an amount outside [0, bits) gives the sign fill alone (ONNX's BitShift, PyTorch's
shifts), and a bitcast keeps every bit (numpy's ``view``).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from kernel_cases import op_graph

from disc.ir.graph import Graph
from disc.ir.types import TensorType, numpy_dtype
from disc.runtime.native import NativeExecutor, build_native
from disc.runtime.reference import ReferenceExecutor

UNSIGNED = ["u8", "u16", "u32", "u64"]
SIGNED = ["i8", "i16", "i32", "i64"]
BITS = {"u8": 8, "u16": 16, "u32": 32, "u64": 64, "i8": 8, "i16": 16, "i32": 32, "i64": 64}


def _wrap(v: int, dtype: str) -> int:
    bits = BITS[dtype]
    v %= 1 << bits
    return v - (1 << bits) if dtype.startswith("i") and v >= 1 << (bits - 1) else v


def _operands(dtype: str, n: int, nonzero_b: bool) -> tuple[np.ndarray, np.ndarray]:
    """n values of each operand: the type's extremes and neighbours first, then random ones."""
    info = np.iinfo(numpy_dtype(dtype))
    rng = np.random.default_rng(BITS[dtype])
    edges = [0, 1, 2, info.max, info.max - 1, info.min, 7, info.max // 3]
    a = [edges[i] if i < len(edges) else int(rng.integers(info.min, info.max, endpoint=True, dtype=numpy_dtype(dtype))) for i in range(n)]
    b = [[3, info.max, 1, 2, info.max, 5, 7, 1][i] if i < 8 else int(rng.integers(info.min, info.max, endpoint=True, dtype=numpy_dtype(dtype))) for i in range(n)]
    if nonzero_b:
        b = [v or 1 for v in b]
    return np.array(a, dtype=numpy_dtype(dtype)), np.array(b, dtype=numpy_dtype(dtype))


def _run_native(g: Graph, *arrays: np.ndarray) -> np.ndarray:
    return NativeExecutor(g, build_native(g)).run([torch.from_numpy(a) for a in arrays])[0].numpy()


EXPECT = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a // b,
    "floor_div": lambda a, b: a // b,
    "remainder": lambda a, b: a % b,
    "fmod": lambda a, b: a % b,
    "maximum": max,
    "minimum": min,
    "bitwise_xor": lambda a, b: a ^ b,
    "lt": lambda a, b: a < b,
    "ge": lambda a, b: a >= b,
}


@pytest.mark.parametrize("dtype", UNSIGNED)
@pytest.mark.parametrize("op", list(EXPECT))
@pytest.mark.parametrize("n", [1, 13])
def test_unsigned_ops_wrap_and_divide_exactly(dtype, op, n):
    a, b = _operands(dtype, n, nonzero_b=True)
    g = op_graph(op, dtype, 2)
    got = _run_native(g, a, b)
    want = [EXPECT[op](int(x), int(y)) for x, y in zip(a, b)]
    if op in ("lt", "ge"):
        assert got.dtype == np.bool_ and got.tolist() == want
    else:
        assert got.dtype == numpy_dtype(dtype) and got.tolist() == [_wrap(v, dtype) for v in want], (got, want)
    ref = ReferenceExecutor(g).run([torch.from_numpy(a), torch.from_numpy(b)])[0].numpy()
    assert np.array_equal(ref, got)


@pytest.mark.parametrize("dtype", UNSIGNED)
def test_unsigned_division_by_zero_raises(dtype):
    g = op_graph("div", dtype, 2)
    a, b = np.array([4, 5], numpy_dtype(dtype)), np.array([2, 0], numpy_dtype(dtype))
    with pytest.raises(Exception, match="ZeroDivisionError: an integer division or remainder by zero"):
        _run_native(g, a, b)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):  # as PyTorch's integer division
        ReferenceExecutor(g).run([torch.from_numpy(a), torch.from_numpy(b)])


@pytest.mark.parametrize("dtype", SIGNED + UNSIGNED)
def test_shifts_by_every_amount_follow_onnx(dtype):
    bits = BITS[dtype]
    info = np.iinfo(numpy_dtype(dtype))
    values = [0, 1, 5, info.max, info.min, info.min + 3, -1 if dtype in SIGNED else 200 % (info.max + 1)]
    amounts = list(range(-2 if dtype in SIGNED else 0, bits + 3))
    x = np.array([v for v in values for _ in amounts], numpy_dtype(dtype))
    y = np.array([s for _ in values for s in amounts], numpy_dtype(dtype))
    for op in ("shift_left", "shift_right"):
        g = op_graph(op, dtype, 2)
        got = _run_native(g, x, y)
        want = []
        for v, s in zip(x.tolist(), y.tolist()):
            if not 0 <= s < bits:
                want.append(-1 if op == "shift_right" and v < 0 else 0)
            else:
                want.append(_wrap(v << s, dtype) if op == "shift_left" else v >> s)
        assert got.tolist() == want, (op, dtype)
        ref = ReferenceExecutor(g).run([torch.from_numpy(x), torch.from_numpy(y)])[0].numpy()
        assert np.array_equal(ref, got), (op, dtype)


def _bitcast_graph(source: str, target: str) -> Graph:
    g = Graph(name="bitcast")
    n = g.constraints.declare("n", lo=0, source="test")
    x = g.add_input("x", TensorType(source, (n,)))
    g.outputs = [g.add("bitcast", [x], {"dtype": target})]
    return g


def _bits_of(dtype: str, n: int) -> np.ndarray:
    """n values of ``dtype`` covering its bit patterns' kinds (NaN, inf, subnormal, negative zero).
    A 16-bit float is computed in float, and rounding a NaN back gives the canonical NaN (as
    PyTorch's conversions do): its other NaN patterns are replaced by that one."""
    rng = np.random.default_rng(n)
    width = 8 * numpy_dtype(dtype).itemsize
    raw = rng.integers(0, 1 << min(width, 63), size=n, dtype=np.uint64)
    out = raw.astype(f"u{width // 8}").view(numpy_dtype(dtype)).copy()
    if dtype in ("f16", "f32", "f64"):
        special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, np.finfo(numpy_dtype(dtype)).smallest_subnormal, 1.5], numpy_dtype(dtype))
        out[: min(n, len(special))] = special[: min(n, len(special))]
    if dtype == "f16":
        out[np.isnan(out)] = np.nan
    if dtype == "i1":
        out = rng.integers(0, 2, size=n).astype(bool)
    return out


@pytest.mark.parametrize(
    "source, target",
    [("f32", "i32"), ("i32", "f32"), ("f16", "i16"), ("i16", "f16"), ("f64", "u64"), ("u64", "f64"), ("u32", "i32"), ("i8", "u8"), ("i1", "u8"), ("f16", "u16")],
)
@pytest.mark.parametrize("n", [1, 11])
def test_bitcast_keeps_every_bit(source, target, n):
    x = _bits_of(source, n)
    if target == "f16":  # computed in float: a NaN comes out as the canonical one (see _bits_of)
        x[np.isnan(x.view(np.float16))] = np.array(np.nan, np.float16).view(x.dtype)
    got = _run_native(_bitcast_graph(source, target), x)
    want = x.view(numpy_dtype(target)) if source != "i1" else x.astype(np.uint8)
    assert got.dtype == want.dtype and np.array_equal(got.view(np.uint8), want.view(np.uint8)), (got, want)
    ref = ReferenceExecutor(_bitcast_graph(source, target)).run([torch.from_numpy(x)])[0].numpy()
    assert np.array_equal(ref.view(np.uint8), want.view(np.uint8))


def test_bitcast_of_bf16_keeps_its_bits():
    x = torch.tensor([1.0, -0.0, float("inf"), float("nan"), 3.140625, -1e-40], dtype=torch.bfloat16)
    g = _bitcast_graph("bf16", "i16")
    got = NativeExecutor(g, build_native(g)).run([x])[0]
    assert torch.equal(got, x.view(torch.int16))
    back = _bitcast_graph("i16", "bf16")
    assert torch.equal(NativeExecutor(back, build_native(back)).run([got])[0].view(torch.int16), x.view(torch.int16))


def test_bitcast_refuses_another_width():
    from disc.ir.registry import ShapeRuleError

    with pytest.raises(ShapeRuleError, match="keeps the width"):
        _bitcast_graph("f32", "i64")
