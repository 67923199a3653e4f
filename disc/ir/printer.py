"""Textual form of a graph. ``parse_graph(print_graph(g))`` prints back identically.

    func @main(%x: f32[b, 128]) {
      sym b in [1, inf]  (input 'x' dim 0)
      %0 = dim(%x) {axis=0} : index(b)
      %1 = exp(%x) : f32[b, 128]
      return %1
    }

Header lines after ``func`` state the constraint set: ``sym`` (facts of a
symbol), ``eq`` (union-find), ``def`` (symbol defined by an expression),
``prod`` (product equality) and ``check`` (assumed, verified at run time).
Weights are printed by reference (``ref="layer0.w"``); their payloads live in
``Graph.constants``.
"""

from __future__ import annotations

import math
from typing import Any

from disc.ir.graph import Graph, Node


def format_attr(v: Any) -> str:
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        text = repr(v)
        return text if ("." in text or "e" in text) else text + ".0"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, tuple):
        return "[" + ", ".join(format_attr(x) for x in v) + "]"
    raise TypeError(f"cannot print attribute value {v!r}")


def format_node(n: Node) -> str:
    operands = ", ".join(f"%{i.name}" for i in n.inputs)
    attrs = ""
    if n.attrs:
        attrs = " {" + ", ".join(f"{k}={format_attr(v)}" for k, v in sorted(n.attrs.items())) + "}"
    return f"%{n.name} = {n.op}({operands}){attrs} : {n.type}"


def constraint_lines(g: Graph) -> list[str]:
    c = g.constraints
    lines: list[str] = []
    for name, f in c.facts.items():
        hi = "inf" if f.hi is None else str(f.hi)
        line = f"sym {name} in [{f.lo}, {hi}]"
        if f.divisor > 1:
            line += f" multiple of {f.divisor}"
        if f.source:
            line += f"  ({f.source})"
        lines.append(line)
    for name in c.facts:
        root = c.find(name)
        if root != name:
            lines.append(f"eq {name} == {root}")
    for name, expr in c.definitions.items():
        lines.append(f"def {name} == {expr}")
    for a, b in c.product_equalities:
        lines.append(f"prod {a} == {b}")
    for chk in c.checks:
        lines.append(f"check {chk.lhs} {chk.op} {chk.rhs}  {format_attr(chk.reason)}")
    return lines


def print_graph(g: Graph) -> str:
    params = ", ".join(f"%{n.name}: {n.type}" for n in g.inputs)
    lines = [f"func @{g.name}({params}) {{"]
    lines += ["  " + line for line in constraint_lines(g)]
    lines += ["  " + format_node(n) for n in g.nodes if n.op != "input"]
    lines.append("  return " + ", ".join(f"%{o.name}" for o in g.outputs))
    lines.append("}")
    return "\n".join(lines)
