"""IR text comes from files a user (or an attacker) may edit: the parser accepts only the IR's
grammar, and nothing built from it runs text taken from it as code."""

from __future__ import annotations

import pytest
import torch

from disc.ir.parser import IRParseError, parse_graph
from disc.runtime.reference import ReferenceExecutor

HEADER = """func @f(%x: f32[a, b], %y: f32[a, b]) {
  sym a in [0, inf]  (input 'x' dim 0)
  sym b in [0, inf]  (input 'x' dim 1)
"""
BODY = """  %z = add(%x, %y) : f32[a, b]
  return %z
}
"""


@pytest.mark.parametrize(
    "line",
    [
        "eq a == __import__('os').system('echo pwned')",  # was pasted into the shape program and run
        "eq a == b; import os",
        "eq a == 1b",
        "eq a ==  b",
        "eq a",
    ],
)
def test_an_equality_line_takes_two_symbol_names_only(line):
    with pytest.raises(IRParseError, match="bad equality line"):
        parse_graph(HEADER + f"  {line}\n" + BODY)


def test_equalities_that_close_a_cycle_are_refused():
    # Two lines naming each other made every symbol look-up, and so disc.load, loop forever.
    with pytest.raises(IRParseError, match="cycle"):
        parse_graph(HEADER + "  eq a == b\n  eq b == a\n" + BODY)
    with pytest.raises(IRParseError, match="cycle"):
        parse_graph(HEADER + "  eq a == a\n" + BODY)


def test_symbol_names_are_never_names_in_the_generated_shape_program():
    # `shapes` and `v` are the shape program's own parameter and result: as pasted names they
    # overwrote them. The program names symbols s0, s1... whatever the IR calls them.
    text = HEADER.replace("a", "shapes").replace("b]", "v]").replace("sym b", "sym v").replace("[shapes, b]", "[shapes, v]")
    text = text + "  %z = add(%x, %y) : f32[shapes, v]\n  return %z\n}\n"
    g = parse_graph(text)
    ex = ReferenceExecutor(g)
    out = ex.run([torch.ones(2, 3), torch.ones(2, 3)])[0]
    assert torch.equal(out, torch.full((2, 3), 2.0))
    assert "shapes =" not in ex.shape_program.source and " v =" not in ex.shape_program.source.replace("    v = {}", "")
