"""The epilogue probe compares like with like: the fused and unfused variants compute the same values."""

from __future__ import annotations

import pytest

from disc.codegen.cpu import toolchain

pytestmark = pytest.mark.skipif(not toolchain.have_dnnl(), reason="oneDNN is not installed")


@pytest.mark.parametrize("gelu", [True, False], ids=["bias_gelu", "bias"])
@pytest.mark.parametrize("m, k, n", [(1, 16, 48), (7, 33, 20)])
def test_fused_and_unfused_epilogues_agree(m, k, n, gelu):
    from benchmarks.gemm_epilogue import VARIANTS, load_probe, measure

    row = measure(load_probe(), m, k, n, gelu, rounds=3)
    assert 0 <= row["max_rel_diff"] < 1e-5, row
    assert set(row["ms"]) == set(VARIANTS) and all(t > 0 for t in row["ms"].values())
    assert row["fused_impl"] and not row["fused_impl"].startswith("error")
