"""Parser for the textual IR written by ``disc.ir.printer``.

Types are taken as written (not re-inferred), so a golden test states exactly
what a pass must produce; ``verify`` then checks the text is consistent.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from typing import Any

from disc.ir.graph import Graph, Node
from disc.ir.types import IndexType, TensorType, Type
from disc.shape.constraints import RuntimeCheck
from disc.shape.expr import SymExpr, parse_expr, simplify_dim


class IRParseError(ValueError):
    pass


_FUNC = re.compile(r"^func @([\w.]+)\((.*)\)\s*\{$")
_NODE = re.compile(r"^%([\w.]+) = ([\w.]+)\((.*?)\)(?: \{(.*)\})? : (.+)$")
_SYM = re.compile(r"^sym (\w+) in \[(-inf|-?\d+), (inf|-?\d+)\](?: multiple of (\d+))?(?:  \((.*)\))?$")
_EQ = re.compile(r"^eq ([A-Za-z_]\w*) == ([A-Za-z_]\w*)$")
_CHECK = re.compile(r'^check (.+?) (==|!=|>=|%) (.+?)  (".*")$')


@functools.lru_cache(maxsize=4096)
def parse_type(text: str) -> Type:
    # Cached: a model's IR repeats a few dozen type texts over thousands of lines, and types are
    # immutable (parsing BERT-base's IR: 0.25 s -> 0.1 s, most of disc.load beyond its constants).
    text = text.strip()
    if text.startswith("index(") and text.endswith(")"):
        return IndexType(simplify_dim(parse_expr(text[6:-1])))
    m = re.match(r"^(\w+)\[(.*)\]$", text)
    if not m:
        raise IRParseError(f"bad type {text!r}")
    body = m.group(2).strip()
    dims = tuple(simplify_dim(parse_expr(d)) for d in _split_top(body)) if body else ()
    return TensorType(m.group(1), dims)


def _split_top(text: str) -> list[str]:
    """Split on commas that are not inside brackets, parentheses or strings."""
    parts, depth, cur, in_str, esc = [], 0, [], False, False
    for ch in text:
        if in_str:
            cur.append(ch)
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
            continue
        if ch == '"':
            in_str = True
        elif ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    if "".join(cur).strip():
        parts.append("".join(cur).strip())
    return parts


def parse_attr_value(text: str) -> Any:
    text = text.strip()
    if text == "none":
        return None
    if text in ("true", "false"):
        return text == "true"
    if text in ("inf", "-inf", "nan"):
        return float(text)
    if text.startswith('"'):
        if not text.endswith('"') or len(text) < 2:
            raise IRParseError(f"unterminated string {text!r}")
        return re.sub(r"\\(.)", r"\1", text[1:-1])
    if text.startswith("["):
        inner = text[1:-1].strip()
        return tuple(parse_attr_value(x) for x in _split_top(inner)) if inner else ()
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        raise IRParseError(f"bad attribute value {text!r}") from None


def parse_attrs(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    out: dict[str, Any] = {}
    for part in _split_top(text):
        key, sep, value = part.partition("=")
        if not sep:
            raise IRParseError(f"bad attribute {part!r}")
        out[key.strip()] = parse_attr_value(value)
    return out


def parse_graph(text: str, constants: Mapping[str, Any] | None = None) -> Graph:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip() and not ln.strip().startswith("#")]
    if not lines:
        raise IRParseError("empty IR text")
    m = _FUNC.match(lines[0])
    if not m:
        raise IRParseError(f"expected 'func @name(...) {{', got {lines[0]!r}")
    g = Graph(name=m.group(1), constants=dict(constants or {}))
    values: dict[str, Node] = {}
    for param in _split_top(m.group(2)):
        name, _, ty = param.partition(":")
        name = name.strip().lstrip("%")
        t = parse_type(ty)
        if not isinstance(t, TensorType):
            raise IRParseError(f"input %{name} must be a tensor")
        values[name] = g.add_input(name, t)
    if lines[-1] != "}":
        raise IRParseError("missing closing '}'")
    returned = False
    for ln in lines[1:-1]:
        if returned:
            raise IRParseError(f"text after return: {ln!r}")
        if ln.startswith("return"):
            names = [x.strip().lstrip("%") for x in ln[len("return"):].split(",") if x.strip()]
            g.outputs = [_lookup(values, n) for n in names]
            returned = True
        elif ln.startswith("%"):
            _parse_node(g, values, ln)
        else:
            _parse_constraint(g, ln)
    if not returned:
        raise IRParseError("missing return")
    return g


def _lookup(values: Mapping[str, Node], name: str) -> Node:
    if name not in values:
        raise IRParseError(f"use of undefined value %{name}")
    return values[name]


def _parse_node(g: Graph, values: dict[str, Node], ln: str) -> None:
    m = _NODE.match(ln)
    if not m:
        raise IRParseError(f"bad op line {ln!r}")
    name, op, operands, attrs, ty = m.groups()
    if name in values:
        raise IRParseError(f"value %{name} defined twice")
    inputs = [_lookup(values, x.strip().lstrip("%")) for x in operands.split(",") if x.strip()]
    values[name] = g.add_typed(op, inputs, parse_attrs(attrs), parse_type(ty), name)


def _parse_constraint(g: Graph, ln: str) -> None:
    c = g.constraints
    c.changed()  # the lines below write the facts directly: nothing derived before holds
    if ln.startswith("sym "):
        m = _SYM.match(ln)
        if not m:
            raise IRParseError(f"bad symbol line {ln!r}")
        name, lo, hi, div, source = m.groups()
        c.declare(name, lo=-math.inf if lo == "-inf" else int(lo), hi=None if hi == "inf" else int(hi), divisor=int(div or 1), source=source or "")
    elif ln.startswith("eq "):
        m = _EQ.match(ln)
        if not m:
            raise IRParseError(f"bad equality line {ln!r}: expected 'eq <symbol> == <symbol>'")
        a, b = m.groups()
        root = b
        for _ in range(len(c.parent) + 1):  # the union-find must stay a forest: a cycle would never end a look-up
            if root == a:
                raise IRParseError(f"equality line {ln!r} closes a cycle of equalities")
            if c.parent.get(root, root) == root:
                break
            root = c.parent[root]
        c.parent[a] = b
    elif ln.startswith("def "):
        a, _, b = ln[4:].partition(" == ")
        c.definitions[a.strip()] = parse_expr(b)
    elif ln.startswith("prod "):
        a, _, b = ln[5:].partition(" == ")
        c.product_equalities.append((parse_expr(a), parse_expr(b)))
    elif ln.startswith("check "):
        m = _CHECK.match(ln)
        if not m:
            raise IRParseError(f"bad check line {ln!r}")
        lhs, op, rhs, reason = m.groups()
        c.checks.append(RuntimeCheck(parse_expr(lhs), op, parse_expr(rhs), parse_attr_value(reason)))
    else:
        raise IRParseError(f"unknown line {ln!r}")


__all__ = ["IRParseError", "SymExpr", "parse_graph", "parse_type"]
