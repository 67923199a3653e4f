"""The native backend's innermost loops are vectorised, as GCC itself reports (-fopt-info-vec) when
it compiles them with the flags a program is built with, on whatever x86 level this host has.

A loop left scalar runs 4-16x slower and no numerical test notices: on an AVX2 host GCC left the
GELU and exp loops scalar until -fno-trapping-math (bias + GELU 10x slower, softmax 3x)."""

from __future__ import annotations

import re
import subprocess

import pytest
import torch
from kernel_cases import BINARY_F32, UNARY_F32, BiasGelu, ConvPool, Elementwise, MaskedSoftmax, Norms, RowSum, op_graph

import disc
from disc.codegen.cpu import toolchain
from disc.codegen.cpu.program import emit_program
from disc.codegen.lowering import lower
from disc.runtime.native import build_options

# fmod has no vector version in glibc's libmvec: these three stay scalar (rare in models).
SCALAR_OPS = {"floor_div", "remainder", "fmod"}


def innermost_kernel_loops(source: str) -> list[range]:
    """The lines (1-based) of each innermost ``for`` loop inside the kernels of ``source``."""
    lines = source.splitlines()
    loops, in_kernel = [], False
    for n, line in enumerate(lines, 1):
        if line.startswith("DISC_HIDDEN void") and line.endswith("{"):
            in_kernel = True
        elif line == "}":
            in_kernel = False
        elif in_kernel and line.lstrip().startswith("for ("):
            indent = len(line) - len(line.lstrip())
            body = []
            for later in lines[n:]:
                if later.strip() and len(later) - len(later.lstrip()) <= indent:
                    break
                body.append(later)
            if not any(b.lstrip().startswith("for (") for b in body):
                loops.append(range(n, n + len(body) + 1))
    return loops


def scalar_loops(source: str, tmp_path) -> list[tuple[int, str]]:
    """The innermost kernel loops of ``source`` that GCC did not vectorise: (line, the line before)."""
    cc = tmp_path / "program.cc"
    cc.write_text(source)
    flags = [f for f in toolchain.BASE_FLAGS if f != "-shared"] + list(build_options()["flags"])
    cmd = [toolchain.find_compiler(), *flags, f"-I{toolchain.RAL_INCLUDE_DIR}", "-fopt-info-vec-optimized"]
    proc = subprocess.run([*cmd, "-c", str(cc), "-o", str(tmp_path / "program.o")], capture_output=True, text=True, check=True)
    # GCC names a vectorised loop by its `for` line, a line of its body or (GCC 12 on a Sapphire
    # Rapids, for a loop with two reductions) the `#pragma omp simd` line above it.
    vectorised = {int(m.group(1)) for m in re.finditer(r"program\.cc:(\d+):\d+: optimized: loop vectorized", proc.stderr)}
    loops = innermost_kernel_loops(source)
    assert loops, "the program has no kernel loop to check"
    lines = source.splitlines()

    def named(loop: range) -> bool:
        pragma = loop.start - 1 if lines[loop.start - 2].lstrip().startswith("#pragma omp simd") else loop.start
        return bool(vectorised.intersection(range(pragma, loop.stop)))

    # the line above the loop's pragma tells its version apart (a branch such as `} else {`)
    return [(loop.start, lines[loop.start - 3].strip()) for loop in loops if not named(loop)]


@pytest.mark.parametrize("op", [op for op in UNARY_F32 + BINARY_F32 if op not in SCALAR_OPS])
def test_every_float_op_loop_is_vectorised(op, tmp_path):
    source = emit_program(lower(op_graph(op, "f32", 2 if op in BINARY_F32 else 1))).text
    assert scalar_loops(source, tmp_path) == []


class MaskTimes(torch.nn.Module):
    """A dropout-like mask: kept as bool and multiplied in as float (bool -> float casts stayed scalar on AVX2)."""

    def forward(self, x):
        keep = x > 0.5
        return keep, x * keep.float() * 2.0


