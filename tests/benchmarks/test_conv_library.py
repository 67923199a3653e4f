import json

import pytest

from disc.codegen.cpu import toolchain

pytestmark = pytest.mark.skipif(not toolchain.have_dnnl(), reason="the benchmark times the RAL's oneDNN build")


def test_the_benchmark_times_every_system_on_checked_outputs(monkeypatch, tmp_path):
    from benchmarks import conv_library

    monkeypatch.setattr(conv_library, "STAGES", ((16, 2, 4), (32, 1, 8)))
    out = tmp_path / "conv.json"
    conv_library.main(["--rounds", "1", "--images", "1x33x17,2x8x8", "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["cpu"]
    rows = result["rows"]
    # The sides after the stem's rounding-up halvings: 33 -> 17 -> 9, then -> 5 for the second stage.
    assert {(r["image"], r["c"], r["h"], r["w"]) for r in rows} == {
        ("1x33x17", 16, 9, 5), ("1x33x17", 32, 5, 3), ("2x8x8", 16, 2, 2), ("2x8x8", 32, 1, 1)
    }
    assert {r["system"] for r in rows} == {"oneDNN direct", "Winograd F(2x2,3x3)", "RAL default", "torch F.conv2d"}
    assert all(r["ms"] > 0 and r["default_picks"] in ("Winograd", "direct") for r in rows)
    assert set(result["stream_ms"]) == {r["system"] for r in rows}


def test_a_wrong_output_is_refused():
    from benchmarks import conv_library
    from disc.runtime.ral import load_ral

    ral = load_ral("dnnl")
    fns, check, keep = conv_library._calls(ral, {"image": "1x8x8", "n": 1, "c": 16, "h": 5, "w": 4, "layers": 1})
    fns["RAL default"]()
    check()
    keep[3].add_(1.0)  # the output buffer, changed behind the call's back
    with pytest.raises(AssertionError, match="differs"):
        check()
