"""The compiler's core works where PyTorch cannot be imported.

In a process where ``import torch`` fails, an IR text with numpy constants is parsed, optimised by
the pass pipeline, fused, lowered, turned into C++, built and run through the RAL at several
shapes (size 1 first), and compared with numpy. Nothing on this path may import torch: a future
ONNX or TensorFlow frontend hands the core exactly such a graph.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# gelu -> linear (a constant weight, transposed) -> + bias -> softmax -> * 2 + 1, with a
# multiplication by one and a repeated exp for the passes to remove.
IR = """func @core(%x: f32[b, 8]) {
  sym b in [1, inf]  (input 'x' dim 0)
  %w = constant() {dtype="f32", ref="w", value=none} : f32[4, 8]
  %bias = constant() {dtype="f32", ref="bias", value=none} : f32[4]
  %0 = dim(%x) {axis=0} : index(b)
  %one = constant() {dtype="f32", ref=none, value=1.0} : f32[]
  %k8 = index_const() {value=8} : index(8)
  %ones = broadcast_in_dim(%one, %0, %k8) {dims=[]} : f32[b, 8]
  %1 = gelu(%x) : f32[b, 8]
  %1b = mul(%1, %ones) : f32[b, 8]
  %2 = transpose(%w) {perm=[1, 0]} : f32[8, 4]
  %3 = dot_general(%1b, %2) {lhs_batch=[], lhs_contract=[1], rhs_batch=[], rhs_contract=[0]} : f32[b, 4]
  %4 = index_const() {value=4} : index(4)
  %5 = broadcast_in_dim(%bias, %0, %4) {dims=[1]} : f32[b, 4]
  %6 = add(%3, %5) : f32[b, 4]
  %7 = reduce(%6) {dims=[1], keepdim=true, kind="max"} : f32[b, 1]
  %8 = broadcast_in_dim(%7, %0, %4) {dims=[0, 1]} : f32[b, 4]
  %9 = sub(%6, %8) : f32[b, 4]
  %10 = exp(%9) : f32[b, 4]
  %10b = exp(%9) : f32[b, 4]
  %11 = reduce(%10b) {dims=[1], keepdim=true, kind="sum"} : f32[b, 1]
  %12 = broadcast_in_dim(%11, %0, %4) {dims=[0, 1]} : f32[b, 4]
  %13 = div(%10, %12) : f32[b, 4]
  %14 = constant() {dtype="f32", ref=none, value=2.0} : f32[]
  %15 = broadcast_in_dim(%14, %0, %4) {dims=[]} : f32[b, 4]
  %16 = mul(%13, %15) : f32[b, 4]
  %17 = constant() {dtype="f32", ref=none, value=1.0} : f32[]
  %18 = broadcast_in_dim(%17, %0, %4) {dims=[]} : f32[b, 4]
  %19 = add(%16, %18) : f32[b, 4]
  return %19
}
"""

SCRIPT = r"""
import sys
sys.modules["torch"] = None  # any `import torch` now fails
import ctypes, math
import numpy as np
from disc.codegen.cpu.program import build_options, native_source
from disc.codegen.cpu.toolchain import build
from disc.ir.parser import parse_graph
from disc.ir.verifier import verify
from disc.passes.pipeline import run_pipeline
from disc.runtime.ral_build import build_ral

rng = np.random.default_rng(0)
w, bias = rng.standard_normal((4, 8)).astype(np.float32), rng.standard_normal(4).astype(np.float32)
graph = parse_graph(sys.stdin.read(), constants={"w": w, "bias": bias})
verify(graph)
before = [n.op for n in graph.nodes]
graph = run_pipeline(graph)
after = [n.op for n in graph.nodes]
assert after.count("exp") == 1 and after.count("mul") < before.count("mul"), after  # CSE and x*1 ran
lowered, source = native_source(graph)
assert lowered.counts() == {"memory_bound": 2, "library": 1}, lowered.counts()
lib = ctypes.CDLL(str(build(source.text, "disc_core_without_torch", **build_options()).path))
ral = ctypes.CDLL(str(build_ral().path))
ral.disc_ral_cpu.restype = ctypes.c_void_p
table = ral.disc_ral_cpu()

class Ctx(ctypes.Structure):
    _fields_ = [("failed", ctypes.c_int32), ("error", ctypes.c_char * 1020)]

erf = np.vectorize(math.erf)
for b in (1, 2, 7):
    x = rng.standard_normal((b, 8)).astype(np.float32)
    ctx, ws, out_dims = Ctx(), ctypes.c_int64(0), (ctypes.c_int64 * 2)()
    dims = (ctypes.c_int64 * 2)(b, 8)
    assert lib.disc_shapes(dims, out_dims, ctypes.byref(ws), ctypes.byref(ctx)) == 0, ctx.error
    out = np.empty(tuple(out_dims), np.float32)
    workspace = np.empty(ws.value + 64, np.uint8)
    consts = [np.ascontiguousarray(graph.constants[name]) for name in source.constants]
    const_ptrs = (ctypes.c_void_p * max(len(consts), 1))(*[c.ctypes.data for c in consts])
    rc = lib.disc_run(ctypes.c_void_p(table), ctypes.byref(ctx), dims, (ctypes.c_void_p * 1)(x.ctypes.data), const_ptrs,
                      (ctypes.c_void_p * 1)(out.ctypes.data), ctypes.c_void_p((workspace.ctypes.data + 63) & ~63), None)
    assert rc == 0, ctx.error
    h = x.astype(np.float64)
    h = 0.5 * h * (1 + erf(h / math.sqrt(2))) @ w.T.astype(np.float64) + bias
    e = np.exp(h - h.max(1, keepdims=True))
    want = e / e.sum(1, keepdims=True) * 2 + 1
    assert out.shape == (b, 4) and np.abs(out - want).max() < 1e-5, (b, np.abs(out - want).max())
assert sys.modules.get("torch") is None
print("core without torch: ok")
"""


def test_the_core_compiles_and_runs_a_graph_without_torch() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], input=IR, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().endswith("core without torch: ok")


BUILDER_SCRIPT = r"""
import sys
sys.modules["torch"] = None
from disc.ir.builder import GraphBuilder, LoweringError, elementwise, reduce, reshape
from disc.ir.printer import print_graph
from disc.ir.types import TensorType
from disc.ir.verifier import verify
from disc.shape.expr import SymExpr

b = GraphBuilder("built")
x = b.graph.add_input("x", TensorType("f32", (SymExpr.symbol("n"), 8)))
bias = b.graph.add_input("bias", TensorType("f32", (8,)))
b.register_dims(x)
y = elementwise(b, "add", [x, bias], "f32")      # bias broadcast along n
z = reshape(b, reduce(b, y, [1], "sum", True), [x.shape[0]])
b.graph.outputs = [elementwise(b, "mul", [z, 2.0], "f32")]
verify(b.graph)
text = print_graph(b.graph)
assert "broadcast_in_dim(%bias" in text and "dim(%x) {axis=0}" in text, text
try:
    elementwise(b, "add", [x, b.graph.add_input("w", TensorType("f32", (3, 4, 5)))], "f32")
except Exception as e:
    assert "8" in str(e) and "5" in str(e), e  # names the dims that cannot broadcast
else:
    raise AssertionError("[n, 8] + [3, 4, 5] was accepted")
print("builder without torch: ok")
"""


def test_frontends_build_ir_with_the_cores_builder_without_torch() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", BUILDER_SCRIPT], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().endswith("builder without torch: ok")