class ReadMask(torch.nn.Module):
    """A dropout backward: a saved bool mask read from memory, as a select and as a float (a loaded
    bool in a select or a conversion stayed scalar on AVX2)."""

    def forward(self, x, keep):
        return torch.where(keep, x, 0.0) + keep.float() * 1.25, torch.where(keep, x * x, 0.0).sum(-1)


class ColumnReductions(torch.nn.Module):
    """Bias gradients: sums (and a max) over the rows, each thread's partial row combined at the end."""

    def forward(self, x):
        return (x * 2.0).sum(0), x.amax(0)


@pytest.mark.parametrize(
    "module, args, dynamic",
    [
        (BiasGelu(), (torch.randn(6, 24),), {"x": {0: "n"}}),
        (Elementwise(), (torch.randn(5, 7), torch.randn(5, 7)), {"x": {0: "a", 1: "b"}, "y": {0: "a", 1: "b"}}),
        (Norms(), (torch.randn(2, 3, 40), torch.randn(2, 3, 40)), {"x": {0: "b", 1: "s"}, "r": {0: "b", 1: "s"}}),
        (MaskedSoftmax(), (torch.randn(2, 4, 5, 9), torch.ones(2, 9)), {"s": {0: "b", 2: "q", 3: "k"}, "mask": {0: "b", 1: "k"}}),
        (RowSum(), (torch.randn(6, 33),), {"x": {0: "n", 1: "m"}}),
        (MaskTimes(), (torch.randn(6, 33),), {"x": {0: "n", 1: "m"}}),
        (ReadMask(), (torch.randn(6, 33), torch.rand(6, 33) > 0.5), {"x": {0: "n", 1: "m"}, "keep": {0: "n", 1: "m"}}),
        (ColumnReductions(), (torch.randn(6, 33),), {"x": {0: "n", 1: "m"}}),
    ],
    ids=[
        "bias-gelu",
        "select-exp-tanh-sqrt",
        "layernorm-rmsnorm",
        "masked-softmax",
        "row-reductions",
        "bool-mask-to-float",
        "bool-mask-read",
        "column-reductions",
    ],
)
def test_fused_kernels_are_vectorised_in_every_loop(module, args, dynamic, tmp_path):
    cm = disc.compile(module, args, dynamic=dynamic, backend="native")
    assert scalar_loops(cm.executor.native.source.text, tmp_path) == []


def test_max_pool_interior_windows_are_vectorised(tmp_path):
    """The windows inside the image read without masks and must vectorise (on AVX2 they did not
    while disc_max was one select on `a != a || a > b`: 2.4 ms of ResNet-18's 26 ms at 224x224).
    The border windows' masked loads may stay scalar: they are the edge rows only."""
    cm = disc.compile(ConvPool(), (torch.randn(1, 3, 20, 24),), dynamic={"x": {0: "b", 2: "h", 3: "w"}}, backend="native")
    source = cm.executor.native.source.text
    assert "reduce_window" in source
    assert [(line, before) for line, before in scalar_loops(source, tmp_path) if before != "} else {"] == []


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("module, shape", [(BiasGelu(), (6, 24)), (Norms(), (2, 3, 40))], ids=["bias-gelu", "layernorm-rmsnorm"])
def test_16_bit_kernels_are_vectorised_in_every_loop(module, shape, dtype, tmp_path):
    # Their loads widen and their stores round in integer steps (bf16) or through _Float16:
    # both must stay inside vector loops, or a bf16 model runs its kernels scalar.
    module = module.to(dtype)
    n = len(module.forward.__code__.co_varnames[1 : module.forward.__code__.co_argcount])
    args = tuple(torch.randn(shape, dtype=dtype) for _ in range(n))
    names = module.forward.__code__.co_varnames[1 : 1 + n]
    cm = disc.compile(module, args, dynamic={k: {0: "b"} for k in names}, backend="native")
    assert scalar_loops(cm.executor.native.source.text, tmp_path) == []
