"""Built programs explained for ``disc.explain``: what the native CPU program and the Triton GPU
program run per call (kernels and their speculation versions, library calls) and where their
memory goes. Reads a build (``codegen/cpu/build.py``, ``runtime/triton_runtime.py``) and, for a
profiling build, its counters; the code generators know nothing of it."""

from __future__ import annotations

from typing import Any

from disc.codegen.cpu.build import step_profile
from disc.codegen.cpu.program import KernelCall
from disc.codegen.lowering import LibraryStep, distinct_kernels


def _gemm_library() -> str:
    try:  # the RAL's Python binding runs through torch; without it the program runs in disc_runtime
        from disc.runtime.ral import load_ral
    except ImportError:
        return "the runtime library's GEMM"
    return load_ral().gemm_library


def describe_native(native: Any) -> list[str]:
    """Lines for ``disc.explain``: what the native CPU program runs, per call, and where its memory goes."""
    lp, src = native.lowered, native.source
    counts = lp.counts()
    lines = [
        "-- backend: native CPU program --",
        f"  built in {native.seconds:.2f}s ({'from the cache' if native.build.cached else 'compiled'}); source: {native.build.source_path}",
        f"  per call: {counts['memory_bound']} memory-bound kernels ({len(src.kernels)} distinct functions), "
        f"{counts['library']} library calls ({_gemm_library()})",
        f"  GEMM operands read through strides instead of copies: {lp.describe_folded_views()}",
        *[f"  {s.node.op} %{s.node.name} computes its epilogue: {s.epilogue.describe()}" for s in lp.steps if isinstance(s, LibraryStep) and s.epilogue is not None],
        "",
        "-- kernels (speculation versions; the first whose condition holds runs) --",
    ]
    steps = _step_counters(native)
    ran = _versions_run(native, steps) if steps is not None else None
    for call, uses in distinct_kernels(src.calls):
        ops = ", ".join(n.op for n in call.step.group.nodes)
        name = call.kernel.name
        timing = f" ({ran[name]['ns'] / 1e6:.3f} ms in {_launches(sum(ran[name]['hits'].values()))})" if ran is not None else ""
        lines.append(f"  {name} x{uses}: [{ops}]{timing}")
        if len(call.kernel.versions) > 1:
            for label, cond in zip(call.kernel.versions, call.kernel.conditions):
                count = f": {_launches(ran[name]['hits'].get(label, 0))}" if ran is not None else ""
                lines.append(f"    version {label}: when {cond}{count}")
    if steps is not None and ran is not None:
        library = ran.get(None, {"ns": 0, "hits": {}})
        lines.append(
            f"  (a profiling build, DISC_PROFILE=1: launches and times of every call of this library in this process; "
            f"library calls {library['ns'] / 1e6:.3f} ms in {sum(library['hits'].values())} calls)"
        )
        lines += _library_sites(native, steps)
    lines += [
        "",
        "-- memory plan (buffers of provably equal size with disjoint lifetimes share a slot; each call packs",
        "   slots never live together into the same bytes, at that call's sizes) --",
        f"  workspace bytes <= {src.workspace_bound} (all slots side by side, each aligned to 64 B)",
        *[f"  {sym} is a count known mid-call: sized at its bound {bound} until its nonzero has run" for sym, bound in src.counts.items()],
    ]
    lines += lp.describe_slots()
    return lines


def _library_sites(native: Any, steps: list[dict], top: int = 12) -> list[str]:
    """A profiling build's library calls by kind (op, operand and result types, whether B is a
    constant weight the RAL may keep packed), the most expensive first: which GEMMs and
    convolutions the library time goes to, e.g. attention's batched GEMMs against the projections."""
    lp = native.lowered
    sites: dict[str, list[int]] = {}  # kind -> [ns, calls, sites]
    for call, step in zip(native.source.calls, steps):
        if isinstance(call, KernelCall):
            continue
        n = call.node
        operands = " x ".join(str(v.base.type) for v in call.operands)
        weight = len(call.operands) > 1 and lp.location[call.operands[1].base][0] == "const"
        kind = f"{n.op} {operands} -> {n.type}" + (" (constant weight)" if weight else "")
        row = sites.setdefault(kind, [0, 0, 0])
        row[0] += step["ns"]
        row[1] += sum(step["calls"].values())
        row[2] += 1
    if not sites:
        return []
    total = sum(r[0] for r in sites.values()) or 1
    lines = ["", "-- library calls by kind (profiling build; most time first) --"]
    for kind, (ns, calls, count) in sorted(sites.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"  {ns / 1e6:9.3f} ms {100 * ns / total:5.1f}%  {count} site(s), {_launches(calls)}: {kind}")
    if len(sites) > top:
        lines.append(f"  ... and {len(sites) - top} more kinds")
    return lines


def _launches(n: int) -> str:
    return f"{n} launch" if n == 1 else f"{n} launches"


def _step_counters(native: Any) -> list[dict] | None:
    """Each step's nanoseconds and launches per version so far, read once per explanation; None
    unless the program is a profiling build."""
    try:
        return step_profile(native)
    except (RuntimeError, OSError):
        return None  # built without the counters (or its library can no longer be opened)


def _versions_run(native: Any, steps: list[dict]) -> dict[str | None, dict]:
    """Per kernel function (None: the library calls together), nanoseconds and launches per
    speculation version so far."""
    out: dict[str | None, dict] = {}
    for call, step in zip(native.source.calls, steps):
        name = call.kernel.name if isinstance(call, KernelCall) else None
        entry = out.setdefault(name, {"ns": 0, "hits": {}})
        entry["ns"] += step["ns"]
        for version, hits in step["calls"].items():
            entry["hits"][version] = entry["hits"].get(version, 0) + hits
    return out



def describe_triton(build: Any) -> list[str]:
    """Lines for ``disc.explain``: what the GPU program launches per call, and where its memory goes."""
    from disc.runtime.triton_runtime import interpreting  # imports triton: only for a GPU program

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
