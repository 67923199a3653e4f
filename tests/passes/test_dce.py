"""Golden tests of dce: keep what the outputs need, all inputs, and used payloads."""

from __future__ import annotations

import torch
from golden import check_golden

from disc.ir.parser import parse_graph
from disc.ir.verifier import verify
from disc.passes.dce import dce


def test_drops_dead_nodes_and_payloads():
    constants = {"w": torch.ones(2, 3), "dead": torch.zeros(5)}
    out = check_golden(
        dce,
        """
        func @main(%x: f32[a, 3], %unused: f32[7]) {
          sym a in [1, inf]  (input 'x' dim 0)
          %0 = dim(%x) {axis=0} : index(a)
          %1 = constant() {dtype="f32", ref="w", value=none} : f32[2, 3]
          %2 = constant() {dtype="f32", ref="dead", value=none} : f32[5]
          %3 = exp(%x) : f32[a, 3]
          %4 = transpose(%1) {perm=[1, 0]} : f32[3, 2]
          %5 = dot_general(%3, %4) {lhs_batch=[], lhs_contract=[1], rhs_batch=[], rhs_contract=[0]} : f32[a, 2]
          %6 = neg(%5) : f32[a, 2]
          %7 = index_const() {value=3} : index(3)
          return %5
        }
        """,
        """
        func @main(%x: f32[a, 3], %unused: f32[7]) {
          sym a in [1, inf]  (input 'x' dim 0)
          %1 = constant() {dtype="f32", ref="w", value=none} : f32[2, 3]
          %3 = exp(%x) : f32[a, 3]
          %4 = transpose(%1) {perm=[1, 0]} : f32[3, 2]
          %5 = dot_general(%3, %4) {lhs_batch=[], lhs_contract=[1], rhs_batch=[], rhs_contract=[0]} : f32[a, 2]
          return %5
        }
        """,
        constants=constants,
    )
    assert sorted(out.constants) == ["w"]
    assert out.constants["w"] is constants["w"]  # payloads are shared, not copied


def test_keeps_everything_live():
    src = """
    func @main(%x: f32[a]) {
      sym a in [1, inf]  (input 'x' dim 0)
      %0 = exp(%x) : f32[a]
      %1 = dim(%0) {axis=0} : index(a)
      return %0, %1, %x
    }
    """
    check_golden(dce, src, src)


def test_no_outputs_keeps_only_inputs():
    # (The printer writes an empty return as "return " with a trailing space.)
    g = parse_graph("func @main(%x: f32[2]) {\n  %0 = exp(%x) : f32[2]\n  return\n}")
    out = dce(g)
    assert [n.op for n in out.nodes] == ["input"] and out.outputs == []
    assert len(g.nodes) == 2
    verify(out)
