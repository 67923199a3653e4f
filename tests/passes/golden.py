"""The golden-test harness shared by the pass tests: IR text in, IR text out."""

from __future__ import annotations

import textwrap

from disc.ir.parser import parse_graph
from disc.ir.printer import print_graph
from disc.ir.verifier import verify


def check_golden(pass_, src, expected, constants=None, verify_ir=True):
    """Run ``pass_`` on ``src``; the output must print as ``expected``, round-trip and verify."""
    src, expected = textwrap.dedent(src).strip(), textwrap.dedent(expected).strip()
    g = parse_graph(src, constants)
    assert print_graph(g) == src, "test input is not in printed form"
    if verify_ir:
        verify(g)
    out = pass_(g)
    assert print_graph(g) == src, "the pass changed its input graph"
    got = print_graph(out)
    assert got == expected, f"\n--- got ---\n{got}\n--- expected ---\n{expected}"
    again = parse_graph(got, out.constants)
    assert print_graph(again) == got
    if verify_ir:
        verify(out)
        verify(again)
    return out
