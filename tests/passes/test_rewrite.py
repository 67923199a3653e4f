"""Tests of the rebuild utility every pass uses."""

from __future__ import annotations

import textwrap

import torch

from disc.ir.parser import parse_graph
from disc.ir.printer import print_graph
from disc.ir.verifier import verify
from disc.passes import New, Pass, Rewriter, graph_pass, rebuild

SRC = textwrap.dedent(
    """
    func @g(%x: f32[a, 4], %y: f32[a, 4]) {
      sym a in [1, inf]  (input 'x' dim 0)
      %0 = exp(%x) : f32[a, 4]
      %1 = neg(%0) : f32[a, 4]
      %3 = add(%1, %y) : f32[a, 4]
      return %3, %0
    }
    """
).strip()


def test_plain_rebuild_is_an_identical_copy():
    g = parse_graph(SRC, {"unused": torch.ones(1)})
    out = rebuild(g)
    assert print_graph(out) == SRC
    assert out is not g and out.constraints is not g.constraints and out.constants == g.constants
    assert [n.name for n in out.inputs] == ["x", "y"] and out.name == "g"
    assert all(a is not b for a, b in zip(out.nodes, g.nodes))
    verify(out)


def test_replacements_and_new_nodes_get_fresh_names():
    g = parse_graph(SRC)

    def rule(rw, n, cand):
        if cand.op == "neg":
            # Not a meaningful rewrite (rebuild does not judge semantics, only
            # types); it shows naming: the replacement keeps the replaced node's
            # name, other created nodes take numbers after the largest in the
            # source, never a source name (%2 is free but not reused).
            extra = rw.add("abs", [cand.inputs[0]])
            return New("sub", (extra, cand.inputs[0]))
        return None

    out = rebuild(g, rule)
    assert (
        print_graph(out)
        == textwrap.dedent(
            """
        func @g(%x: f32[a, 4], %y: f32[a, 4]) {
          sym a in [1, inf]  (input 'x' dim 0)
          %0 = exp(%x) : f32[a, 4]
          %4 = abs(%0) : f32[a, 4]
          %1 = sub(%4, %0) : f32[a, 4]
          %3 = add(%1, %y) : f32[a, 4]
          return %3, %0
        }
        """
        ).strip()
    )
    assert print_graph(g) == SRC
    verify(out)


def test_replacement_with_another_type_is_refused():
    g = parse_graph(SRC)
    out = rebuild(g, lambda rw, n, cand: New("convert", (cand.inputs[0],), {"dtype": "f16"}) if cand.op == "neg" else None)
    assert print_graph(out) == SRC


def test_rewriter_constants_and_outputs():
    g = parse_graph(SRC)
    rw = Rewriter(g)
    for n in g.nodes:
        if n.op == "input":
            rw.keep_input(n)
        else:
            rw.map(n, rw.commit(rw.candidate(n)))
    c = rw.constant(torch.tensor(2.5))
    p = rw.constant(torch.tensor([True, False]))
    out = rw.finish()
    assert c.attrs["value"] == 2.5 and c.name == "4"
    assert p.attrs["ref"] in out.constants and p.name == "5"
    assert [o.name for o in out.outputs] == ["3", "0"]


def test_pass_objects():
    @graph_pass("identity")
    def identity(graph):
        """Copy the graph.

        More text."""
        return rebuild(graph)

    assert isinstance(identity, Pass) and identity.name == "identity" and identity.doc == "Copy the graph."
    assert print_graph(identity(parse_graph(SRC))) == SRC
    assert repr(identity) == "Pass(identity)"
