"""ONNX's narrow storage types (float8, float4, E8M0, int4/uint4, int2/uint2) against onnx's
reference evaluator, bit for bit: every code of each format decoded, and encodings of every
representable value, every halfway point between neighbours and the floats either side of it,
zeros of both signs, subnormals, NaN, infinities and values past the largest, from float32,
float16 and float64, with saturate on and off. One compile per format (dims from dim_param),
called at several shapes, size-1 and odd dims among them."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ml_dtypes = pytest.importorskip("ml_dtypes")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import disc.onnx  # noqa: E402
from disc.errors import CompileError, InputError  # noqa: E402

OPSET = 25
FLOAT8 = [TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E4M3FNUZ, TensorProto.FLOAT8E5M2, TensorProto.FLOAT8E5M2FNUZ]
INTS = [TensorProto.UINT4, TensorProto.INT4, TensorProto.UINT2, TensorProto.INT2]
SHAPES = [(1, 1), (1, 7), (5, 3), (3, 1)]  # then one holding the whole pool


def _np(elem: int) -> np.dtype:
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem))


def _model(nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(nodes, "narrow", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def _dyn(name: str, elem: int, last: str | int = "k"):
    return helper.make_tensor_value_info(name, elem, ["n", last])


def _bits(a: np.ndarray) -> np.ndarray:
    """An array's bytes per element as an unsigned integer (a narrow integer type: its value)."""
    if a.dtype.name in ("int4", "int2"):
        return a.astype(np.int8)
    if a.dtype.name in ("uint4", "uint2"):
        return a.astype(np.uint8)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def _assert_same(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, expected {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    if want.dtype.kind == "f" or (want.dtype.kind == "V" and want.dtype.name not in ("int4", "uint4", "int2", "uint2")):
        nan = np.isnan(want.astype(np.float32))
        assert np.array_equal(np.isnan(got.astype(np.float32)), nan), f"{what}: NaNs differ"
        got, want = got[~nan], want[~nan]
    bad = np.flatnonzero(_bits(got).reshape(-1) != _bits(want).reshape(-1))
    assert bad.size == 0, f"{what}: {bad.size} elements differ, first at {bad[0]}: {got.reshape(-1)[bad[0]]!r} vs {want.reshape(-1)[bad[0]]!r}"


def _pieces(pool: dict[str, np.ndarray]):
    """Feeds at each of SHAPES (cut from the pools, cycling) and one holding each pool whole."""
    size = max(len(v) for v in pool.values())
    for n, k in [*SHAPES, (-(-size // 8), 8)]:
        yield {name: np.resize(v, n * k).reshape(n, k) for name, v in pool.items()}


def _check(model, pool: dict[str, np.ndarray]) -> None:
    prog = disc.onnx.compile(model)
    ref = ReferenceEvaluator(model)
    names = [o.name for o in model.graph.output]
    for feeds in _pieces(pool):
        got = prog(**feeds)
        with np.errstate(all="ignore"):
            want = ref.run(None, feeds)
        for name, g, w in zip(names, got, want):
            _assert_same(np.asarray(g), np.asarray(w), f"{name} at {feeds[next(iter(feeds))].shape}")


def _float_probes(elem: int) -> np.ndarray:
    """float32: each finite value of the format, the midpoints of neighbours and the floats next
    to them, past the largest, tiny values, zeros, NaN, infinities, and random values."""
    codes = np.arange(16 if elem == TensorProto.FLOAT4E2M1 else 256, dtype=np.uint8)
    values = codes.view(_np(elem)).astype(np.float64)
    finite = np.unique(values[np.isfinite(values)])
    mids = ((finite[1:] + finite[:-1]) / 2).astype(np.float32)
    top = np.float32(finite.max())
    specials = [0.0, -0.0, np.nan, np.inf, -np.inf, 1e-30, -1e-30, 1e-45, 3e38, -3e38, top * 1.0625, top * 1.125, top * 2, -top * 1.0625, -top * 2]
    rng = np.random.default_rng(elem)
    rand = (rng.standard_normal(200) * np.exp2(rng.integers(-20, 20, 200))).astype(np.float32)
    return np.concatenate([finite.astype(np.float32), mids, np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(-np.inf)), np.array(specials, np.float32), rand])


def _with_precisions(x32: np.ndarray) -> dict[str, np.ndarray]:
    with np.errstate(all="ignore"):
        return {"x32": x32, "x16": x32.astype(np.float16), "x64": x32.astype(np.float64) * (1 + 2.0**-30)}  # (float64 between float32s)


@pytest.mark.parametrize("elem", [*FLOAT8, TensorProto.FLOAT4E2M1], ids=lambda e: TensorProto.DataType.Name(e))
def test_a_float_format_encodes_and_decodes_as_the_reference(elem):
    n = helper.make_node
    saturates = (1, 0) if elem in FLOAT8 else (1,)
    nodes, outputs = [], []
    for src in ("x32", "x16", "x64"):
        for sat in saturates:
            nodes.append(n("Cast", [src], [f"{src}_s{sat}"], to=elem, saturate=sat))
            outputs.append(_dyn(f"{src}_s{sat}", elem))
    nodes += [n("CastLike", ["x32", "b"], ["like"]), n("Cast", ["b"], ["b32"], to=TensorProto.FLOAT), n("Cast", ["b"], ["b16"], to=TensorProto.FLOAT16)]
    nodes += [n("Cast", ["b"], ["b64"], to=TensorProto.DOUBLE), n("Identity", ["b"], ["same"])]
    outputs += [_dyn("like", elem), _dyn("b32", TensorProto.FLOAT), _dyn("b16", TensorProto.FLOAT16), _dyn("b64", TensorProto.DOUBLE), _dyn("same", elem)]
    inputs = [_dyn("x32", TensorProto.FLOAT), _dyn("x16", TensorProto.FLOAT16), _dyn("x64", TensorProto.DOUBLE), _dyn("b", elem)]
    codes = np.arange(16 if elem == TensorProto.FLOAT4E2M1 else 256, dtype=np.uint8).view(_np(elem))
    _check(_model(nodes, inputs, outputs), {**_with_precisions(_float_probes(elem)), "b": codes})


def test_e8m0_encodes_with_each_rounding_and_saturation_and_decodes_as_the_reference():
    n = helper.make_node
    nodes, outputs = [], []
    for mode in ("up", "down", "nearest"):
        for sat in (1, 0):
            nodes.append(n("Cast", ["x32"], [f"{mode}{sat}"], to=TensorProto.FLOAT8E8M0, saturate=sat, round_mode=mode))
            outputs.append(_dyn(f"{mode}{sat}", TensorProto.FLOAT8E8M0))
    nodes += [n("Cast", ["x16"], ["h"], to=TensorProto.FLOAT8E8M0), n("Cast", ["b"], ["b32"], to=TensorProto.FLOAT), n("Cast", ["b"], ["b16"], to=TensorProto.FLOAT16)]
    outputs += [_dyn("h", TensorProto.FLOAT8E8M0), _dyn("b32", TensorProto.FLOAT), _dyn("b16", TensorProto.FLOAT16)]
    inputs = [_dyn("x32", TensorProto.FLOAT), _dyn("x16", TensorProto.FLOAT16), _dyn("b", TensorProto.FLOAT8E8M0)]
    powers = np.ldexp(np.float32(1), np.arange(-149, 128)).astype(np.float32)
    x32 = np.concatenate([
        powers, powers * np.float32(1.5), np.nextafter(powers * np.float32(1.5), np.float32(0)), np.nextafter(powers, np.float32(np.inf)),
        np.nextafter(powers, np.float32(0)), -powers[::7], np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 3.4e38, 1.2e-38, 5.9e-39, 5.8e-39], np.float32),
        np.random.default_rng(1).random(100).astype(np.float32) * 1000,
    ])  # fmt: skip
    with np.errstate(all="ignore"):
        pool = {"x32": x32, "x16": x32.astype(np.float16), "b": np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e8m0fnu)}
    _check(_model(nodes, inputs, outputs), pool)


@pytest.mark.parametrize("elem", INTS, ids=lambda e: TensorProto.DataType.Name(e))
def test_an_integer_format_casts_as_the_reference(elem):
    """Floats truncate, then wrap (as ml_dtypes, the reference); integers keep their low bits."""
    n = helper.make_node
    carrier = TensorProto.INT8 if elem in (TensorProto.INT4, TensorProto.INT2) else TensorProto.UINT8
    nodes = [
        n("Cast", ["xf"], ["from_f32"], to=elem), n("Cast", ["xh"], ["from_f16"], to=elem), n("Cast", ["xi"], ["from_i32"], to=elem),
        n("Cast", ["b"], ["b32"], to=TensorProto.FLOAT), n("Cast", ["b"], ["b16"], to=TensorProto.FLOAT16), n("Cast", ["b"], ["b8"], to=carrier),
        n("Cast", ["b"], ["bi"], to=TensorProto.INT32), n("CastLike", ["xi", "b"], ["like"]), n("Identity", ["b"], ["same"]),
    ]  # fmt: skip
    outputs = [_dyn("from_f32", elem), _dyn("from_f16", elem), _dyn("from_i32", elem), _dyn("b32", TensorProto.FLOAT), _dyn("b16", TensorProto.FLOAT16)]
    outputs += [_dyn("b8", carrier), _dyn("bi", TensorProto.INT32), _dyn("like", elem), _dyn("same", elem)]
    inputs = [_dyn("xf", TensorProto.FLOAT), _dyn("xh", TensorProto.FLOAT16), _dyn("xi", TensorProto.INT32), _dyn("b", elem)]
    rng = np.random.default_rng(elem)
    xf = np.concatenate([np.arange(-40, 40, dtype=np.float32) / 4, np.array([0.0, -0.0, 1e9 + 3, -2147483000.0, 65519.0], np.float32), (rng.standard_normal(100) * 1e4).astype(np.float32)])
    xi = np.concatenate([np.arange(-40, 40), [2**31 - 1, -(2**31), 123456789], rng.integers(-(2**31), 2**31 - 1, 100)]).astype(np.int32)
    info = ml_dtypes.iinfo(_np(elem))
    values = np.arange(int(info.min), int(info.max) + 1)  # every value
    with np.errstate(over="ignore"):
        xh = xf.astype(np.float16)
    _check(_model(nodes, inputs, outputs), {"xf": xf, "xh": xh, "xi": xi, "b": values.astype(_np(elem))})


@pytest.mark.parametrize("elem", [*FLOAT8, *INTS, TensorProto.FLOAT4E2M1], ids=lambda e: TensorProto.DataType.Name(e))
def test_quantize_and_dequantize_per_axis_as_the_reference(elem):
    """QuantizeLinear (saturating, and not, for float8) and DequantizeLinear with one scale and
    zero point per column (zero for float8, whose zero point must be 0). The integer formats
    leave out x / scale past int32: the reference's float-to-int32 conversion is undefined there
    (INT_MIN on x86, so +inf quantizes to the lowest value); disc saturates, as the spec says."""
    n = helper.make_node
    rng = np.random.default_rng(elem)
    scale = numpy_helper.from_array(np.array([0.5, 0.03125, 3.0], np.float32), "scale")
    if elem in FLOAT8:
        zero = np.zeros(3, _np(elem))
    elif elem == TensorProto.FLOAT4E2M1:
        zero = np.array([0.0, 0.5, -1.0], np.float32).astype(_np(elem))
    else:
        info = ml_dtypes.iinfo(_np(elem))
        zero = np.array([info.min, 0, info.max]).astype(_np(elem))
    nodes = [n("QuantizeLinear", ["x", "scale", "zero"], ["q"], axis=1), n("DequantizeLinear", ["q", "scale", "zero"], ["d"], axis=1)]
    outputs = [_dyn("q", elem, 3), _dyn("d", TensorProto.FLOAT, 3)]
    if elem in FLOAT8:
        nodes += [n("QuantizeLinear", ["x", "scale", "zero"], ["q0"], axis=1, saturate=0), n("DequantizeLinear", ["q0", "scale"], ["d0"], axis=1)]
        outputs += [_dyn("q0", elem, 3), _dyn("d0", TensorProto.FLOAT, 3)]
    huge = [np.inf, -np.inf, 1e30, -1e30] if elem not in INTS else [1e9, -1e9]
    x = np.concatenate([(rng.standard_normal(300) * np.exp2(rng.integers(-12, 18, 300))).astype(np.float32), np.array([0.0, -0.0, 0.25, 0.75, 2.5, *huge], np.float32)])
    model = _model(nodes, [_dyn("x", TensorProto.FLOAT, 3)], outputs, [scale, numpy_helper.from_array(zero, "zero")])
    prog, ref = disc.onnx.compile(model), ReferenceEvaluator(model)
    for rows in (1, 3, len(x) // 3):
        feeds = {"x": np.resize(x, rows * 3).reshape(rows, 3)}
        for o, g, w in zip(outputs, prog(**feeds), ref.run(None, feeds)):
            _assert_same(np.asarray(g), np.asarray(w), f"{o.name} at {rows} rows")


def test_an_input_takes_the_ml_dtypes_array_or_its_carrier_and_nothing_else():
    n = helper.make_node
    model = _model([n("Cast", ["b"], ["y"], to=TensorProto.FLOAT), n("Cast", ["y"], ["z"], to=TensorProto.INT4)], [_dyn("b", TensorProto.FLOAT8E5M2)], [_dyn("y", TensorProto.FLOAT), _dyn("z", TensorProto.INT4)])
    prog = disc.onnx.compile(model)
    b = np.array([[1.5, -3.0, 0.0]], np.float32).astype(ml_dtypes.float8_e5m2)
    y, z = prog(b)
    assert y.tolist() == [[1.5, -3.0, 0.0]] and z.dtype == ml_dtypes.int4 and z.astype(np.int8).tolist() == [[1, -3, 0]]
    y2, _ = prog(b.view(np.uint8))  # the carrier: the bits
    assert np.array_equal(y, y2)
    with pytest.raises(InputError, match="FLOAT8E5M2"):
        prog(np.zeros((1, 3), np.float32))


def test_torch_tensors_take_and_give_torch_float8_and_a_saved_program_the_carriers(tmp_path):
    import disc_runtime

    n = helper.make_node
    nodes = [n("Cast", ["b"], ["y"], to=TensorProto.FLOAT), n("Cast", ["y"], ["z"], to=TensorProto.FLOAT8E4M3FN), n("Cast", ["y"], ["w"], to=TensorProto.INT4)]
    outputs = [_dyn("y", TensorProto.FLOAT), _dyn("z", TensorProto.FLOAT8E4M3FN), _dyn("w", TensorProto.INT4)]
    prog = disc.onnx.compile(_model(nodes, [_dyn("b", TensorProto.FLOAT8E4M3FN)], outputs))
    b = np.array([[1.5, -448.0, 0.01, 6.0]], np.float32).astype(ml_dtypes.float8_e4m3fn)
    want = prog(b)
    loaded = disc_runtime.load(prog.save(tmp_path / "narrow"))
    got = loaded.run(b.view(np.uint8))  # the carriers: float8 bits in u8, int4 values in i8
    assert got[1].dtype == np.uint8 and got[2].dtype == np.int8
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1].view(np.uint8)) and np.array_equal(got[2], want[2].astype(np.int8))
    torch = pytest.importorskip("torch")
    y, z, w = prog(torch.from_numpy(b.view(np.uint8)).view(torch.float8_e4m3fn))
    assert z.dtype == torch.float8_e4m3fn and w.dtype == torch.int8  # (torch has no int4: its carrier)
    assert np.array_equal(z.view(torch.uint8).numpy(), want[1].view(np.uint8)) and np.array_equal(y.numpy(), want[0])


@pytest.mark.parametrize(
    "op, elem, extra",
    [("Relu", TensorProto.INT4, []), ("Add", TensorProto.FLOAT8E4M3FN, ["x"]), ("Shape", TensorProto.FLOAT4E2M1, [])],
    ids=["relu-int4", "add-float8", "shape-float4"],
)
def test_another_op_on_a_narrow_value_is_refused_naming_the_op_and_the_type(op, elem, extra):
    """Bits are never read as numbers: only the casts, the (de)quantizers and Identity take them."""
    n = helper.make_node
    out = TensorProto.INT64 if op == "Shape" else elem
    model = _model([n(op, ["x", *extra], ["y"])], [_dyn("x", elem)], [helper.make_tensor_value_info("y", out, None)])
    with pytest.raises(CompileError, match=rf"{op} of a {TensorProto.DataType.Name(elem)} value"):
        disc.onnx.compile(model)
