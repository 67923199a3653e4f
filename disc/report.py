"""What a compilation produced (``CompileReport``) and every report of the process (``disc.reports``).

Written by every path that compiles or loads a program (``disc.compile``, the torch.compile
plug-in, ``disc.load``); read by ``disc.explain``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from disc.ir.graph import Graph
from disc.ir.printer import print_graph


@dataclass
class BackendChoice:
    name: str  # "native-cpu", "triton-gpu", "triton-interpreter" or "reference", with " segments" when cut at fallbacks
    reason: str = ""  # why the reference executor runs it, when it does
    native: Any = None  # NativeBuild of the native program
    triton: Any = None  # TritonBuild of the GPU program
    segments: Any = None  # SegmentPlan, when fallbacks run in PyTorch between compiled segments


@dataclass
class CompileReport:
    """What one compilation produced: IR, constraints, fallbacks, timing."""

    name: str
    source: str  # "disc.compile" or "torch.compile"
    graph: Graph
    fallbacks: dict[str, int]
    compile_seconds: float
    hints: dict[str, int] = field(default_factory=dict)
    calls: int = 0
    backend: Any = None  # BackendChoice: native-cpu or reference, and why
    decomposed_because: str | None = None  # why torch.export's program needed run_decompositions
    fallback_calls: dict[str, Any] = field(default_factory=dict)  # call key -> the importer's Fallback (what disc.save writes)
    cache: str = ""  # what the program cache did: hit, miss and stored, off, or why it was not used

    def text(self) -> str:
        g = self.graph
        lines = [f"== disc: {self.name} (via {self.source}) =="]
        lines.append(f"compiled in {self.compile_seconds:.2f}s; calls so far: {self.calls}")
        if self.hints:
            lines.append("trace hints (dims grown off 0/1 so nothing specialises): " + ", ".join(f"{k}={v}" for k, v in self.hints.items()))
        if self.source == "disc.compile":
            why = self.decomposed_because
            lines.append("capture: torch.export, " + (f"decomposed to core ATen ({why})" if why else "lowered as exported (no decomposition pass)"))
        if self.cache:
            lines.append(f"program cache: {self.cache}")
        lines.append("")
        lines.append("-- constraints --")
        lines += ["  " + ln for ln in g.constraints.describe()] or ["  (none)"]
        lines.append("")
        lines.append("-- fallbacks (run by PyTorch) --")
        if self.fallbacks:
            lines += [f"  {target}: {count}" for target, count in sorted(self.fallbacks.items())]
        else:
            lines.append("  none: every op is compiled")
        from disc.fusion.plan import plan_fusion

        lines.append("")
        lines.append("-- fusion plan --")
        native_cpu = self.backend is not None and self.backend.name.startswith("native-cpu")
        lines += ["  " + ln for ln in plan_fusion(g, conv_epilogues=native_cpu).describe().splitlines()]
        lines.append("")
        lines += self._backend_text()
        counts = g.op_counts()
        lines.append("")
        lines.append("-- op counts --")
        lines.append("  " + ", ".join(f"{op}={n}" for op, n in sorted(counts.items())))
        lines.append("")
        lines.append("-- IR --")
        lines.append(print_graph(g))
        return "\n".join(lines)


    def _backend_text(self) -> list[str]:
        choice = self.backend
        if choice is not None and choice.segments is not None:
            from disc.runtime.segments import describe_segments

            return describe_segments(choice.segments)
        if choice is not None and choice.triton is not None:
            from disc.runtime.explain import describe_triton

            return describe_triton(choice.triton)
        if choice is None or choice.native is None:
            why = choice.reason if choice is not None else "no backend recorded"
            return ["-- backend: reference executor (op by op, with torch) --", f"  {why}"]
        from disc.runtime.explain import describe_native

        return describe_native(choice.native)


_REPORTS: list[CompileReport] = []
_REPORTS_LOCK = threading.Lock()


def record_report(report: CompileReport) -> None:
    with _REPORTS_LOCK:
        _REPORTS.append(report)


def reports() -> list[CompileReport]:
    """Every compilation made in this process (disc.compile and torch.compile)."""
    with _REPORTS_LOCK:
        return list(_REPORTS)


def clear_reports() -> None:
    with _REPORTS_LOCK:
        _REPORTS.clear()
