import json

import pytest
import torch

from disc.codegen.cpu import toolchain

pytestmark = pytest.mark.skipif(not toolchain.have_dnnl(), reason="the probe times oneDNN GEMMs")


def test_the_probe_times_the_same_products_for_every_variant(monkeypatch, tmp_path):
    from benchmarks import qkv_merge

    monkeypatch.setattr(qkv_merge, "LAYERS", 2)
    monkeypatch.setattr(qkv_merge, "CASES", ((32, (1, 7)),))
    out = tmp_path / "qkv.json"
    qkv_merge.main(["--rounds", "1", "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [(r["hidden"], r["tokens"]) for r in rows] == [(32, 1), (32, 7)]
    assert all(r[v] > 0 for r in rows for v in qkv_merge.VARIANTS)


def test_a_merged_gemm_that_differs_is_refused():
    from benchmarks import qkv_merge
    from disc.runtime.ral import gemm_args, load_ral

    ral = load_ral("dnnl")
    a, w = torch.randn(3, 4), torch.randn(4, 4)
    outs = [torch.empty(3, 4) for _ in range(3)]
    merged_out = torch.empty(3, 12)
    wrong = torch.randn(4, 12)  # not the concatenation of the three weights
    separate = [gemm_args(a, w, o)[0] for o in outs]
    right = torch.cat([w, w, w], dim=1)
    qkv_merge._check_same_products(ral, separate, [gemm_args(a, right, merged_out)[0]], outs, merged_out)
    with pytest.raises(AssertionError, match="differs"):
        qkv_merge._check_same_products(ral, separate, [gemm_args(a, wrong, merged_out)[0]], outs, merged_out)
