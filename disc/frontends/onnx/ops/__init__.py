"""Lowering table of the ONNX frontend: one function per ONNX op type.

Each ``fn(imp, node, *operands, **attrs) -> value | list of values`` receives the operands as
the importer holds them (``Node``, numpy constant, ``ShapeValue`` or None for an omitted
optional input) and the node's attributes as Python values. Integer ops over shape values and
constants compute at compile time (numpy or symbolic dims), so a model's shape subgraph
(``Shape -> Gather -> Concat -> Reshape``) leaves no run-time work but the index ops.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

OPS: dict[str, Callable[..., Any]] = {}
# Ops of ONNX's preview domains the importer takes beside the default domain's (their names do
# not clash with it).
PREVIEW_DOMAINS = {"ai.onnx.preview.training": frozenset({"Adagrad", "Momentum", "Adam"}), "ai.onnx.preview": frozenset({"FlexAttention"})}


def onnx_op(*names: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        for n in names:
            OPS[n] = fn
        return fn

    return wrap


# The lowering modules register their ops in OPS as they are imported.
from disc.frontends.onnx.ops import (  # noqa: E402
    control,
    conv,
    elementwise,
    linalg,
    movement,
    normalization,
    quantization,
    recurrent,
    reduction,
    resize,
    sequence,
    spectral,
    text,
    training,
)

__all__ = ["OPS", "PREVIEW_DOMAINS", "control", "conv", "elementwise", "linalg", "movement", "normalization", "onnx_op", "quantization", "recurrent", "reduction", "resize", "sequence", "spectral", "text", "training"]
