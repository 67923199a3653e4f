import json

import pytest
import torch

from disc.codegen.cpu import toolchain

pytestmark = pytest.mark.skipif(not toolchain.have_dnnl(), reason="packing is the oneDNN RAL's")


def test_the_packed_and_the_stored_program_are_timed_on_the_same_results(tmp_path):
    from benchmarks import packed_weights
    from disc.runtime.ral import load_ral

    out = tmp_path / "packed.json"
    before = load_ral().set_packed_gemm_mb(7.0)
    try:
        packed_weights.main(["--workload", "bert-tiny-smoke", "--calls", "1", "--out", str(out)])
        assert load_ral().set_packed_gemm_mb(7.0) == 7.0  # the run gives the budget back as it found it
    finally:
        load_ral().set_packed_gemm_mb(before)
    result = json.loads(out.read_text())
    assert [r["shape"] for r in result["rows"]] == ["2x16", "1x1"]
    assert all(r["packed_ms"] > 0 and r["stored_ms"] > 0 for r in result["rows"])
    assert result["packed_mb"] > 0  # the first program's weights were packed


def test_outputs_that_differ_are_refused():
    from benchmarks import packed_weights

    want = (torch.ones(3), {"x": torch.zeros(2)})
    packed_weights._close((torch.ones(3), {"x": torch.zeros(2)}), want, "same")
    with pytest.raises(AssertionError, match="differs"):
        packed_weights._close((torch.ones(3), {"x": torch.full((2,), 0.5)}), want, "differs")
