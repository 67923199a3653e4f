"""torch.export keeps ``aten.matmul`` whole where disc lowers it to one dot_general (the export's slowest decomposition).

Forms the lowering takes: ``[..., k] @ [k, n]`` (linear layers) and batched
products over the same leading dims (attention). Any other form in a model
makes the export decompose every matmul, as before.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import disc
from disc.frontends.torch.export import _decompositions, matmul_lowers


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.w = nn.Parameter(torch.randn(8, 5))

    def forward(self, q, k):
        scores = torch.softmax(q @ k.transpose(-1, -2), dim=-1)  # [b, h, s, s], batched over b, h
        return self.proj(scores @ k) @ self.w  # linear, then [b, h, s, 8] @ [8, 5]


class VectorProduct(nn.Module):
    def forward(self, x, v):
        return torch.relu(x @ v)  # [s, k] @ [k]: not a form disc lowers directly


DYN = {"q": {0: "b", 2: "s"}, "k": {0: "b", 2: "s"}}


def _export(model, args, dynamic):
    names = list(dynamic)
    shapes = {n: {a: torch.export.Dim.DYNAMIC for a in dynamic[n]} for n in names}
    return torch.export.export(model, args, dynamic_shapes=shapes, strict=False)


def test_matmul_is_kept_whole_and_lowers_to_dot_general():
    m = Attention().eval()
    args = (torch.randn(2, 3, 4, 8), torch.randn(2, 3, 4, 8))
    assert torch.ops.aten.matmul.default not in _decompositions(_export(m, args, DYN))
    cm = disc.compile(m, args, dynamic=DYN)
    assert not cm.report.fallbacks
    assert sum(n.op == "dot_general" for n in cm.report.graph.nodes) == 4
    for b, s in [(1, 1), (2, 5), (3, 17)]:
        q, k = torch.randn(b, 3, s, 8), torch.randn(b, 3, s, 8)
        with torch.no_grad():
            torch.testing.assert_close(cm(q, k), m(q, k), rtol=1e-4, atol=1e-5)


def test_any_other_form_decomposes_every_matmul():
    m = VectorProduct()
    args = (torch.randn(4, 6), torch.randn(6))
    dyn = {"x": {0: "s"}, "v": {}}
    assert torch.ops.aten.matmul.default in _decompositions(_export(m, args, dyn))
    cm = disc.compile(m, args, dynamic=dyn)
    assert not cm.report.fallbacks
    for s in [1, 3, 9]:
        x, v = torch.randn(s, 6), torch.randn(6)
        torch.testing.assert_close(cm(x, v), m(x, v), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "a,b,ok",
    [
        (("s", 8), (8, 5), True),
        (("b", "s", 8), (8, 5), True),
        (("b", 3, "s", 8), ("b", 3, 8, "s"), True),
        (("b", 3, "s", 8), (1, 3, 8, "s"), False),  # broadcast batch dim
        (("b", "s", 8), ("b", 3, 8, 5), False),  # different ranks
        (("s", 8), (8,), False),  # matrix-vector
        ((8,), (8, 5), False),  # vector-matrix
    ],
)
def test_which_matmul_forms_lower_directly(a, b, ok):
    assert matmul_lowers(a, b) is ok
