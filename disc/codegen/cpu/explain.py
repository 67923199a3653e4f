"""The native program explained: kernels and their speculation versions, library calls, memory plan."""

from __future__ import annotations

from typing import Any

from disc.codegen.lowering import LibraryStep, distinct_kernels


def describe_native(native: Any) -> list[str]:
    """Lines for ``disc.explain``: what the native CPU program runs, per call, and where its memory goes."""
    from disc.runtime.ral import load_ral

    lp, src = native.lowered, native.source
    counts = lp.counts()
    lines = [
        "-- backend: native CPU program --",
        f"  built in {native.seconds:.2f}s ({'from the cache' if native.build.cached else 'compiled'}); source: {native.build.source_path}",
        f"  per call: {counts['memory_bound']} memory-bound kernels ({len(src.kernels)} distinct functions), "
        f"{counts['library']} library calls ({load_ral().gemm_library})",
        f"  GEMM operands read through strides instead of copies: {lp.describe_folded_views()}",
        *[f"  {s.node.op} %{s.node.name} computes its epilogue: {s.epilogue.describe()}" for s in lp.steps if isinstance(s, LibraryStep) and s.epilogue is not None],
        "",
        "-- kernels (speculation versions; the first whose condition holds runs) --",
    ]
    for call, uses in distinct_kernels(src.calls):
        ops = ", ".join(n.op for n in call.step.group.nodes)
        lines.append(f"  {call.kernel.name} x{uses}: [{ops}]")
        if len(call.kernel.versions) > 1:
            for label, cond in zip(call.kernel.versions, call.kernel.conditions):
                lines.append(f"    version {label}: when {cond}")
    lines += [
        "",
        "-- memory plan (buffers of provably equal size with disjoint lifetimes share a slot; each call packs",
        "   slots never live together into the same bytes, at that call's sizes) --",
        f"  workspace bytes <= {src.workspace_bound} (all slots side by side, each aligned to 64 B)",
    ]
    lines += lp.describe_slots()
    return lines
