"""fuse_attention: a GEMM-softmax-GEMM chain becomes one attention op (the GPU backend's fused kernel)."""

from __future__ import annotations

import textwrap

import pytest
import torch
from golden import check_golden

from disc.ir.parser import parse_graph
from disc.passes.attention import find_attention, fuse_attention
from disc.runtime.reference import ReferenceExecutor

ATTENTION = """
func @attention(%q: f32[b, 4, s, 16], %k: f32[b, 4, s, 16], %v: f32[b, 4, s, 16], %mask: f32[b, 1, 1, s]) {
  sym b in [0, inf]  (input 'q' dim 0)
  sym s in [1, inf]  (input 'q' dim 2)
  %0 = dim(%q) {axis=0} : index(b)
  %1 = dim(%q) {axis=2} : index(s)
  %2 = index_const() {value=4} : index(4)
  %3 = transpose(%k) {perm=[0, 1, 3, 2]} : f32[b, 4, 16, s]
  %4 = dot_general(%q, %3) {lhs_batch=[0, 1], lhs_contract=[3], rhs_batch=[0, 1], rhs_contract=[2]} : f32[b, 4, s, s]
  %5 = constant() {dtype="f32", ref=none, value=4.0} : f32[]
  %6 = broadcast_in_dim(%5, %0, %2, %1, %1) {dims=[]} : f32[b, 4, s, s]
  %7 = div(%4, %6) : f32[b, 4, s, s]
  %8 = broadcast_in_dim(%mask, %0, %2, %1, %1) {dims=[0, 1, 2, 3]} : f32[b, 4, s, s]
  %9 = add(%7, %8) : f32[b, 4, s, s]
  %10 = reduce(%9) {dims=[3], keepdim=true, kind="max"} : f32[b, 4, s, 1]
  %11 = broadcast_in_dim(%10, %0, %2, %1, %1) {dims=[0, 1, 2, 3]} : f32[b, 4, s, s]
  %12 = sub(%9, %11) : f32[b, 4, s, s]
  %13 = exp(%12) : f32[b, 4, s, s]
  %14 = reduce(%13) {dims=[3], keepdim=true, kind="sum"} : f32[b, 4, s, 1]
  %15 = broadcast_in_dim(%14, %0, %2, %1, %1) {dims=[0, 1, 2, 3]} : f32[b, 4, s, s]
  %16 = div(%13, %15) : f32[b, 4, s, s]
  %17 = dot_general(%16, %v) {lhs_batch=[0, 1], lhs_contract=[3], rhs_batch=[0, 1], rhs_contract=[2]} : f32[b, 4, s, 16]
  return %17
}
"""

FUSED = """
func @attention(%q: f32[b, 4, s, 16], %k: f32[b, 4, s, 16], %v: f32[b, 4, s, 16], %mask: f32[b, 1, 1, s]) {
  sym b in [0, inf]  (input 'q' dim 0)
  sym s in [1, inf]  (input 'q' dim 2)
  %0 = dim(%q) {axis=0} : index(b)
  %1 = dim(%q) {axis=2} : index(s)
  %2 = index_const() {value=4} : index(4)
  %3 = transpose(%k) {perm=[0, 1, 3, 2]} : f32[b, 4, 16, s]
  %8 = broadcast_in_dim(%mask, %0, %2, %1, %1) {dims=[0, 1, 2, 3]} : f32[b, 4, s, s]
  %18 = transpose(%3) {perm=[0, 1, 3, 2]} : f32[b, 4, s, 16]
  %17 = attention(%q, %18, %v, %8) {scale=0.25} : f32[b, 4, s, 16]
  return %17
}
"""


def _inputs(b: int, s: int, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(b * 100 + s)
    q, k, v = (torch.randn(b, 4, s, 16, generator=g, dtype=dtype) for _ in range(3))
    mask = torch.where(torch.rand(b, 1, 1, s, generator=g) > 0.3, 0.0, -1e9).to(dtype)
    mask[..., 0] = 0.0  # every row keeps one key
    return [q, k, v, mask]


def test_the_chain_becomes_one_attention_op_reading_k_through_its_transpose():
    check_golden(fuse_attention, ATTENTION, FUSED)


@pytest.mark.parametrize("b, s", [(1, 1), (2, 5), (3, 33), (0, 4)])
def test_the_attention_op_computes_what_the_chain_did(b, s):
    src = parse_graph(textwrap.dedent(ATTENTION).strip())
    fused = fuse_attention(src)
    args = _inputs(b, s)
    want = ReferenceExecutor(src, {}, "cpu").run(args)[0]
    got = ReferenceExecutor(fused, {}, "cpu").run(args)[0]
    assert got.shape == want.shape == (b, 4, s, 16)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    # and what PyTorch's attention computes
    q, k, v, mask = args
    torch.testing.assert_close(got, torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask), rtol=1e-5, atol=1e-6)


