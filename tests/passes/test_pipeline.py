"""Tests of the pass pipeline: golden end-to-end IR, results preserved, verify and dump switches."""

from __future__ import annotations

import math
import textwrap

import pytest
import torch

from disc.ir.graph import Graph
from disc.ir.parser import parse_graph
from disc.ir.printer import print_graph
from disc.ir.registry import get_spec
from disc.ir.types import TensorType
from disc.ir.verifier import VerificationError, verify
from disc.passes import PASSES, PIPELINE, Pass, run_pipeline

BLOCK = """
func @main(%x: f32[b, s, 64], %y: f32[b, s, 64]) {
  sym b in [1, inf]  (input 'x' dim 0)
  sym s in [1, inf]  (input 'x' dim 1)
  %0 = dim(%x) {axis=0} : index(b)
  %1 = dim(%x) {axis=1} : index(s)
  %2 = dim(%y) {axis=0} : index(b)
  %3 = dim(%x) {axis=2} : index(64)
  %4 = imul(%0, %1) : index(b*s)
  %5 = imul(%1, %2) : index(b*s)
  %6 = reshape(%x, %4, %3) : f32[b*s, 64]
  %7 = reshape(%6, %0, %1, %3) : f32[b, s, 64]
  %8 = transpose(%x) {perm=[1, 0, 2]} : f32[s, b, 64]
  %9 = transpose(%8) {perm=[1, 0, 2]} : f32[b, s, 64]
  %10 = constant() {dtype="f32", ref=none, value=1.0} : f32[]
  %11 = broadcast_in_dim(%10, %0, %1, %3) {dims=[]} : f32[b, s, 64]
  %12 = mul(%7, %11) : f32[b, s, 64]
  %13 = convert(%12) {dtype="f32"} : f32[b, s, 64]
  %14 = add(%13, %9) : f32[b, s, 64]
  %15 = reshape(%y, %5, %3) : f32[b*s, 64]
  %16 = constant() {dtype="f32", ref=none, value=2.0} : f32[]
  %17 = constant() {dtype="f32", ref=none, value=3.0} : f32[]
  %18 = mul(%16, %17) : f32[]
  %19 = add(%14, %y) : f32[b, s, 64]
  %20 = add(%y, %14) : f32[b, s, 64]
  %21 = broadcast_in_dim(%18, %2, %1, %3) {dims=[]} : f32[b, s, 64]
  %22 = mul(%20, %21) : f32[b, s, 64]
  %23 = reduce(%22) {dims=[2], keepdim=false, kind="max"} : f32[b, s]
  return %19, %22, %15, %23
}
"""

BLOCK_OPTIMIZED = """
func @main(%x: f32[b, s, 64], %y: f32[b, s, 64]) {
  sym b in [1, inf]  (input 'x' dim 0)
  sym s in [1, inf]  (input 'x' dim 1)
  %0 = dim(%x) {axis=0} : index(b)
  %1 = dim(%x) {axis=1} : index(s)
  %3 = index_const() {value=64} : index(64)
  %4 = imul(%0, %1) : index(b*s)
  %14 = add(%x, %x) : f32[b, s, 64]
  %15 = reshape(%y, %4, %3) : f32[b*s, 64]
  %18 = constant() {dtype="f32", ref=none, value=6.0} : f32[]
  %19 = add(%14, %y) : f32[b, s, 64]
  %21 = broadcast_in_dim(%18, %0, %1, %3) {dims=[]} : f32[b, s, 64]
  %22 = mul(%19, %21) : f32[b, s, 64]
  %23 = reduce(%22) {dims=[2], keepdim=false, kind="max"} : f32[b, s]
  return %19, %22, %15, %23
}
"""


def src(text: str) -> str:
    return textwrap.dedent(text).strip()


# -- a reference interpreter over the registry's semantics ----------------------------------------
def run_graph(g: Graph, inputs: dict[str, torch.Tensor]) -> list:
    env: dict = {}
    for n in g.nodes:
        if n.op == "input":
            env[n] = inputs[n.name]
            continue
        attrs = dict(n.attrs)
        if n.op == "constant" and attrs["ref"] is not None:
            attrs["ref"] = g.constants[attrs["ref"]]
        env[n] = get_spec(n.op).reference(*[env[i] for i in n.inputs], **attrs)
    return [env[o] for o in g.outputs]


def same_bits(a, b) -> bool:
    if not isinstance(a, torch.Tensor):
        return a == b
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if not a.is_floating_point():
        return torch.equal(a, b)
    nan = torch.isnan(a)
    return (
        torch.equal(nan, torch.isnan(b)) and torch.equal(a[~nan], b[~nan]) and torch.equal(torch.signbit(a[~nan]), torch.signbit(b[~nan]))
    )


# -- tests ---------------------------------------------------------------------------------------------
def test_pipeline_order():
    assert [p.name for p in PIPELINE] == [
        "shape_propagation",
        "fold_shapes",
        "simplify",
        "remove_noops",
        "conv1d_as_2d",
        "channels_last",
        "sink_transposes",
        "cse",
        "dce",
    ]
    assert all(isinstance(p, Pass) for p in PIPELINE)
    assert PASSES["simplify"] is PIPELINE[2]


def test_pipeline_golden():
    g = parse_graph(src(BLOCK))
    verify(g)
    out = run_pipeline(g, verify=True)
    assert print_graph(g) == src(BLOCK), "the pipeline changed its input"
    assert print_graph(out) == src(BLOCK_OPTIMIZED)
    assert print_graph(parse_graph(print_graph(out))) == print_graph(out)
    verify(parse_graph(print_graph(out)))


