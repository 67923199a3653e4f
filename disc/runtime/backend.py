"""Choosing how a compiled graph runs: the native CPU program, or the reference executor.

``backend="auto"`` (the default, or ``$DISC_BACKEND``) builds the native
program and falls back to the reference executor only when the graph uses
something the native backend does not generate, recording why, so
``disc.explain`` can say it. ``"native"`` makes that an error instead;
``"reference"`` skips code generation.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from disc.errors import CompileError
from disc.ir.graph import Graph
from disc.runtime.reference import ReferenceExecutor

BACKENDS = ("auto", "native", "reference")


@dataclass
class BackendChoice:
    name: str  # "native-cpu" or "reference"
    reason: str = ""  # why the reference executor runs it, when it does
    native: Any = None  # NativeBuild of the native program


def default_backend() -> str:
    return os.environ.get("DISC_BACKEND", "auto")


def make_executor(graph: Graph, fallbacks: Mapping[str, Any], backend: str | None = None) -> tuple[Any, BackendChoice]:
    """An executor for ``graph`` (``run(inputs) -> outputs``, ``profile(inputs)``) and what was chosen."""
    backend = backend or default_backend()
    if backend not in BACKENDS:
        raise CompileError(f"unknown backend {backend!r}; choose one of {BACKENDS}")
    if backend == "reference":
        return ReferenceExecutor(graph, fallbacks), BackendChoice("reference", "backend='reference' was asked for")
    from disc.codegen.lowering import Unsupported
    from disc.runtime.native import NativeExecutor, build_native

    try:
        native = build_native(graph)
    except Unsupported as e:
        if backend == "native":
            raise CompileError(f"no native program for this graph: {e}") from e
        return ReferenceExecutor(graph, fallbacks), BackendChoice("reference", f"not natively supported: {e}")
    return NativeExecutor(graph, native), BackendChoice("native-cpu", native=native)