def _variant(old: str, new: str) -> str:
    assert old in ATTENTION
    return ATTENTION.replace(old, new)


@pytest.mark.parametrize(
    "why, text",
    [
        # a training forward returns the probabilities for its backward: the chain must stay
        ("probabilities read outside", _variant("  return %17\n", "  return %17, %16\n")),
        # the scale is a run-time value, not a literal
        ("scale not a literal", _variant('%5 = constant() {dtype="f32", ref=none, value=4.0} : f32[]', "%5 = reduce(%mask) {dims=[0, 1, 2, 3], keepdim=false, kind=\"max\"} : f32[]")),
        # a softmax over another dim is not attention
        ("softmax over dim 2", _variant('%10 = reduce(%9) {dims=[3], keepdim=true, kind="max"} : f32[b, 4, s, 1]', '%10 = reduce(%9) {dims=[2], keepdim=true, kind="max"} : f32[b, 4, 1, s]')),
    ],
)
def test_chains_that_are_not_private_attention_are_left_alone(why, text):
    try:
        g = parse_graph(textwrap.dedent(text).strip())
    except Exception:
        pytest.fail(f"{why}: the variant does not parse")
    assert not find_attention(g), why
    assert fuse_attention(g) is g


def test_without_mask_or_scale_and_with_k_read_untransposed():
    text = """
    func @plain(%q: bf16[b, 2, l, 8], %k: bf16[b, 2, s, 8], %v: bf16[b, 2, s, 4]) {
      sym b in [0, inf]  (input 'q' dim 0)
      sym l in [1, inf]  (input 'q' dim 2)
      sym s in [1, inf]  (input 'k' dim 2)
      %0 = dim(%q) {axis=0} : index(b)
      %1 = dim(%q) {axis=2} : index(l)
      %2 = dim(%k) {axis=2} : index(s)
      %3 = index_const() {value=2} : index(2)
      %4 = dot_general(%q, %k) {lhs_batch=[0, 1], lhs_contract=[3], rhs_batch=[0, 1], rhs_contract=[3]} : bf16[b, 2, l, s]
      %5 = reduce(%4) {dims=[3], keepdim=true, kind="max"} : bf16[b, 2, l, 1]
      %6 = broadcast_in_dim(%5, %0, %3, %1, %2) {dims=[0, 1, 2, 3]} : bf16[b, 2, l, s]
      %7 = sub(%4, %6) : bf16[b, 2, l, s]
      %8 = exp(%7) : bf16[b, 2, l, s]
      %9 = reduce(%8) {dims=[3], keepdim=true, kind="sum"} : bf16[b, 2, l, 1]
      %10 = broadcast_in_dim(%9, %0, %3, %1, %2) {dims=[0, 1, 2, 3]} : bf16[b, 2, l, s]
      %11 = div(%8, %10) : bf16[b, 2, l, s]
      %12 = dot_general(%11, %v) {lhs_batch=[0, 1], lhs_contract=[3], rhs_batch=[0, 1], rhs_contract=[2]} : bf16[b, 2, l, 4]
      return %12
    }
    """
    g = parse_graph(textwrap.dedent(text).strip())
    fused = fuse_attention(g)
    assert fused.op_counts().get("attention") == 1
    assert "reduce" not in fused.op_counts() and "transpose" not in fused.op_counts()
    gen = torch.Generator().manual_seed(0)
    for b, l, s in [(1, 1, 1), (2, 3, 7), (1, 9, 33)]:
        q, k = torch.randn(b, 2, l, 8, generator=gen).bfloat16(), torch.randn(b, 2, s, 8, generator=gen).bfloat16()
        v = torch.randn(b, 2, s, 4, generator=gen).bfloat16()
        got = ReferenceExecutor(fused, {}, "cpu").run([q, k, v])[0]
        assert got.dtype == torch.bfloat16
        exact = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), scale=1.0)
        eager = ReferenceExecutor(g, {}, "cpu").run([q, k, v])[0]  # the chain rounds after every op
        assert (got.float() - exact).abs().max() <= max((eager.float() - exact).abs().max().item(), 1e-2)


