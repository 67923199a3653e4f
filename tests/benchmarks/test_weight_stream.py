import json

import pytest

from disc.codegen.cpu import toolchain

pytestmark = pytest.mark.skipif(not toolchain.have_dnnl(), reason="the benchmark times the RAL's oneDNN build")


def test_the_benchmark_times_every_system_on_checked_products(monkeypatch, tmp_path):
    from benchmarks import weight_stream

    monkeypatch.setattr(weight_stream, "HIDDEN", 32)
    monkeypatch.setattr(weight_stream, "FFN", 96)
    monkeypatch.setattr(weight_stream, "LAYERS", 2)
    out = tmp_path / "ws.json"
    weight_stream.main(["--rounds", "1", "--rows", "1,7", "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["cpu"]
    rows = result["rows"]
    assert {(r["weights"], r["rows"]) for r in rows} == {(w, m) for w in ("memory", "cache") for m in (1, 7)}
    assert {"oneDNN (panel kernel off)", "torch F.linear"} <= {r["system"] for r in rows}
    assert all(r["ms"] > 0 and r["weight_gb_s"] > 0 for r in rows)


def test_a_wrong_product_is_refused(monkeypatch):
    from benchmarks import weight_stream
    from disc.runtime.ral import load_ral

    monkeypatch.setattr(weight_stream, "HIDDEN", 16)
    monkeypatch.setattr(weight_stream, "FFN", 32)
    ral = load_ral("dnnl")
    weights = weight_stream._layer()
    ral_pass, _, check, keep = weight_stream._passes(ral, weights, 3)
    ral_pass()
    check()
    keep[2].add_(1.0)  # the HIDDEN-wide output buffer, changed behind the pass's back
    with pytest.raises(AssertionError, match="differs"):
        check()
