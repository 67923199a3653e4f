"""The Triton program explained: kernels and their speculation versions, library calls, memory plan."""

from __future__ import annotations

from typing import Any

from disc.codegen.lowering import distinct_kernels


def describe_triton(build: Any) -> list[str]:
    """Lines for ``disc.explain``: what the GPU program launches per call, and where its memory goes."""
    from disc.runtime.triton_runtime import interpreting

    lp, src = build.lowered, build.source
    counts = lp.counts()
    where = "Triton's interpreter on the CPU" if interpreting() else "the GPU"
    lines = [
        f"-- backend: Triton program (runs on {where}) --",
        f"  generated in {build.seconds:.2f}s; source: {build.path}",
        f"  per call: {counts['memory_bound']} memory-bound kernels ({len(src.kernels)} distinct), {counts['library']} library calls (torch: cuBLAS / cuDNN)",
        f"  GEMM operands read through strides instead of copies: {lp.describe_folded_views()}",
    ]
    if build.compiled:
        forms = len({id(f) for f in build.compiled.values()})
        lines.append(f"  compiled ahead of the first call: {forms} kernel forms in {build.compile_seconds:.2f}s (no shape compiles at run time)")
        lines.append("  CUDA graphs: a shape is recorded at its second call and replayed after (DISC_CUDA_GRAPHS shapes, DISC_CUDA_GRAPH_MB MiB)")
    lines += [
        "",
        "-- kernels (speculation versions; the first whose condition holds runs) --",
    ]
    for call, uses in distinct_kernels(src.calls):
        ops = ", ".join(n.op for n in call.step.group.nodes)
        lines.append(f"  {call.kernel.name} x{uses}: [{ops}]")
        for v in call.kernel.versions:
            launch = ", ".join(f"{k}={val}" for k, val in v.constexprs.items())
            lines.append(f"    version {v.label}: when {v.condition}; {v.grid} programs, {launch}")
    lines += ["", "-- memory plan (one workspace; slots never live together share bytes, placed per call) --"]
    lines += lp.describe_slots()
    return lines