class _Sdpa(torch.nn.Module):
    """PyTorch's attention as models call it; disc lowers it to GEMMs, a masked softmax that gives
    0 where every key is masked, and (16-bit) widening converts."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        sdpa = torch.nn.functional.scaled_dot_product_attention
        if self.kind == "causal":
            return sdpa(q, k, v, is_causal=True)  # the mask input is not read
        return sdpa(q, k, v, attn_mask=mask, enable_gqa=k.shape[1] != q.shape[1])


def _sdpa_inputs(kind: str, b: int, l: int, s: int, kv_heads: int, dtype: torch.dtype, device: str) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(b * 100 + l * 10 + s)
    q = torch.randn(b, 4, l, 16, generator=g)
    k, v = (torch.randn(b, kv_heads, s, 16, generator=g) for _ in range(2))
    keep = torch.rand(b, 1, l, s, generator=g) > 0.3
    keep[-1, 0, -1, :] = False  # a row with every key masked: PyTorch gives 0 there
    mask = keep if kind in ("bool", "causal") else torch.where(keep, 0.0, float("-inf"))
    return [t.to(device).to(dtype) if t.is_floating_point() else t.to(device) for t in (q, k, v, mask)]


@pytest.mark.parametrize(
    "kind, kv_heads, dtype",
    [("bool", 4, torch.float32), ("float", 4, torch.float32), ("causal", 4, torch.float32), ("bool", 2, torch.float32), ("bool", 2, torch.bfloat16), ("float", 4, torch.float16)],
    ids=["bool-mask", "float-mask", "causal", "gqa", "gqa-bf16", "float-mask-f16"],
)
def test_pytorch_attention_becomes_one_op_on_the_gpu_path(kind, kv_heads, dtype):
    # PyTorch's attention, as disc lowers it, used to miss the pass (a boolean mask is a select,
    # an all-masked row a select after the softmax, 16-bit operands widened to float32), so
    # Hugging Face models on a GPU computed scores and softmax in separate kernels.
    import disc

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = _Sdpa(kind)
    dynamic = {"q": {0: "b", 2: "l"}, "k": {0: "b", 2: "s"}, "v": {0: "b", 2: "s"}, "mask": {0: "b", 2: "l", 3: "s"}}
    if kind == "causal":
        dynamic = {n: {a: "l" if d == "s" else d for a, d in spec.items()} for n, spec in dynamic.items()}
    example = _sdpa_inputs(kind, 2, 3, 3 if kind == "causal" else 5, kv_heads, dtype, device)
    cm = disc.compile(model, example, dynamic=dynamic, backend="triton")
    graph = cm.executor.graph
    assert graph.op_counts().get("attention") == 1, graph.op_counts()
    assert "exp" not in graph.op_counts() and "reduce" not in graph.op_counts()
    (att,) = [n for n in graph.nodes if n.op == "attention"]
    assert att.dtype == {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}[dtype]  # 16-bit operands read as they are
    if kind in ("bool", "float"):  # the [b, 1, l, s] mask's bias is not written once per head
        assert att.inputs[3].op == "broadcast_in_dim" and att.inputs[3].inputs[0].shape[1] == 1
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for b, l, s in ((1, 1, 1), (2, 3, 5), (3, 7, 9)):
        if kind == "causal":
            s = l
        args = _sdpa_inputs(kind, b, l, s, kv_heads, dtype, device)
        with torch.no_grad():
            got, want = cm(*args), model(*args)
        assert got.dtype == want.dtype
        # equal_nan: where a GPU's attention kernel gives NaN for a row with every key masked, disc
        # calls that kernel too; PyTorch's CPU attention gives 0 there.
        torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol * float(want.float().nan_to_num().abs().max().clamp_min(1)), equal_nan=True)
        if kind != "causal" and device == "cpu":
            assert torch.all(got[-1, :, -1] == 0), "a row with every key masked gives 0"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_hugging_face_bert_gets_one_attention_call_per_layer(dtype):
    # Third-party attention code (SDPA with the padding mask Hugging Face builds) on the GPU path.
    pytest.importorskip("transformers")
    import disc
    from benchmarks.hf_workloads import bert_inputs, hf_bert

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = hf_bert(tiny=True).to(device).to(dtype)
    dynamic = {"input_ids": {0: "b", 1: "s"}, "attention_mask": {0: "b", 1: "s"}}

    def inputs(b: int, s: int, seed: int) -> tuple[torch.Tensor, ...]:
        return tuple(t.to(device) for t in bert_inputs(b, s, seed, vocab=100))

    cm = disc.compile(model, inputs(2, 9, 0), dynamic=dynamic, backend="triton")
    attention = [n for n in cm.executor.graph.nodes if n.op == "attention"]
    assert len(attention) == len(model.model.encoder.layer)
    assert all(n.dtype == ("f32" if dtype == torch.float32 else "bf16") for n in attention)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    for b, s in ((1, 1), (3, 5), (2, 17)):
        args = inputs(b, s, b + s)
        with torch.no_grad():
            got, want = cm(*args), model(*args)
        torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol * float(want.float().abs().max()))