@pytest.mark.parametrize("b, s", [(1, 1), (2, 3), (3, 1), (1, 5)])
def test_pipeline_preserves_results(b, s):
    g = parse_graph(src(BLOCK))
    out = run_pipeline(g)
    gen = torch.Generator().manual_seed(b * 10 + s)
    x = torch.randn(b, s, 64, generator=gen)
    y = torch.randn(b, s, 64, generator=gen)
    x.view(-1)[:4] = torch.tensor([-0.0, math.inf, math.nan, -math.inf])
    y.view(-1)[:2] = torch.tensor([0.0, -0.0])
    expected = run_graph(g, {"x": x, "y": y})
    got = run_graph(out, {"x": x, "y": y})
    assert len(expected) == len(got)
    for e, r in zip(expected, got):
        assert same_bits(e, r)


def test_graph_built_with_add_goes_through():
    g = Graph()
    n = g.constraints.declare("n", lo=1, source="input 'x' dim 0")
    x = g.add_input("x", TensorType("f32", (n, 4)))
    w = g.add_constant(torch.arange(8, dtype=torch.float32).reshape(4, 2), name="w")
    w2 = g.add_constant(torch.arange(8, dtype=torch.float32).reshape(4, 2), name="w_copy")
    mm1 = g.add("dot_general", [x, w], {"lhs_contract": (1,), "rhs_contract": (0,)})
    mm2 = g.add("dot_general", [x, w2], {"lhs_contract": (1,), "rhs_contract": (0,)})
    g.add("exp", [x])
    g.outputs = [g.add("add", [mm1, mm2])]
    out = run_pipeline(g, verify=True)
    assert out.op_counts() == {"input": 1, "constant": 1, "dot_general": 1, "add": 1}
    assert list(out.constants) == ["w"]
    inp = {"x": torch.randn(3, 4)}
    assert same_bits(run_graph(g, inp)[0], run_graph(out, inp)[0])


def _breaks_types(graph: Graph) -> Graph:
    bad = parse_graph(print_graph(graph), graph.constants)
    victim = next(n for n in bad.nodes if n.op == "add")
    victim.type = TensorType("f16", victim.type.shape)
    return bad


BREAK = Pass("break_types", _breaks_types)


def test_verify_names_the_pass_that_broke_the_graph(monkeypatch):
    monkeypatch.delenv("DISC_VERIFY", raising=False)
    g = parse_graph(src(BLOCK))
    with pytest.raises(VerificationError, match="after pass break_types"):
        run_pipeline(g, verify=True, passes=[PIPELINE[0], BREAK, PIPELINE[1]])
    run_pipeline(g, passes=[BREAK])  # not verified: no error
    monkeypatch.setenv("DISC_VERIFY", "0")
    run_pipeline(g, passes=[BREAK])


def test_verify_from_the_environment(monkeypatch):
    monkeypatch.setenv("DISC_VERIFY", "1")
    with pytest.raises(VerificationError, match="break_types"):
        run_pipeline(parse_graph(src(BLOCK)), passes=[BREAK])


def _sections(text: str) -> list[tuple[str, str]]:
    out = []
    for chunk in text.split("# ---- ")[1:]:
        header, _, body = chunk.partition("\n")
        out.append((header.rstrip(" -"), body.strip()))
    return out


def test_dump_to_file(tmp_path):
    path = tmp_path / "dump.mlir"
    out = run_pipeline(parse_graph(src(BLOCK)), dump=path)
    sections = _sections(path.read_text())
    assert [h for h, _ in sections] == ["IR before the pipeline"] + [
        f"IR after {p.name} ({i}/{len(PIPELINE)})" for i, p in enumerate(PIPELINE, 1)
    ]
    assert sections[0][1] == src(BLOCK)
    assert sections[-1][1] == print_graph(out)
    for _, body in sections:  # every section parses back (headers are '#' comments)
        assert print_graph(parse_graph(body)) == body
    # a section copied with its header line parses as is
    text = path.read_text()
    start = text.index("# ---- IR after shape_propagation")
    chunk = text[start : text.index("# ---- IR after fold_shapes")]
    assert print_graph(parse_graph(chunk)) == sections[1][1]


def test_dump_from_the_environment(monkeypatch, capsys):
    monkeypatch.setenv("DISC_DUMP_IR", "1")
    run_pipeline(parse_graph(src(BLOCK)))
    err = capsys.readouterr().err
    assert [h for h, _ in _sections(err)][1:] == [f"IR after {p.name} ({i}/{len(PIPELINE)})" for i, p in enumerate(PIPELINE, 1)]
    monkeypatch.setenv("DISC_DUMP_IR", "0")
    run_pipeline(parse_graph(src(BLOCK)))
    assert capsys.readouterr().err == ""


def test_pipeline_is_a_fixpoint_on_its_output():
    once = run_pipeline(parse_graph(src(BLOCK)))
    twice = run_pipeline(once)
    assert print_graph(twice) == print_graph(once)


def test_verifier_accepts_symbol_minting_ops():
    verify(
        parse_graph(
            src(
                """
                func @main(%x: f32[a, b]) {
                  sym a in [1, inf]  (input 'x' dim 0)
                  sym b in [1, inf]  (input 'x' dim 1)
                  sym s0 in [0, inf]  (max(a, b))
                  %0 = dim(%x) {axis=0} : index(a)
                  %1 = dim(%x) {axis=1} : index(b)
                  %2 = imax(%0, %1) : index(s0)
                  return %2
                }
                """
            )
        )
    )
