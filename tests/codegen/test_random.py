"""Counter-based random numbers (``random_uniform``): native bits equal the reference's, and the law is uniform."""

from __future__ import annotations

import math

import pytest
import torch

from disc.ir.parser import parse_graph
from disc.runtime.native import NativeExecutor, build_native
from disc.runtime.reference import ReferenceExecutor

# Two sites of one seed, and dropout's form: a mask and the scaled kept values, read by two kernels.
TWO_SITES = """
func @two_sites(%x: f32[a, n], %seed: i64[1]) {
  sym a in [0, inf]
  sym n in [0, inf]
  %0 = dim(%x) {axis=0} : index(a)
  %1 = dim(%x) {axis=1} : index(n)
  %2 = random_uniform(%seed, %0, %1) {site=0} : f32[a, n]
  %3 = random_uniform(%seed, %0, %1) {site=1} : f32[a, n]
  %4 = constant() {dtype="f32", ref=none, value=0.75} : f32[]
  %5 = broadcast_in_dim(%4, %0, %1) {dims=[]} : f32[a, n]
  %6 = lt(%2, %5) : i1[a, n]
  %7 = convert(%6) {dtype="f32"} : f32[a, n]
  %8 = mul(%x, %7) : f32[a, n]
  return %2, %3, %6, %8
}
"""


@pytest.fixture(scope="module")
def programs():
    graph = parse_graph(TWO_SITES)
    return NativeExecutor(graph, build_native(graph)), ReferenceExecutor(graph, {})


@pytest.mark.parametrize("shape", [(1, 1), (1, 7), (5, 1), (3, 17), (64, 513)])
@pytest.mark.parametrize("seed", [0, 1, -(2**63), 2**63 - 1, 123456789])
def test_native_draws_the_reference_bits(programs, shape, seed):
    native, reference = programs
    x = torch.randn(*shape)
    s = torch.tensor([seed], dtype=torch.int64)
    got, want = native.run([x, s]), reference.run([x, s])
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    u0, u1, keep, kept = got
    assert u0.min() >= 0 and u0.max() < 1
    torch.testing.assert_close(kept, x * (u0 < 0.75))
    assert torch.equal(keep, u0 < 0.75)


def test_uniform_law_and_independence(programs):
    native, _ = programs
    u0, u1, _, _ = native.run([torch.zeros(1000, 1000), torch.tensor([42])])
    n = u0.numel()
    # Mean and variance of U(0, 1), within 6 standard errors.
    assert abs(u0.mean().item() - 0.5) < 6 * math.sqrt(1 / 12 / n)
    assert abs(u0.var().item() - 1 / 12) < 6 * math.sqrt(1 / 180 / n)
    # 100 equal buckets: chi-square with 99 degrees of freedom, far tail at 99 + 6 * sqrt(2 * 99).
    counts = torch.bincount((u0.flatten() * 100).long(), minlength=100).double()
    chi2 = ((counts - n / 100) ** 2 / (n / 100)).sum().item()
    assert chi2 < 99 + 6 * math.sqrt(2 * 99), chi2
    # Neighbouring positions, and the two sites at one position, are uncorrelated.
    flat0, flat1 = u0.flatten().double(), u1.flatten().double()
    for a, b in [(flat0[:-1], flat0[1:]), (flat0, flat1), (u0[:-1].flatten().double(), u0[1:].flatten().double())]:
        r = torch.corrcoef(torch.stack([a, b]))[0, 1].item()
        assert abs(r) < 6 / math.sqrt(a.numel()), r


def test_a_new_seed_gives_new_numbers_and_the_same_seed_the_same(programs):
    native, _ = programs
    x = torch.zeros(8, 33)
    a = native.run([x, torch.tensor([7])])[0]
    b = native.run([x, torch.tensor([7])])[0]
    c = native.run([x, torch.tensor([8])])[0]
    assert torch.equal(a, b)
    assert (a != c).float().mean() > 0.99
