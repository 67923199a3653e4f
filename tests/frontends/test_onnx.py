"""The ONNX frontend against ONNX Runtime: models built in code with random weights, compiled once,
run over shape streams that start with size-1 dims."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import disc  # noqa: E402
import disc.onnx  # noqa: E402

H, HEADS = 16, 4


def _f32(rng, name, *shape, scale=0.3):
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def _i64(name, values):
    return numpy_helper.from_array(np.array(values, np.int64), name)


def _model(nodes, inputs, outputs, inits, opset=20):
    m = helper.make_model(helper.make_graph(nodes, "m", inputs, outputs, inits), opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(m)
    return m


def encoder_layer() -> onnx.ModelProto:
    """One BERT-style layer as an exporter writes it: the head split's shape computed from the
    input by Shape -> Gather -> Unsqueeze -> Concat -> Reshape, a padding mask, softmax
    attention, residual + LayerNorm, a GELU MLP and a mean over the last dim."""
    rng = np.random.default_rng(0)
    n = helper.make_node
    nodes = [
        n("Shape", ["x"], ["shape"]),
        n("Gather", ["shape", "zero"], ["b"], axis=0),
        n("Gather", ["shape", "one"], ["s"], axis=0),
        n("Unsqueeze", ["b", "axis0"], ["b1"]),
        n("Unsqueeze", ["s", "axis0"], ["s1"]),
        n("Concat", ["b1", "s1", "heads", "head_size"], ["split"], axis=0),
        n("Concat", ["b1", "s1", "hidden"], ["merge"], axis=0),
    ]
    for p in "qkv":
        nodes += [n("MatMul", ["x", f"w{p}"], [f"{p}0"]), n("Add", [f"{p}0", f"b{p}"], [f"{p}1"]), n("Reshape", [f"{p}1", "split"], [f"{p}2"])]
    nodes += [
        n("Transpose", ["q2"], ["q"], perm=[0, 2, 1, 3]),
        n("Transpose", ["k2"], ["kt"], perm=[0, 2, 3, 1]),
        n("Transpose", ["v2"], ["v"], perm=[0, 2, 1, 3]),
        n("MatMul", ["q", "kt"], ["scores0"]),
        n("Div", ["scores0", "root"], ["scores1"]),
        n("Cast", ["mask"], ["maskf"], to=TensorProto.FLOAT),
        n("Sub", ["onef", "maskf"], ["hidden_keys"]),
        n("Mul", ["hidden_keys", "big"], ["bias0"]),
        n("Unsqueeze", ["bias0", "axes12"], ["bias"]),
        n("Add", ["scores1", "bias"], ["scores"]),
        n("Softmax", ["scores"], ["probs"], axis=-1),
        n("MatMul", ["probs", "v"], ["ctx0"]),
        n("Transpose", ["ctx0"], ["ctx1"], perm=[0, 2, 1, 3]),
        n("Reshape", ["ctx1", "merge"], ["ctx"]),
        n("Add", ["ctx", "x"], ["res"]),
        n("LayerNormalization", ["res", "gamma", "beta"], ["normed"], axis=-1, epsilon=1e-5),
        n("MatMul", ["normed", "w1"], ["up0"]),
        n("Gelu", ["up0"], ["up"]),
        n("ReduceMean", ["up", "last"], ["pooled"], keepdims=0),
    ]
    inits = [_f32(rng, f"w{p}", H, H) for p in "qkv"] + [_f32(rng, f"b{p}", H) for p in "qkv"]
    inits += [_f32(rng, "gamma", H, scale=1.0), _f32(rng, "beta", H), _f32(rng, "w1", H, 8)]
    inits += [_i64("zero", 0), _i64("one", 1), _i64("axis0", [0]), _i64("heads", [HEADS]), _i64("head_size", [H // HEADS]), _i64("hidden", [H])]
    inits += [_i64("axes12", [1, 2]), _i64("last", [-1])]
    inits += [numpy_helper.from_array(np.array(v, np.float32), k) for k, v in (("root", 2.0), ("onef", 1.0), ("big", 10000.0))]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", H]), helper.make_tensor_value_info("mask", TensorProto.INT64, ["batch", "seq"])]
    outputs = [helper.make_tensor_value_info("up", TensorProto.FLOAT, ["batch", "seq", 8]), helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["batch", "seq"])]
    return _model(nodes, inputs, outputs, inits)


def _text_inputs(rng, b, s):
    mask = (rng.random((b, s)) > 0.3).astype(np.int64)
    mask[:, 0] = 1
    return rng.standard_normal((b, s, H)).astype(np.float32), mask


def _check(prog, sess, feeds: dict, tol: float = 1e-5) -> None:
    want = sess.run(None, feeds)
    got = prog(**feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
        if w.size:  # (a slice past a short sequence's end is empty, in both)
            assert np.abs(g - w).max() <= tol * max(1.0, np.abs(w).max()), np.abs(g - w).max()


def test_an_encoder_layer_compiles_once_and_matches_onnx_runtime_at_every_shape():
    model = encoder_layer()
    sess = ort.InferenceSession(model.SerializeToString())
    prog = disc.onnx.compile(model)
    assert prog.report.backend.name == "native-cpu"
    # The shape subgraph is index ops, not tensors computed at each call.
    assert not any(n.op in ("index_to_tensor", "concat") for n in prog.graph.nodes)
    rng = np.random.default_rng(1)
    for b, s in [(1, 1), (1, 7), (2, 5), (3, 17), (4, 64)]:
        x, mask = _text_inputs(rng, b, s)
        _check(prog, sess, {"x": x, "mask": mask})
    x, mask = _text_inputs(rng, 2, 3)
    assert np.array_equal(prog(x, mask)[0], prog(mask=mask, x=x)[0])  # positional or by name


def test_torch_tensors_in_give_torch_tensors_out():
    torch = pytest.importorskip("torch")
    prog = disc.onnx.compile(encoder_layer())
    x, mask = _text_inputs(np.random.default_rng(2), 2, 6)
    got = prog(torch.from_numpy(x), torch.from_numpy(mask))
    assert all(isinstance(g, torch.Tensor) for g in got)
    np.testing.assert_array_equal(got[1].numpy(), prog(x, mask)[1])


def test_a_dim_param_named_twice_is_one_dim_and_a_mismatch_names_the_input():
    prog = disc.onnx.compile(encoder_layer())
    x, _ = _text_inputs(np.random.default_rng(3), 2, 5)
    with pytest.raises(disc.ShapeError, match="input 'mask' dim 1 is 4"):
        prog(x, np.ones((2, 4), np.int64))
    with pytest.raises(disc.InputError, match="missing input 'mask'"):
        prog(x)
    with pytest.raises(disc.InputError, match="unexpected input"):
        prog(x, np.ones((2, 5), np.int64), extra=x)


def test_two_unknown_dims_that_broadcast_must_be_equal_at_run_time():
    # x [n, 3] + y [m, 3]: n and m are different unknowns. The program is built for n == m; a call
    # where they differ (one of them 1 included) is refused by name, never read past y's rows.
    model = _model(
        [helper.make_node("Add", ["x", "y"], ["z"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3]), helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 3])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [None, 3])],
        [],
    )
    prog = disc.onnx.compile(model)
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    np.testing.assert_array_equal(prog(x, 2 * x)[0], 3 * x)
    for n, m in [(2, 5), (1, 5), (5, 2)]:
        with pytest.raises(disc.ShapeError, match=f"input 'y' dim 0 is {m} but must equal input 'x' dim 0"):
            prog(np.ones((n, 3), np.float32), np.ones((m, 3), np.float32))


def test_dynamic_pins_or_renames_dims_and_checks_its_axes():
    model = encoder_layer()
    prog = disc.onnx.compile(model, dynamic={"x": {0: 2}, "mask": {0: 2}})
    x, mask = _text_inputs(np.random.default_rng(4), 2, 9)
    _check(prog, ort.InferenceSession(model.SerializeToString()), {"x": x, "mask": mask})
    with pytest.raises(disc.ShapeError, match="input 'x' dim 0 is 3"):
        prog(*_text_inputs(np.random.default_rng(5), 3, 9))
    with pytest.raises(disc.CompileError, match="names axis 5"):
        disc.onnx.compile(model, dynamic={"x": {5: "n"}})
    with pytest.raises(disc.CompileError, match="names input"):
        disc.onnx.compile(model, dynamic={"ids": {0: "n"}})


def test_an_unsupported_op_is_named_with_its_node_and_opset_before_anything_runs():
    n = helper.make_node
    model = _model(
        [n("Relu", ["x"], ["r"]), n("NonMaxSuppression", ["boxes", "scores"], ["sel"], name="nms")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4]), helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, "k", 4]), helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 1, "k"])],
        [helper.make_tensor_value_info("sel", TensorProto.INT64, ["m", 3])],
        [],
    )
    with pytest.raises(disc.CompileError, match=r"node 'nms' \(NonMaxSuppression, opset 20\): NonMaxSuppression is not supported"):
        disc.onnx.compile(model)
    with pytest.raises(disc.CompileError, match="no ONNX file"):
        disc.onnx.compile("/nonexistent/model.onnx")


def small_cnn() -> onnx.ModelProto:
    """Conv -> Relu -> Conv (stride 2, grouped) -> mean over the image -> Flatten -> Gemm (transB)."""
    rng = np.random.default_rng(6)
    n = helper.make_node
    nodes = [
        n("Conv", ["img", "w1", "c1"], ["a0"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        n("Relu", ["a0"], ["a"]),
        n("Conv", ["a", "w2"], ["b0"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2], group=2),
        n("Sigmoid", ["b0"], ["b"]),
        n("ReduceMean", ["b", "hw"], ["pooled"], keepdims=1),
        n("Flatten", ["pooled"], ["flat"], axis=1),
        n("Gemm", ["flat", "fc", "fcb"], ["logits"], transB=1, alpha=0.5),
    ]
    inits = [_f32(rng, "w1", 8, 3, 3, 3), _f32(rng, "c1", 8), _f32(rng, "w2", 8, 4, 3, 3), _f32(rng, "fc", 5, 8), _f32(rng, "fcb", 5), _i64("hw", [2, 3])]
    return _model(nodes, [helper.make_tensor_value_info("img", TensorProto.FLOAT, ["n", 3, "h", "w"])], [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["n", 5])], inits)


def test_a_cnn_at_several_image_sizes():
    model = small_cnn()
    sess = ort.InferenceSession(model.SerializeToString())
    prog = disc.onnx.compile(model)
    rng = np.random.default_rng(7)
    for shape in [(1, 3, 1, 1), (1, 3, 7, 5), (2, 3, 16, 16), (3, 3, 9, 12)]:
        _check(prog, sess, {"img": rng.standard_normal(shape).astype(np.float32)}, tol=1e-4)


def shape_ops() -> onnx.ModelProto:
    """Position ids by Range over the sequence's length, an embedding Gather, a Slice whose end
    may pass the dim (ONNX clamps it), Expand, ConstantOfShape, Where and a Squeeze."""
    rng = np.random.default_rng(8)
    n = helper.make_node
    nodes = [
        n("Shape", ["ids"], ["shape"]),
        n("Gather", ["shape", "one"], ["s"], axis=0),
        n("Range", ["zero", "s", "one"], ["pos"]),
        n("Gather", ["table", "ids"], ["tok"], axis=0),
        n("Gather", ["ptable", "pos"], ["posv"], axis=0),
        n("Add", ["tok", "posv"], ["emb"]),
        n("Slice", ["emb", "start", "end", "axis1"], ["head"]),
        n("ConstantOfShape", ["shape"], ["zeros"], value=numpy_helper.from_array(np.array([0.5], np.float32))),
        n("Unsqueeze", ["zeros", "last"], ["zeros3"]),
        n("Expand", ["zeros3", "full"], ["halfs"]),
        n("Greater", ["emb", "halfs"], ["big"]),
        n("Where", ["big", "emb", "halfs"], ["clipped"]),
        n("ReduceSum", ["clipped", "axis1"], ["summed"], keepdims=1),
        n("Squeeze", ["summed", "axis1"], ["out"]),
    ]
    inits = [_f32(rng, "table", 11, 6, scale=1.0), _f32(rng, "ptable", 40, 6, scale=1.0), _i64("zero", 0), _i64("one", 1), _i64("start", [1]), _i64("end", [4]), _i64("axis1", [1]), _i64("last", [2]), _i64("full", [1, 1, 6])]
    return _model(
        nodes,
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 6]), helper.make_tensor_value_info("head", TensorProto.FLOAT, ["batch", None, 6])],
        inits,
    )


def test_shape_subgraphs_ranges_slices_past_the_end_and_masks():
    model = shape_ops()
    sess = ort.InferenceSession(model.SerializeToString())
    prog = disc.onnx.compile(model)
    rng = np.random.default_rng(9)
    for b, s in [(1, 1), (1, 2), (2, 3), (3, 4), (2, 9), (1, 40)]:
        _check(prog, sess, {"ids": rng.integers(0, 11, (b, s)).astype(np.int64)})


def flattened_feature_map() -> onnx.ModelProto:
    """What torch.export writes for ``conv(x).flatten(2)`` after a stride-2 convolution: the map's
    side as arithmetic on the input's dims (Shape -> Squeeze -> Add -> Div -> Add), h * w as a 0-d
    product reshaped to [-1], joined to the batch and channels by a Concat, then a Reshape."""
    rng = np.random.default_rng(12)
    n = helper.make_node
    nodes = [
        n("Shape", ["x"], ["batch"], start=0, end=1),
        n("Shape", ["x"], ["h1"], start=2, end=3),
        n("Shape", ["x"], ["w1"], start=3, end=4),
        n("Squeeze", ["h1"], ["h"]),
        n("Squeeze", ["w1"], ["w"]),
        n("Add", ["h", "minus_one"], ["h_less"]),
        n("Div", ["h_less", "two"], ["h_half"]),
        n("Add", ["h_half", "one"], ["oh"]),
        n("Add", ["w", "minus_one"], ["w_less"]),
        n("Div", ["w_less", "two"], ["w_half"]),
        n("Add", ["w_half", "one"], ["ow"]),
        n("Mul", ["oh", "ow"], ["area"]),
        n("Reshape", ["area", "flat"], ["area1"]),
        n("Concat", ["batch", "channels", "area1"], ["target"], axis=0),
        n("Conv", ["x", "weight", "bias"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2]),
        n("Reshape", ["y", "target"], ["out"], allowzero=1),
    ]
    inits = [_i64("minus_one", -1), _i64("two", 2), _i64("one", 1), _i64("flat", [-1]), _i64("channels", [4]), _f32(rng, "weight", 4, 3, 3, 3), _f32(rng, "bias", 4)]
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, "height", "width"])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 4, None])],
        inits,
    )


def _one_program_matches_ort(model: onnx.ModelProto, shapes: list[tuple[int, ...]], seed: int) -> None:
    """``model`` compiled once matches ONNX Runtime on random ``x`` of each shape."""
    sess = ort.InferenceSession(model.SerializeToString())
    prog = disc.onnx.compile(model)
    rng = np.random.default_rng(seed)
    for shape in shapes:
        _check(prog, sess, {"x": rng.standard_normal(shape).astype(np.float32)}, tol=1e-5)
    assert getattr(prog, "compilations", 1) == 1


def test_a_shape_computed_from_dims_and_reshaped_to_one_dim_stays_symbolic():
    _one_program_matches_ort(flattened_feature_map(), [(1, 3, 1, 1), (1, 3, 2, 5), (2, 3, 7, 4), (3, 3, 16, 9), (1, 3, 33, 17)], seed=13)


def mask_over_the_batch() -> onnx.ModelProto:
    """What torch.export writes for GPT-2's ``attention_mask.view(batch, -1)`` and the positions
    after it, where the mask's dims share no symbol with the ids' batch: a Reshape to [batch, -1],
    a Range up to (mask elements) // batch, and a patch count squared by Pow (ViT's)."""
    n = helper.make_node
    nodes = [
        n("Shape", ["ids"], ["batch"], start=0, end=1),
        n("Squeeze", ["batch"], ["b"]),
        n("Shape", ["mask"], ["m0"], start=0, end=1),
        n("Shape", ["mask"], ["m1"], start=1, end=2),
        n("Squeeze", ["m0"], ["mb"]),
        n("Squeeze", ["m1"], ["ms"]),
        n("Mul", ["mb", "ms"], ["elements"]),
        n("Div", ["elements", "b"], ["per_row"]),
        n("Range", ["zero", "per_row", "one"], ["positions"]),
        n("Concat", ["batch", "minus_one"], ["rows"], axis=0),
        n("Reshape", ["mask", "rows"], ["mask_rows"]),
        n("Cast", ["positions"], ["positions_f"], to=TensorProto.FLOAT),
        n("Mul", ["mask_rows", "positions_f"], ["weighted"]),
        n("Div", ["per_row", "two"], ["half"]),
        n("Pow", ["half", "two"], ["squared"]),
        n("Reshape", ["squared", "minus_one"], ["squared1"]),
        n("ConstantOfShape", ["squared1"], ["fill"], value=numpy_helper.from_array(np.array([1.0], np.float32))),
    ]
    inits = [_i64("zero", 0), _i64("one", 1), _i64("two", 2), _i64("minus_one", [-1])]
    return _model(
        nodes,
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["b", "s"]), helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["mb", "ms"])],
        [helper.make_tensor_value_info("weighted", TensorProto.FLOAT, ["b", None]), helper.make_tensor_value_info("fill", TensorProto.FLOAT, [None])],
        inits,
    )


def test_sizes_divided_by_a_dim_they_share_no_symbol_with_are_divided_at_run_time():
    model = mask_over_the_batch()
    sess = ort.InferenceSession(model.SerializeToString())
    prog = disc.onnx.compile(model)
    rng = np.random.default_rng(14)
    for b, s, mb, ms in [(1, 1, 1, 1), (1, 3, 1, 3), (2, 5, 2, 5), (2, 4, 1, 8), (3, 7, 3, 7), (4, 1, 2, 6)]:
        feeds = {"ids": rng.integers(0, 9, (b, s)).astype(np.int64), "mask": rng.standard_normal((mb, ms)).astype(np.float32)}
        _check(prog, sess, feeds)
    # Elements that do not fill the rows: ONNX Runtime refuses, and so does disc, saying which rule.
    feeds = {"ids": np.zeros((2, 3), np.int64), "mask": np.ones((1, 3), np.float32)}
    from onnxruntime.capi.onnxruntime_pybind11_state import Fail, RuntimeException

    with pytest.raises((Fail, RuntimeException)):
        sess.run(None, feeds)
    with pytest.raises(disc.ShapeError, match="Reshape"):
        prog(**feeds)


def shapes_from_dims_as_operands() -> onnx.ModelProto:
    """Operands torch.export computes from the input's dims: Tile's repeats (DeBERTa's mask over
    the batch), a whole-axis flip by a Slice of step -1 (wav2vec2's), a Resize to sizes built from
    the input's sides (SegFormer's decoder)."""
    n = helper.make_node
    nodes = [
        n("Shape", ["x"], ["batch"], start=0, end=1),
        n("Shape", ["x"], ["h1"], start=2, end=3),
        n("Shape", ["x"], ["w1"], start=3, end=4),
        n("Concat", ["batch", "one", "one"], ["repeats"], axis=0),
        n("Tile", ["row", "repeats"], ["tiled"]),
        n("Slice", ["x", "minus_one", "int64_min", "minus_one", "minus_one"], ["flipped"]),
        n("Squeeze", ["h1"], ["h"]),
        n("Squeeze", ["w1"], ["w"]),
        n("Mul", ["h", "two"], ["h2"]),
        n("Add", ["w", "one_scalar"], ["w2"]),
        n("Reshape", ["h2", "minus_one"], ["h2v"]),
        n("Reshape", ["w2", "minus_one"], ["w2v"]),
        n("Concat", ["batch", "channels", "h2v", "w2v"], ["sizes"], axis=0),
        n("Resize", ["flipped", "", "", "sizes"], ["resized"], mode="linear", coordinate_transformation_mode="half_pixel"),
    ]
    inits = [
        _i64("one", [1]), _i64("minus_one", [-1]), _i64("int64_min", [np.iinfo(np.int64).min]), _i64("two", 2), _i64("one_scalar", 1), _i64("channels", [2]),
        numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(1, 2, 3), "row"),
    ]
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2, "height", "width"])],
        [helper.make_tensor_value_info(v, TensorProto.FLOAT, [None, None, None, None][: 3 if v == "tiled" else 4]) for v in ("tiled", "flipped", "resized")],
        inits,
    )


def test_tile_repeats_flips_and_resize_sizes_computed_from_dims_stay_symbolic():
    _one_program_matches_ort(shapes_from_dims_as_operands(), [(1, 2, 1, 1), (1, 2, 3, 2), (2, 2, 5, 4), (3, 2, 1, 7), (1, 2, 9, 9)], seed=15)


def test_a_compiled_onnx_program_saves_and_runs_with_numpy_alone(tmp_path):
    import disc_runtime

    model = encoder_layer()
    prog = disc.onnx.compile(model)
    folder = prog.save(tmp_path / "encoder")
    loaded = disc_runtime.load(folder)
    assert [t.name for t in loaded.inputs] == ["x", "mask"]
    x, mask = _text_inputs(np.random.default_rng(10), 3, 11)
    for g, w in zip(loaded.run(x, mask), prog(x, mask)):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


def test_dim_params_that_are_not_identifiers_are_kept_apart_and_saved(tmp_path):
    # A dim_param is any string; used as a symbol's name, "batch size" could not be saved. The
    # names given instead must not merge it with a dim whose name they take ("batch_size", "d1").
    import disc_runtime

    n = helper.make_node
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch size", "N + 1"]),
        helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch_size", None]),
        helper.make_tensor_value_info("z", TensorProto.FLOAT, ["d1", "批"]),
    ]
    outputs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, [None, None]) for o in ("rx", "ry", "rz")]
    model = _model([n("Relu", ["x"], ["rx"]), n("Neg", ["y"], ["ry"]), n("Abs", ["z"], ["rz"])], inputs, outputs, [])
    prog = disc.onnx.compile(model)
    loaded = disc_runtime.load(prog.save(tmp_path / "p"))
    rng = np.random.default_rng(0)
    # Every dim a different size: none of the six may have been merged with another.
    x, y, z = (rng.standard_normal(s).astype(np.float32) for s in ((2, 3), (4, 5), (6, 7)))
    for got in (prog(x, y, z), loaded.run(x, y, z)):
        for g, w in zip(got, (np.maximum(x, 0), -y, np.abs(z))):
            np.testing.assert_array_equal(g, w)


def test_a_dynamic_name_that_is_not_an_identifier_is_refused_by_name():
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])], [])
    with pytest.raises(disc.CompileError, match=r"dynamic\['x'\] names dim 0 'n rows'; a dim name is ASCII letters"):
        disc.onnx.compile(model, dynamic={"x": {0: "n rows"}})


def _shape_from_the_caller() -> onnx.ModelProto:
    """y = ReduceSum(Reshape(x, shape), axes) + 1: both the shape and the axes are inputs."""
    n = helper.make_node
    nodes = [n("Reshape", ["x", "shape"], ["r"]), n("ReduceSum", ["r", "axes"], ["s"], keepdims=0), n("Add", ["s", "one"], ["y"])]
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 6]),
        helper.make_tensor_value_info("shape", TensorProto.INT64, [3]),
        helper.make_tensor_value_info("axes", TensorProto.INT64, [1]),
    ]
    one = numpy_helper.from_array(np.array(1.0, np.float32), "one")
    return _model(nodes, inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", "k"])], [one])


def test_inputs_used_as_shapes_compile_per_value_and_other_dims_stay_symbolic(tmp_path):
    """Issue 46: a Reshape's shape and a ReduceSum's axes passed by the caller were refused
    ('must be known when the model is compiled'). The program now compiles at its first call
    for those values (both inputs found, one after the other), reuses that version while they
    repeat, whatever the other input's shape, and compiles again for new values."""
    m = _shape_from_the_caller()
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    prog = disc.onnx.compile(m)
    assert isinstance(prog, disc.onnx.ValueSpecializedProgram)
    rng = np.random.default_rng(0)
    calls = [((-1, 2, 3), (1,)), ((-1, 2, 3), (1,)), ((-1, 2, 3), (1,)), ((-1, 3, 2), (2,)), ((-1, 2, 3), (1,))]
    for rows, (shape, axes) in zip((1, 4, 7, 4, 2), calls):
        feeds = {"x": rng.standard_normal((rows, 6)).astype(np.float32), "shape": np.array(shape, np.int64), "axes": np.array(axes, np.int64)}
        (got,) = prog(**feeds)
        np.testing.assert_allclose(got, sess.run(None, feeds)[0], rtol=1e-5, atol=1e-5)
    assert prog.value_inputs == ["shape", "axes"]
    assert prog.compilations == 2  # one per distinct (shape, axes); the row count never recompiles
    with pytest.raises(disc.CompileError, match=r"values="):
        prog.save(tmp_path / "p")
    fixed = disc.onnx.compile(m, values={"shape": np.array([-1, 2, 3]), "axes": np.array([1])})
    assert fixed.input_names == ["x"]
    x = rng.standard_normal((5, 6)).astype(np.float32)
    np.testing.assert_allclose(fixed(x)[0], sess.run(None, {"x": x, "shape": np.array([-1, 2, 3]), "axes": np.array([1])})[0], rtol=1e-5, atol=1e-5)
    with pytest.raises(disc.CompileError, match=r"input 'shape' is i64 in the model; its value is int32"):
        disc.onnx.compile(m, values={"shape": np.array([-1, 2, 3], np.int32), "axes": np.array([1])})
    with pytest.raises(disc.CompileError, match=r"input 'axes'.*give it in values="):
        disc.onnx.compile(m, values={"shape": np.array([-1, 2, 3])})


def test_the_command_line_compiles_explains_saves_and_runs_an_onnx_file(tmp_path, capsys):
    """Issue 46 part 6: disc compile model.onnx -o folder (values of shape inputs from .npy),
    disc explain model.onnx, disc run folder --input x=x.npy (numpy alone), against ONNX Runtime."""
    from disc.cli import main

    m = _shape_from_the_caller()
    path, folder, out = tmp_path / "m.onnx", tmp_path / "m.disc", tmp_path / "out"
    onnx.save(m, str(path))
    np.save(tmp_path / "shape.npy", np.array([-1, 3, 2]))
    np.save(tmp_path / "axes.npy", np.array([2]))
    x = np.random.default_rng(1).standard_normal((3, 6)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    assert main(["compile", str(path), "-o", str(folder)]) == 2  # the shape inputs' values are needed
    assert "--value" in capsys.readouterr().err
    values = ["--value", f"shape={tmp_path / 'shape.npy'}", "--value", f"axes={tmp_path / 'axes.npy'}"]
    assert main(["explain", str(path), "--dynamic", "x:0=rows", *values]) == 0
    assert "rows" in capsys.readouterr().out
    assert main(["compile", str(path), "-o", str(folder), "--dynamic", "x:0=rows", *values]) == 0
    assert main(["run", str(folder), "--input", f"x={tmp_path / 'x.npy'}", "--output", str(out)]) == 0
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x, "shape": np.array([-1, 3, 2]), "axes": np.array([2])})[0]
    np.testing.assert_allclose(np.load(out / "output0.npy"), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(SystemExit, match="NAME:AXIS=SYMBOL"):
        main(["compile", str(path), "-o", str(folder), "--dynamic", "x:zero=rows"])


def _one_node(op, inputs, outputs, inits=(), opset=21, **attrs):
    """A model of one ``op`` node; ``inputs``/``outputs`` are (name, element type, dims) with
    dim_param names for the dims that vary."""
    info = [helper.make_tensor_value_info(n, t, d) for n, t, d in inputs]
    outs = [helper.make_tensor_value_info(n, t, d) for n, t, d in outputs]
    names = [n for n, _, _ in inputs] + [i.name for i in inits]
    node = helper.make_node(op, names, [n for n, _, _ in outputs], **attrs)
    return _model([node], info, outs, list(inits), opset=opset)


F, I = TensorProto.FLOAT, TensorProto.INT64


def _scores_and_labels(rng, n, d):
    labels = rng.integers(0, 5, (n, d)).astype(np.int64)
    labels[0, 0] = -1  # the ignored label
    return {"x": rng.standard_normal((n, 5, d)).astype(np.float32), "t": labels}


# (id, model, feeds(rng, *dims), streams of dims): every stream starts with a 1-sized dim.
def _unsigned_bits_model() -> onnx.ModelProto:
    """u16/u32/u64 arithmetic that wraps, truncating division, shifts by amounts past the width,
    and bitcasts both ways (opset 26's BitCast, opset 28's shift rule)."""
    n = helper.make_node
    U16, U32, U64 = TensorProto.UINT16, TensorProto.UINT32, TensorProto.UINT64
    nodes = [
        n("Mul", ["a", "b"], ["ab"]), n("Sub", ["ab", "a"], ["wrapped"]),
        n("Div", ["wrapped", "w"], ["q"]), n("Mod", ["wrapped", "w"], ["r"]),
        n("BitShift", ["x", "s"], ["left"], direction="LEFT"), n("BitShift", ["x", "s"], ["right"], direction="RIGHT"),
        n("Cast", ["s"], ["s64"], to=U64), n("BitShift", ["z", "s64"], ["z_right"], direction="RIGHT"),
        n("BitCast", ["x"], ["as_float"], to=TensorProto.FLOAT), n("BitCast", ["as_float"], ["as_int"], to=TensorProto.INT32),
        n("Max", ["z", "z_right"], ["zmax"]), n("Less", ["left", "right"], ["less"]),
    ]  # fmt: skip
    inputs = [("a", U16, ["n", "d"]), ("b", U16, ["n", "d"]), ("w", U16, ["d"]), ("x", U32, ["n", "d"]), ("s", U32, ["n", "d"]), ("z", U64, ["n", "d"])]
    outputs = [("q", U16), ("r", U16), ("left", U32), ("right", U32), ("z_right", U64), ("as_float", TensorProto.FLOAT), ("as_int", TensorProto.INT32), ("zmax", U64), ("less", TensorProto.BOOL)]
    return _model(nodes, [helper.make_tensor_value_info(k, t, d) for k, t, d in inputs], [helper.make_tensor_value_info(k, t, ["n", "d"]) for k, t in outputs], [], opset=28)


def _unsigned_bits_inputs(rng, n, d):
    def draw(dtype, *shape):
        return rng.integers(0, np.iinfo(dtype).max, size=shape, dtype=dtype, endpoint=True)

    x = draw(np.uint32, n, d)
    x.reshape(-1)[:1] = 0x7F800001  # a signalling NaN's bits pass through the float bitcast unchanged
    return {"a": draw(np.uint16, n, d), "b": draw(np.uint16, n, d), "w": np.maximum(draw(np.uint16, d), 1), "x": x, "s": rng.integers(0, 70, size=(n, d), dtype=np.uint32), "z": draw(np.uint64, n, d)}


def _causal_conv_with_state(past: bool) -> onnx.ModelProto:
    inputs = [("x", F, ["b", 4, "t"])] + ([("past", F, ["b", 4, 2])] if past else [])
    names = ["x", "w", "bias"] + (["past"] if past else [])
    node = helper.make_node("CausalConvWithState", names, ["y", "state"], activation="silu" if past else "none")
    inits = [_f32(np.random.default_rng(5), "w", 4, 1, 3, scale=1.0), _f32(np.random.default_rng(6), "bias", 4)]
    return _model([node], [helper.make_tensor_value_info(*i) for i in inputs], [helper.make_tensor_value_info("y", F, ["b", 4, "t"]), helper.make_tensor_value_info("state", F, ["b", 4, 2])], inits, opset=27)


def _kv_cache_write(mode: str) -> onnx.ModelProto:
    node = helper.make_node("TensorScatter", ["cache", "update", "at"], ["present"], mode=mode, axis=2)
    inputs = [("cache", F, ["b", 2, 6, 3]), ("update", F, ["b", 2, "s", 3]), ("at", I, ["b"])]
    return _model([node], [helper.make_tensor_value_info(*i) for i in inputs], [helper.make_tensor_value_info("present", F, ["b", 2, 6, 3])], [], opset=24)


def _kv_cache_inputs(rng, b, s):
    return {"cache": rng.standard_normal((b, 2, 6, 3)).astype(np.float32), "update": rng.standard_normal((b, 2, s, 3)).astype(np.float32), "at": rng.integers(0, 7 - s, b).astype(np.int64)}


def _optimizer_steps() -> onnx.ModelProto:
    """Adam on two tensors and Nesterov momentum on one (ai.onnx.preview.training), one step."""
    n = helper.make_node
    nodes = [
        n("Adam", ["r", "t", "x", "y", "gx", "gy", "vx", "vy", "hx", "hy"], ["x2", "y2", "vx2", "vy2", "hx2", "hy2"], domain="ai.onnx.preview.training", alpha=0.8, beta=0.95, epsilon=1e-4, norm_coefficient=0.01, norm_coefficient_post=0.02),
        n("Momentum", ["r", "t", "x", "gx", "vx"], ["xm", "vm"], domain="ai.onnx.preview.training", alpha=0.9, beta=0.5, mode="nesterov", norm_coefficient=0.1),
    ]  # fmt: skip
    tensors = {"x": ["n", 3], "y": ["m"], "gx": ["n", 3], "gy": ["m"], "vx": ["n", 3], "vy": ["m"], "hx": ["n", 3], "hy": ["m"]}
    inputs = [helper.make_tensor_value_info("r", F, []), helper.make_tensor_value_info("t", I, [])] + [helper.make_tensor_value_info(k, F, d) for k, d in tensors.items()]
    outputs = [helper.make_tensor_value_info(k, F, tensors[k.removesuffix("2")]) for k in ["x2", "y2", "vx2", "vy2", "hx2", "hy2"]]
    outputs += [helper.make_tensor_value_info("xm", F, ["n", 3]), helper.make_tensor_value_info("vm", F, ["n", 3])]
    m = helper.make_model(helper.make_graph(nodes, "m", inputs, outputs), opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("ai.onnx.preview.training", 1)])
    onnx.checker.check_model(m)
    return m


def _optimizer_inputs(rng, n, m, t):
    feeds = {"r": np.array(0.1, np.float32), "t": np.array(t, np.int64)}
    for k, shape in {"x": (n, 3), "y": (m,), "gx": (n, 3), "gy": (m,), "vx": (n, 3), "vy": (m,)}.items():
        feeds[k] = rng.standard_normal(shape).astype(np.float32)
    feeds["hx"], feeds["hy"] = rng.random((n, 3)).astype(np.float32), rng.random(m).astype(np.float32)
    return feeds


def _flex_attention() -> onnx.ModelProto:
    """FlexAttention (ai.onnx.preview) with grouped query heads, a soft-capping score_mod and a
    prob_mod that reads the scores' shape."""
    n = helper.make_node
    scores = helper.make_tensor_value_info("s", F, None)
    cap = helper.make_graph(
        [n("Div", ["s", "cap"], ["d"]), n("Tanh", ["d"], ["t"]), n("Mul", ["t", "cap"], ["capped"])], "soft_cap", [scores], [helper.make_tensor_value_info("capped", F, None)],
        [numpy_helper.from_array(np.array(5.0, np.float32), "cap")],
    )  # fmt: skip
    probs = helper.make_tensor_value_info("p", F, None)
    rescale = helper.make_graph(
        [n("Shape", ["p"], ["shape"]), n("Gather", ["shape", "last"], ["keys"]), n("Cast", ["keys"], ["kf"], to=F), n("Mul", ["p", "kf"], ["scaled"])], "times_keys", [probs], [helper.make_tensor_value_info("scaled", F, None)],
        [numpy_helper.from_array(np.array(3, np.int64), "last")],
    )  # fmt: skip
    node = n("FlexAttention", ["q", "k", "v"], ["y"], domain="ai.onnx.preview", score_mod=cap, prob_mod=rescale, scale=0.3)
    inputs = [helper.make_tensor_value_info("q", F, ["b", 4, "l", 8]), helper.make_tensor_value_info("k", F, ["b", 2, "s", 8]), helper.make_tensor_value_info("v", F, ["b", 2, "s", 6])]
    m = helper.make_model(helper.make_graph([node], "m", inputs, [helper.make_tensor_value_info("y", F, ["b", 4, "l", 6])]), opset_imports=[helper.make_opsetid("", 26), helper.make_opsetid("ai.onnx.preview", 1)])
    return m


def _regions(rng, n, h, w, r):
    corners = rng.uniform(-2, 1.2, (r, 2)) * [w, h]
    sizes = rng.uniform(0.1, 1.5, (r, 2)) * [w, h]
    boxes = np.concatenate([corners, corners + sizes], axis=1).astype(np.float32)
    return {"x": rng.standard_normal((n, 3, h, w)).astype(np.float32), "rois": boxes, "batch": rng.integers(0, n, r).astype(np.int64)}


def _roi_align(**attrs) -> onnx.ModelProto:
    return _one_node("RoiAlign", [("x", F, ["n", 3, "h", "w"]), ("rois", F, ["r", 4]), ("batch", I, ["r"])], [("y", F, ["r", 3, 2, 3])], opset=16, output_height=2, output_width=3, sampling_ratio=2, **attrs)


def _deform_inputs(rng, n, h, w):
    oh, ow = (h + 2 - 2 - 1) // 2 + 1, (w + 2 - 2 - 1) // 2 + 1  # pads 1, kernel 2 dilated by 2 (extent 3), stride 2
    return {
        "x": rng.standard_normal((n, 4, h, w)).astype(np.float32),
        "offset": (rng.standard_normal((n, 2 * 2 * 2 * 2, oh, ow)) * 1.5).astype(np.float32),
        "mask": rng.random((n, 2 * 2 * 2, oh, ow)).astype(np.float32),
    }


DYNAMIC_CASES = [
    (
        "deform_conv_groups_offset_groups_mask_bias",
        lambda: _model(
            [helper.make_node("DeformConv", ["x", "w", "offset", "b", "mask"], ["y"], group=2, offset_group=2, strides=[2, 2], pads=[1, 1, 1, 1], dilations=[2, 2], kernel_shape=[2, 2])],
            [helper.make_tensor_value_info("x", F, ["n", 4, "h", "w"]), helper.make_tensor_value_info("offset", F, ["n", 16, "oh", "ow"]), helper.make_tensor_value_info("mask", F, ["n", 8, "oh", "ow"])],
            [helper.make_tensor_value_info("y", F, ["n", 6, "oh", "ow"])],
            [_f32(np.random.default_rng(12), "w", 6, 2, 2, 2, scale=1.0), _f32(np.random.default_rng(13), "b", 6)],
            opset=22,
        ),
        _deform_inputs,
        [(1, 2, 2), (2, 5, 7), (1, 8, 3)],
    ),
    *[
        (
            f"tfidf_vectorizer_{mode.lower()}_uni_bi_trigrams_skip2",
            lambda mode=mode: _one_node(
                "TfIdfVectorizer", [("x", TensorProto.INT32, ["n", "c"])], [("y", F, ["n", 7])], opset=13, mode=mode, min_gram_length=1, max_gram_length=3, max_skip_count=2,
                ngram_counts=[0, 3, 7], ngram_indexes=[6, 0, 1, 2, 3, 5, 4], pool_int64s=[1, 2, 3, 1, 2, 2, 3, 1, 2, 3], weights=[0.5, 1, 2, 3, 4, 5, 6],
            ),
            lambda rng, n, c: {"x": rng.integers(0, 4, (n, c)).astype(np.int32)},
            [(1, 1), (1, 2), (3, 9), (2, 4)],
        )
        for mode in ("TF", "IDF", "TFIDF")
    ],
    *[
        (
            f"resize_antialias_{mode}_downsampling",
            lambda mode=mode: _model(
                [helper.make_node("Resize", ["x", "", "scales"], ["y"], mode=mode, antialias=1, exclude_outside=int(mode == "cubic"))],
                [helper.make_tensor_value_info("x", F, ["n", 2, "h", "w"])],
                [helper.make_tensor_value_info("y", F, ["n", 2, "oh", "ow"])],
                [numpy_helper.from_array(np.array([1, 1, 0.5, 0.25], np.float32), "scales")],
                opset=18,
            ),
            lambda rng, n, h, w: {"x": rng.standard_normal((n, 2, h, w)).astype(np.float32)},
            [(1, 2, 4), (2, 6, 9), (1, 11, 17)],
        )
        for mode in ("linear", "cubic")
    ],
    ("roi_align_avg_half_pixel", lambda: _roi_align(spatial_scale=0.5), _regions, [(1, 1, 1, 1), (2, 5, 7, 3), (1, 9, 4, 6)]),
    ("roi_align_max_output_half_pixel", lambda: _roi_align(mode="max", coordinate_transformation_mode="output_half_pixel"), _regions, [(1, 1, 1, 1), (2, 6, 5, 4), (3, 2, 8, 2)]),
    (
        "determinants_of_1_3_and_4_square_matrices",
        lambda: _model(
            [helper.make_node("Det", [f"a{k}"], [f"d{k}"]) for k in (1, 3, 4)],
            [helper.make_tensor_value_info(f"a{k}", F, ["b", k, k]) for k in (1, 3, 4)],
            [helper.make_tensor_value_info(f"d{k}", F, ["b"]) for k in (1, 3, 4)],
            [],
            opset=13,
        ),
        lambda rng, b: {f"a{k}": rng.standard_normal((b, k, k)).astype(np.float32) for k in (1, 3, 4)},
        [(1,), (5,)],
    ),
    (
        "flex_attention_gqa_score_and_prob_mods",
        _flex_attention,
        lambda rng, b, l, s: {"q": rng.standard_normal((b, 4, l, 8)).astype(np.float32), "k": rng.standard_normal((b, 2, s, 8)).astype(np.float32), "v": rng.standard_normal((b, 2, s, 6)).astype(np.float32)},
        [(1, 1, 1), (2, 3, 5), (1, 7, 2)],
    ),
    ("optimizer_steps_adam_and_nesterov", _optimizer_steps, _optimizer_inputs, [(1, 1, 0), (2, 5, 3), (4, 1, 1)]),
    (
        "batch_norm_training_and_dropout_ratio_zero",
        lambda: _model(
            [
                helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"], ["y", "running_mean", "running_var"], training_mode=1, momentum=0.8),
                helper.make_node("Dropout", ["y", "zero", "yes"], ["z", "mask"]),
            ],
            [helper.make_tensor_value_info("x", F, ["n", 3, "h"])],
            [helper.make_tensor_value_info("z", F, ["n", 3, "h"]), helper.make_tensor_value_info("mask", TensorProto.BOOL, ["n", 3, "h"]), helper.make_tensor_value_info("running_mean", F, [3]), helper.make_tensor_value_info("running_var", F, [3])],
            [_f32(np.random.default_rng(7), "scale", 3), _f32(np.random.default_rng(8), "bias", 3), _f32(np.random.default_rng(9), "mean", 3), numpy_helper.from_array(np.array([0.5, 1.0, 2.0], np.float32), "var"),
             numpy_helper.from_array(np.array(0.0, np.float32), "zero"), numpy_helper.from_array(np.array(True), "yes")],
            opset=15,
        ),
        lambda rng, n, h: {"x": rng.standard_normal((n, 3, h)).astype(np.float32) * 2 + 1},
        [(1, 2), (2, 1), (3, 5)],
    ),
    ("unsigned_arithmetic_shifts_and_bitcasts", _unsigned_bits_model, _unsigned_bits_inputs, [(1, 1), (1, 5), (4, 3), (2, 1)]),
    (
        "causal_conv_with_state_zero_past",
        lambda: _causal_conv_with_state(False),
        lambda rng, b, t: {"x": rng.standard_normal((b, 4, t)).astype(np.float32)},
        [(1, 1), (2, 5), (1, 2)],
    ),
    (
        "causal_conv_with_state_past_silu",
        lambda: _causal_conv_with_state(True),
        lambda rng, b, t: {"x": rng.standard_normal((b, 4, t)).astype(np.float32), "past": rng.standard_normal((b, 4, 2)).astype(np.float32)},
        [(1, 1), (3, 4), (1, 7)],
    ),
    ("tensor_scatter_linear", lambda: _kv_cache_write("linear"), _kv_cache_inputs, [(1, 1), (2, 3), (1, 6)]),
    (
        "tensor_scatter_circular",
        lambda: _kv_cache_write("circular"),
        lambda rng, b, s: {**_kv_cache_inputs(rng, b, s), "at": rng.integers(0, 12, b).astype(np.int64)},
        [(1, 1), (3, 4), (2, 6)],
    ),
    (
        "compress_and_nonzero",
        lambda: _model(
            [helper.make_node("Compress", ["x", "keep"], ["rows"], axis=1), helper.make_node("Compress", ["x", "keep"], ["flat"]), helper.make_node("NonZero", ["x"], ["where"])],
            [helper.make_tensor_value_info("x", F, ["n", "m"]), helper.make_tensor_value_info("keep", TensorProto.BOOL, ["k"])],
            [helper.make_tensor_value_info("rows", F, ["n", "r"]), helper.make_tensor_value_info("flat", F, ["f"]), helper.make_tensor_value_info("where", I, [2, "z"])],
            [],
            opset=13,
        ),
        lambda rng, n, m, k: {"x": np.where(rng.random((n, m)) < 0.4, 0.0, rng.standard_normal((n, m))).astype(np.float32), "keep": rng.random(k) < 0.5},
        [(1, 1, 1), (1, 1, 0), (3, 5, 4), (2, 7, 7), (4, 1, 1)],
    ),
    (
        "col2im_strided_padded",
        lambda: _model(
            [helper.make_node("Col2Im", ["cols", "image", "block"], ["y"], strides=[2, 1], pads=[1, 0, 1, 1], dilations=[1, 2])],
            [helper.make_tensor_value_info("cols", F, ["n", 12, 15])],
            [helper.make_tensor_value_info("y", F, ["n", 2, 5, 6])],
            [_i64("image", [5, 6]), _i64("block", [3, 2])],
            opset=18,
        ),
        lambda rng, n: {"cols": rng.standard_normal((n, 12, 15)).astype(np.float32)},
        [(1,), (3,)],
    ),
    (
        "average_pool_ceil_mode_counting_padding",
        lambda: _one_node("AveragePool", [("x", F, ["n", 2, "h", "w"])], [("y", F, ["n", 2, "oh", "ow"])], kernel_shape=[3, 2], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1, count_include_pad=1),
        lambda rng, n, h, w: {"x": rng.standard_normal((n, 2, h, w)).astype(np.float32)},
        [(1, 1, 1), (1, 2, 3), (2, 5, 4), (1, 6, 7)],
    ),
    (
        "softmax_cross_entropy_weighted_ignore",
        lambda: _one_node("SoftmaxCrossEntropyLoss", [("x", F, ["n", 5, "d"]), ("t", I, ["n", "d"])], [("loss", F, []), ("logp", F, ["n", 5, "d"])], [_f32(np.random.default_rng(1), "w", 5, scale=1.0)], opset=13, ignore_index=-1),
        _scores_and_labels,
        [(1, 1), (1, 4), (3, 7), (2, 2)],
    ),
    (
        "nll_loss_none",
        lambda: _one_node("NegativeLogLikelihoodLoss", [("x", F, ["n", 5, "d"]), ("t", I, ["n", "d"])], [("loss", F, ["n", "d"])], reduction="none", ignore_index=-1, opset=13),
        _scores_and_labels,
        [(1, 1), (2, 3), (4, 1)],
    ),
    (
        "group_norm",
        lambda: _one_node("GroupNormalization", [("x", F, ["n", 6, "h", "w"])], [("y", F, ["n", 6, "h", "w"])], [_f32(np.random.default_rng(2), "scale", 6), _f32(np.random.default_rng(3), "bias", 6)], num_groups=3),
        lambda rng, n, h, w: {"x": rng.standard_normal((n, 6, h, w)).astype(np.float32)},
        [(1, 1, 1), (2, 3, 5), (1, 7, 2)],
    ),
    (
        "space_to_depth_and_back",
        lambda: _model(
            [helper.make_node("SpaceToDepth", ["x"], ["d"], blocksize=2), helper.make_node("DepthToSpace", ["d"], ["y"], blocksize=2, mode="CRD")],
            [helper.make_tensor_value_info("x", F, ["n", 3, "h", "w"])],
            [helper.make_tensor_value_info("d", F, ["n", 12, None, None]), helper.make_tensor_value_info("y", F, ["n", 3, None, None])],
            [],
            opset=13,
        ),
        lambda rng, n, h, w: {"x": rng.standard_normal((n, 3, h, w)).astype(np.float32)},
        [(1, 2, 2), (2, 4, 6), (1, 8, 2)],
    ),
    (
        "reflect_pad",
        lambda: _one_node("Pad", [("x", F, ["n", "c", "h"])], [("y", F, ["n", "c", None])], [_i64("pads", [0, 0, 2, 0, 0, 3])], opset=19, mode="reflect"),
        lambda rng, n, c, h: {"x": rng.standard_normal((n, c, h)).astype(np.float32)},
        [(1, 1, 4), (2, 3, 5), (1, 2, 9)],
    ),
    (
        "edge_and_wrap_pad",
        lambda: _model(
            [helper.make_node("Pad", ["x", "pads"], ["e"], mode="edge"), helper.make_node("Pad", ["x", "pads"], ["w"], mode="wrap")],
            [helper.make_tensor_value_info("x", F, ["n", "h"])],
            [helper.make_tensor_value_info("e", F, [None, None]), helper.make_tensor_value_info("w", F, [None, None])],
            [_i64("pads", [1, 2, 0, 1])],
            opset=19,
        ),
        lambda rng, n, h: {"x": rng.standard_normal((n, h)).astype(np.float32)},
        [(2, 2), (3, 5), (4, 3)],
    ),
    (
        "conv_and_pools_same_upper",
        lambda: _model(
            [
                helper.make_node("Conv", ["x", "k"], ["c"], auto_pad="SAME_UPPER"),
                helper.make_node("MaxPool", ["c"], ["m"], kernel_shape=[2, 2], auto_pad="SAME_LOWER"),
                helper.make_node("LpPool", ["m"], ["y"], kernel_shape=[3, 2], auto_pad="SAME_UPPER", p=2),
            ],
            [helper.make_tensor_value_info("x", F, ["n", 2, "h", "w"])],
            [helper.make_tensor_value_info("y", F, ["n", 3, None, None])],
            [_f32(np.random.default_rng(4), "k", 3, 2, 2, 3)],
            opset=18,
        ),
        lambda rng, n, h, w: {"x": rng.standard_normal((n, 2, h, w)).astype(np.float32)},
        [(1, 1, 1), (2, 4, 5), (1, 7, 3)],
    ),
    (
        "one_hot_gather_nd_reverse_sequence",
        lambda: _model(
            [
                helper.make_node("OneHot", ["i", "depth", "values"], ["h"], axis=1),
                helper.make_node("GatherND", ["table", "pairs"], ["g"]),
                helper.make_node("ReverseSequence", ["x", "lens"], ["r"], batch_axis=0, time_axis=1),
            ],
            [helper.make_tensor_value_info("i", I, ["n", "s"]), helper.make_tensor_value_info("pairs", I, ["n", 2]), helper.make_tensor_value_info("x", F, ["n", "s"]), helper.make_tensor_value_info("lens", I, ["n"])],
            [helper.make_tensor_value_info("h", F, ["n", 4, "s"]), helper.make_tensor_value_info("g", F, ["n", 3]), helper.make_tensor_value_info("r", F, ["n", "s"])],
            [_i64("depth", 4), numpy_helper.from_array(np.array([-1.0, 2.0], np.float32), "values"), _f32(np.random.default_rng(5), "table", 4, 5, 3)],
            opset=13,
        ),
        lambda rng, n, s: {
            "i": rng.integers(-4, 6, (n, s)).astype(np.int64),
            "pairs": np.stack([rng.integers(-4, 4, n), rng.integers(-5, 5, n)], 1).astype(np.int64),
            "x": rng.standard_normal((n, s)).astype(np.float32),
            "lens": rng.integers(1, s + 1, n).astype(np.int64),
        },
        [(1, 1), (3, 4), (2, 7)],
    ),
    (
        "attention_gqa_causal_with_cache_3d",
        lambda: _model(
            [helper.make_node("Attention", ["q", "k", "v", "", "past_k", "past_v"], ["y", "present_k", "present_v"], is_causal=1, q_num_heads=4, kv_num_heads=2)],
            [helper.make_tensor_value_info(n, F, d) for n, d in (("q", ["b", "s", 8]), ("k", ["b", "s", 4]), ("v", ["b", "s", 4]), ("past_k", ["b", 2, "p", 2]), ("past_v", ["b", 2, "p", 2]))],
            [helper.make_tensor_value_info(n, F, d) for n, d in (("y", ["b", "s", 8]), ("present_k", ["b", 2, None, 2]), ("present_v", ["b", 2, None, 2]))],
            [],
            opset=23,
        ),
        lambda rng, b, s, p: {
            "q": rng.standard_normal((b, s, 8)).astype(np.float32), "k": rng.standard_normal((b, s, 4)).astype(np.float32), "v": rng.standard_normal((b, s, 4)).astype(np.float32),
            "past_k": rng.standard_normal((b, 2, p, 2)).astype(np.float32), "past_v": rng.standard_normal((b, 2, p, 2)).astype(np.float32),
        },
        [(1, 1, 1), (2, 3, 4), (1, 5, 2), (3, 1, 6)],
    ),
    (
        "attention_bool_mask_softcap_4d",
        lambda: _one_node(
            "Attention", [("q", F, ["b", 2, "s", 4]), ("k", F, ["b", 2, "t", 4]), ("v", F, ["b", 2, "t", 3]), ("mask", TensorProto.BOOL, ["s", "t"])],
            [("y", F, ["b", 2, "s", 3])], opset=23, softcap=2.0, scale=0.7,
        ),
        lambda rng, b, s, t: {
            "q": rng.standard_normal((b, 2, s, 4)).astype(np.float32), "k": rng.standard_normal((b, 2, t, 4)).astype(np.float32),
            "v": rng.standard_normal((b, 2, t, 3)).astype(np.float32), "mask": rng.random((s, t)) > 0.3,
        },
        [(1, 1, 1), (2, 3, 5), (1, 4, 2)],
    ),
    (
        "conv_transpose_strided_padded",
        lambda: _one_node("ConvTranspose", [("x", F, ["n", 3, "h", "w"])], [("y", F, ["n", 4, None, None])], [_f32(np.random.default_rng(6), "k", 3, 4, 3, 3), _f32(np.random.default_rng(7), "bias", 4)], opset=13, strides=[2, 3], pads=[1, 0, 1, 2], output_padding=[1, 2]),
        lambda rng, n, h, w: {"x": rng.standard_normal((n, 3, h, w)).astype(np.float32)},
        [(1, 1, 1), (2, 4, 3), (1, 5, 6)],
    ),
    (
        "resize_linear_and_nearest_by_scales",
        lambda: _model(
            [
                helper.make_node("Resize", ["x", "", "up"], ["lin"], mode="linear"),
                helper.make_node("Resize", ["x", "", "up"], ["near"], mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
                helper.make_node("Resize", ["x", "", "down"], ["cub"], mode="cubic", coordinate_transformation_mode="align_corners"),
            ],
            [helper.make_tensor_value_info("x", F, ["n", 2, "h", "w"])],
            [helper.make_tensor_value_info(o, F, ["n", 2, None, None]) for o in ("lin", "near", "cub")],
            [numpy_helper.from_array(np.array([1, 1, 2, 3], np.float32), "up"), numpy_helper.from_array(np.array([1, 1, 0.5, 1], np.float32), "down")],
            opset=19,
        ),
        lambda rng, n, h, w: {"x": rng.standard_normal((n, 2, h, w)).astype(np.float32)},
        [(1, 2, 1), (2, 4, 3), (1, 6, 5)],
    ),
    *[
        (
            f"grid_sample_{mode}_{padding}",
            lambda mode=mode, padding=padding: _model(
                [helper.make_node("GridSample", ["x", "grid"], [f"y{a}"], mode=mode, padding_mode=padding, align_corners=a) for a in (0, 1)],
                [helper.make_tensor_value_info("x", F, ["n", 2, "h", "w"]), helper.make_tensor_value_info("grid", F, ["n", "p", "q", 2])],
                [helper.make_tensor_value_info(f"y{a}", F, ["n", 2, "p", "q"]) for a in (0, 1)],
                [],
                opset=20,
            ),
            # Points up to 2.5 image widths outside, so reflection bounces more than once.
            lambda rng, n, h, w, p: {"x": rng.standard_normal((n, 2, h, w)).astype(np.float32), "grid": rng.uniform(-2.5, 2.5, (n, p, p + 1, 2)).astype(np.float32)},
            [(1, 1, 1, 1), (2, 4, 3, 5), (1, 6, 7, 2)],
        )
        for mode in ("linear", "nearest", "cubic")
        for padding in ("zeros", "border", "reflection")
    ],
    (
        "grid_sample_volumetric_linear",
        lambda: _one_node("GridSample", [("x", F, ["n", 2, "d", "h", "w"]), ("grid", F, ["n", "p", "p", "p", 3])], [("y", F, ["n", 2, "p", "p", "p"])], opset=20, mode="linear", padding_mode="border"),
        lambda rng, n, d, h, w, p: {"x": rng.standard_normal((n, 2, d, h, w)).astype(np.float32), "grid": rng.uniform(-1.2, 1.2, (n, p, p, p, 3)).astype(np.float32)},
        [(1, 1, 2, 1, 1), (2, 3, 4, 5, 2)],
    ),
    (
        "rotary_embedding_with_positions",
        lambda: _model(
            [helper.make_node("RotaryEmbedding", ["x", "cos", "sin", "pos"], ["y"], num_heads=2, rotary_embedding_dim=4), helper.make_node("RotaryEmbedding", ["x4", "cos", "sin", "pos"], ["y4"], interleaved=1)],
            [helper.make_tensor_value_info("x", F, ["b", "s", 12]), helper.make_tensor_value_info("x4", F, ["b", 3, "s", 4]), helper.make_tensor_value_info("pos", I, ["b", "s"])],
            [helper.make_tensor_value_info("y", F, ["b", "s", 12]), helper.make_tensor_value_info("y4", F, ["b", 3, "s", 4])],
            [_f32(np.random.default_rng(8), "cos", 16, 2, scale=1.0), _f32(np.random.default_rng(9), "sin", 16, 2, scale=1.0)],
            opset=23,
        ),
        lambda rng, b, s: {"x": rng.standard_normal((b, s, 12)).astype(np.float32), "x4": rng.standard_normal((b, 3, s, 4)).astype(np.float32), "pos": rng.integers(0, 16, (b, s)).astype(np.int64)},
        [(1, 1), (2, 5), (3, 2)],
    ),
    (
        "top_k_with_ties_and_scatters",
        lambda: _model(
            [
                helper.make_node("TopK", ["x", "k"], ["values", "indices"], axis=1),
                helper.make_node("TopK", ["x", "k"], ["low", "low_indices"], axis=0, largest=0),
                helper.make_node("ScatterElements", ["x", "where", "upd"], ["written"], axis=1),
                helper.make_node("ScatterND", ["x", "rows", "row_upd"], ["added"], reduction="add"),
            ],
            [
                helper.make_tensor_value_info("x", F, ["n", "m"]), helper.make_tensor_value_info("where", I, ["n", 1]),
                helper.make_tensor_value_info("upd", F, ["n", 1]), helper.make_tensor_value_info("rows", I, ["r", 1]), helper.make_tensor_value_info("row_upd", F, ["r", "m"]),
            ],
            [helper.make_tensor_value_info(o, t, [None, None]) for o, t in (("values", F), ("indices", I), ("low", F), ("low_indices", I), ("written", F), ("added", F))],
            [_i64("k", [2])],
            opset=18,
        ),
        lambda rng, n, m, r: {
            "x": rng.integers(-2, 3, (n, m)).astype(np.float32),  # many ties: the lower index comes first
            "where": rng.integers(-m, m, (n, 1)).astype(np.int64), "upd": rng.standard_normal((n, 1)).astype(np.float32),
            "rows": rng.integers(-n, n, (r, 1)).astype(np.int64), "row_upd": rng.standard_normal((r, m)).astype(np.float32),
        },
        [(2, 2, 1), (3, 5, 4), (2, 7, 2)],
    ),
    (
        "lstm_bidirectional_with_lengths_and_gru",
        lambda: _model(
            [
                helper.make_node("LSTM", ["x", "lw", "lr", "lb", "lens"], ["y", "yh", "yc"], hidden_size=3, direction="bidirectional"),
                helper.make_node("GRU", ["x", "gw", "gr", "gb"], ["gy", "gyh"], hidden_size=3, linear_before_reset=1),
            ],
            [helper.make_tensor_value_info("x", F, [4, "b", 2]), helper.make_tensor_value_info("lens", TensorProto.INT32, ["b"])],
            [helper.make_tensor_value_info(o, F, [None] * k) for o, k in (("y", 4), ("yh", 3), ("yc", 3), ("gy", 4), ("gyh", 3))],
            [
                _f32(np.random.default_rng(10), "lw", 2, 12, 2, scale=0.5), _f32(np.random.default_rng(11), "lr", 2, 12, 3, scale=0.5), _f32(np.random.default_rng(12), "lb", 2, 24),
                _f32(np.random.default_rng(13), "gw", 1, 9, 2, scale=0.5), _f32(np.random.default_rng(14), "gr", 1, 9, 3, scale=0.5), _f32(np.random.default_rng(15), "gb", 1, 18),
            ],
            opset=14,
        ),
        lambda rng, b: {"x": rng.standard_normal((4, b, 2)).astype(np.float32), "lens": rng.integers(1, 5, b).astype(np.int32)},
        [(1,), (3,), (2,)],
    ),
    (
        "quantize_dequantize_and_integer_matmuls",
        lambda: _model(
            [
                helper.make_node("QuantizeLinear", ["x", "scale", "zero"], ["q"], axis=1),
                helper.make_node("DequantizeLinear", ["q", "scale", "zero"], ["dq"], axis=1),
                helper.make_node("DynamicQuantizeLinear", ["x"], ["dy", "dy_scale", "dy_zero"]),
                helper.make_node("MatMulInteger", ["q", "wq", "zero0", "wzero"], ["mi"]),
                helper.make_node("QLinearMatMul", ["q", "s0", "zero0", "wq", "ws", "wzero", "ys", "yzero"], ["qm"]),
            ],
            [helper.make_tensor_value_info("x", F, ["n", 3])],
            [helper.make_tensor_value_info(o, t, [None] * k) for o, t, k in (("q", TensorProto.UINT8, 2), ("dq", F, 2), ("dy", TensorProto.UINT8, 2), ("dy_scale", F, 0), ("dy_zero", TensorProto.UINT8, 0), ("mi", TensorProto.INT32, 2), ("qm", TensorProto.UINT8, 2))],
            [
                numpy_helper.from_array(np.array([0.02, 0.05, 0.1], np.float32), "scale"), numpy_helper.from_array(np.array([128, 100, 3], np.uint8), "zero"),
                numpy_helper.from_array(np.array(120, np.uint8), "zero0"), numpy_helper.from_array(np.array(0.03, np.float32), "s0"),
                numpy_helper.from_array(np.random.default_rng(16).integers(0, 256, (3, 4)).astype(np.uint8), "wq"), numpy_helper.from_array(np.array(131, np.uint8), "wzero"),
                numpy_helper.from_array(np.array(0.01, np.float32), "ws"), numpy_helper.from_array(np.array(0.5, np.float32), "ys"), numpy_helper.from_array(np.array(7, np.uint8), "yzero"),
            ],
            opset=13,
        ),
        lambda rng, n: {"x": (rng.standard_normal((n, 3)) * 3).astype(np.float32)},
        [(1,), (4,), (7,)],
    ),
    (
        "dft_forward_inverse_onesided_and_stft",
        lambda: _model(
            [
                helper.make_node("DFT", ["x"], ["f"], axis=1),
                helper.make_node("DFT", ["f"], ["back"], axis=1, inverse=1),
                helper.make_node("DFT", ["x"], ["half"], axis=1, onesided=1),
                helper.make_node("STFT", ["sig", "step", "win"], ["spec"]),
            ],
            [helper.make_tensor_value_info("x", F, ["b", 8, 1]), helper.make_tensor_value_info("sig", F, ["b", 40, 1])],
            [helper.make_tensor_value_info(o, F, [None] * k) for o, k in (("f", 3), ("back", 3), ("half", 3), ("spec", 4))],
            [_i64("step", 6), numpy_helper.from_array(np.hanning(10).astype(np.float32), "win")],
            opset=17,
        ),
        lambda rng, b: {"x": rng.standard_normal((b, 8, 1)).astype(np.float32), "sig": rng.standard_normal((b, 40, 1)).astype(np.float32)},
        [(1,), (3,)],
    ),
    (
        "if_on_a_run_time_flag_and_sequences",
        lambda: _model(
            [
                helper.make_node(
                    "If", ["flag"], ["picked"],
                    then_branch=helper.make_graph([helper.make_node("Relu", ["x"], ["a"])], "then", [], [helper.make_tensor_value_info("a", F, ["n", 4])]),
                    else_branch=helper.make_graph([helper.make_node("Neg", ["x"], ["b"])], "else", [], [helper.make_tensor_value_info("b", F, ["n", 4])]),
                ),
                helper.make_node("SplitToSequence", ["x", "two"], ["pieces"], axis=1),
                helper.make_node("SequenceInsert", ["pieces", "picked"], ["more"]),
                helper.make_node("SequenceErase", ["more", "zero"], ["fewer"]),
                helper.make_node("ConcatFromSequence", ["fewer"], ["joined"], axis=1),
                helper.make_node("SequenceLength", ["fewer"], ["count"]),
                helper.make_node("Cast", ["count"], ["countf"], to=TensorProto.FLOAT),
                helper.make_node("Mul", ["joined", "countf"], ["y"]),
            ],
            [helper.make_tensor_value_info("x", F, ["n", 4]), helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
            [helper.make_tensor_value_info("y", F, ["n", 6])],
            [_i64("two", 2), _i64("zero", 0)],
            opset=13,
        ),
        lambda rng, n: {"x": rng.standard_normal((n, 4)).astype(np.float32), "flag": np.array(n % 2 == 1)},
        [(1,), (2,), (5,)],
    ),
    (
        "elementwise_newcomers",
        lambda: _model(
            [
                helper.make_node("Atan", ["x"], ["a"]),
                helper.make_node("Sinh", ["a"], ["b"]),
                helper.make_node("Shrink", ["b"], ["c"], lambd=0.3, bias=0.1),
                helper.make_node("MeanVarianceNormalization", ["c"], ["y"], axes=[1, 2]),  # >= 3 elements a group
                helper.make_node("IsInf", ["x"], ["inf"], detect_negative=0),
            ],
            [helper.make_tensor_value_info("x", F, ["n", 3, "w"])],
            [helper.make_tensor_value_info("y", F, ["n", 3, "w"]), helper.make_tensor_value_info("inf", TensorProto.BOOL, ["n", 3, "w"])],
            [],
            opset=13,
        ),
        lambda rng, n, w: {"x": np.where(rng.random((n, 3, w)) < 0.1, np.inf, rng.standard_normal((n, 3, w))).astype(np.float32) * np.where(rng.random((n, 3, w)) < 0.5, -1, 1).astype(np.float32)},
        [(1, 1), (2, 5), (3, 2)],
    ),
]


# Cases whose ops the native CPU program has no kernel for yet: without PyTorch they are refused
# with an error naming the limit (with PyTorch the op runs there between compiled segments).
NATIVE_LIMITS = {"conv_transpose_strided_padded": "non-transposed convolutions", "col2im_strided_padded": "non-transposed convolutions", "quantize_dequantize_and_integer_matmuls": "dot_general in f64"}


def _torch_present() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


# Cases where ONNX Runtime and ONNX's reference implementation disagree: disc follows the reference.
AGAINST_ONNX_REFERENCE = {
    # (TfIdfVectorizer's weights: ONNX Runtime applies weight i to pool n-gram i, as the spec says;
    # ONNX's reference applies it to output column i. These cases run against ONNX Runtime.)
    # ONNX Runtime has no ai.onnx.preview FlexAttention.
    "flex_attention_gqa_score_and_prob_mods",
    # ONNX Runtime's CPU build has no ai.onnx.preview.training ops and no BatchNormalization training mode.
    "optimizer_steps_adam_and_nesterov",
    "batch_norm_training_and_dropout_ratio_zero",
    # ONNX Runtime has no CausalConvWithState (opset 27) yet.
    "causal_conv_with_state_zero_past",
    "causal_conv_with_state_past_silu",
    # ONNX Runtime has no BitCast (opset 26) and no opset-28 BitShift yet.
    "unsigned_arithmetic_shifts_and_bitcasts",
    # The reference clamps a point outside the image, then reads its 4x4 taps; ONNX Runtime (as
    # PyTorch) clamps each tap instead: 0.37 apart on these inputs.
    "grid_sample_cubic_border",
}


@pytest.mark.parametrize("name, model, feeds, streams", DYNAMIC_CASES, ids=[c[0] for c in DYNAMIC_CASES])
def test_ops_compile_once_and_match_onnx_runtime_over_a_shape_stream(name, model, feeds, streams):
    """Ops lowered to compositions (attention, losses, group norm, space/depth moves, pads by
    mode, SAME padding, transposed convolution, resize, rotary embedding, top-k, scatters,
    one-hot, gathers by tuples) at shapes from size 1 up, against ONNX Runtime."""
    m = model()
    sess = ReferenceEvaluator(m) if name in AGAINST_ONNX_REFERENCE else ort.InferenceSession(m.SerializeToString())
    if name in NATIVE_LIMITS and not _torch_present():
        with pytest.raises(disc.errors.CompileError, match=NATIVE_LIMITS[name]):
            disc.onnx.compile(m)
        return
    prog = disc.onnx.compile(m)
    assert isinstance(prog, disc.onnx.OnnxProgram)  # one program for every shape, no per-value versions
    rng = np.random.default_rng(11)
    for dims in streams:
        want = sess.run(None, f := feeds(rng, *dims))
        got = prog(**f)
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape and g.dtype == w.dtype, (dims, g.shape, w.shape, g.dtype, w.dtype)
            same_nan = np.isnan(g) == np.isnan(w) if w.dtype.kind == "f" else True
            assert np.all(same_nan), dims
            if w.dtype.kind == "f":
                g, w = np.nan_to_num(g), np.nan_to_num(w)
            if w.dtype.kind in "uib":
                assert np.array_equal(g, w), dims  # exact (allclose of 64-bit integers goes through float64)
            assert np.allclose(g, w, rtol=1e-4, atol=1e-5), (dims, np.abs(g.astype(np.float64) - w).max())


def _sequence_model() -> onnx.ModelProto:
    """A sequence in (one element inserted, each element doubled by SequenceMap, all joined) and
    a sequence out (a tensor split into pieces)."""
    n = helper.make_node
    seq_of = lambda name, dims: helper.make_tensor_sequence_value_info(name, F, dims)  # noqa: E731
    double = helper.make_graph([n("Add", ["e", "e"], ["twice"])], "double", [helper.make_tensor_value_info("e", F, None)], [helper.make_tensor_value_info("twice", F, None)])
    nodes = [
        n("SequenceInsert", ["parts", "extra"], ["longer"]),
        n("SequenceMap", ["longer"], ["doubled"], body=double),
        n("ConcatFromSequence", ["doubled"], ["joined"], axis=0),
        n("SplitToSequence", ["extra", "sizes"], ["pieces"], axis=1),
    ]
    inputs = [seq_of("parts", ["r", 3]), helper.make_tensor_value_info("extra", F, ["q", 3])]
    outputs = [helper.make_tensor_value_info("joined", F, ["j", 3]), seq_of("pieces", ["q", None])]
    return _model(nodes, inputs, outputs, [_i64("sizes", [1, 2])], opset=17)


def test_sequences_in_and_out_compile_per_length(tmp_path, capsys):
    from disc.cli import main

    m = _sequence_model()
    onnx.save(m, str(tmp_path / "m.onnx"))
    assert main(["explain", str(tmp_path / "m.onnx")]) == 2
    assert "sequence or optional input(s) ['parts']" in capsys.readouterr().err
    ref = ReferenceEvaluator(m)
    prog = disc.onnx.compile(m)
    rng = np.random.default_rng(3)
    for lengths in [(1,), (2, 1, 4), (5,), (1, 1, 2)]:
        parts = [rng.standard_normal((r, 3)).astype(np.float32) for r in lengths]
        extra = rng.standard_normal((len(lengths) % 2 + 1, 3)).astype(np.float32)
        joined, pieces = prog(parts, extra)
        want_joined, want_pieces = ref.run(None, {"parts": parts, "extra": extra})
        np.testing.assert_allclose(joined, want_joined, rtol=1e-6)
        assert isinstance(pieces, list) and len(pieces) == len(want_pieces) == 2
        for g, w in zip(pieces, want_pieces):
            np.testing.assert_array_equal(g, w)
    assert prog.compilations == 2  # one per sequence length: 1 (twice), 3 (twice)
    with pytest.raises(disc.errors.InputError, match="'parts' is a sequence: give a list"):
        prog(np.zeros((2, 3), np.float32), extra)
    with pytest.raises(disc.errors.CompileError, match="compiled per call structure"):
        prog.save("/nonexistent")
    with pytest.raises(disc.errors.CompileError, match="values= for a model that takes sequence or optional inputs"):
        disc.onnx.compile(m, values={"extra": np.zeros((1, 3), np.float32)})


def _loops_model(trip_from_input: bool) -> onnx.ModelProto:
    """A Loop (a running sum and a scan output of its steps) and a Scan (a running product over
    axis 1, backwards, with its partial products as a scan output)."""
    n = helper.make_node
    loop_body = helper.make_graph(
        [n("Identity", ["cond_in"], ["cond_out"]), n("Cast", ["i"], ["fi"], to=F), n("Mul", ["x", "fi"], ["step"]), n("Add", ["acc_in", "step"], ["acc_out"])],
        "loop_body",
        [helper.make_tensor_value_info("i", I, []), helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []), helper.make_tensor_value_info("acc_in", F, ["n", 4])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), helper.make_tensor_value_info("acc_out", F, ["n", 4]), helper.make_tensor_value_info("step", F, ["n", 4])],
    )
    scan_body = helper.make_graph(
        [n("Mul", ["prod_in", "col"], ["prod_out"]), n("Identity", ["prod_out"], ["partial"])],
        "scan_body",
        [helper.make_tensor_value_info("prod_in", F, ["n"]), helper.make_tensor_value_info("col", F, ["n"])],
        [helper.make_tensor_value_info("prod_out", F, ["n"]), helper.make_tensor_value_info("partial", F, ["n"])],
    )
    nodes = [
        n("Loop", ["trips", "yes", "x"], ["total", "steps"], body=loop_body),
        n("Scan", ["ones", "x"], ["product", "partials"], body=scan_body, num_scan_inputs=1, scan_input_axes=[1], scan_input_directions=[1], scan_output_axes=[1]),
    ]
    inputs = [helper.make_tensor_value_info("x", F, ["n", 4]), helper.make_tensor_value_info("ones", F, ["n"])]
    inits = [numpy_helper.from_array(np.array(True), "yes")]
    if trip_from_input:
        inputs.append(helper.make_tensor_value_info("trips", I, []))
    else:
        inits.append(_i64("trips", 3))
    outputs = [helper.make_tensor_value_info(k, F, d) for k, d in (("total", ["n", 4]), ("steps", ["t", "n", 4]), ("product", ["n"]), ("partials", ["n", 4]))]
    return _model(nodes, inputs, outputs, inits, opset=17)


def test_loops_with_known_counts_unroll_and_a_count_from_an_input_compiles_per_value():
    rng = np.random.default_rng(4)
    for trip_from_input in (False, True):
        m = _loops_model(trip_from_input)
        prog = disc.onnx.compile(m)
        assert isinstance(prog, disc.onnx.ValueSpecializedProgram) == trip_from_input
        for rows, trips in [(1, 3), (4, 2), (2, 3)]:
            x = rng.standard_normal((rows, 4)).astype(np.float32)
            feeds = {"x": x, "ones": np.ones(rows, np.float32)}
            if trip_from_input:
                feeds["trips"] = np.array(trips, np.int64)
            total, steps, product, partials = prog(**feeds)
            count = trips if trip_from_input else 3
            np.testing.assert_allclose(total, x * (1 + sum(range(count))), rtol=1e-5)
            np.testing.assert_allclose(steps, np.stack([x * i for i in range(count)]), rtol=1e-6)
            # ONNX's reference has no backward Scan: its products, the last column first
            np.testing.assert_allclose(partials, np.cumprod(x[:, ::-1], axis=1), rtol=1e-5)
            np.testing.assert_allclose(product, x.prod(axis=1), rtol=1e-5)
        if trip_from_input:
            assert prog.compilations == 2  # trip counts 3 and 2
    growing = _loops_model(False)
    growing.graph.node[0].input[0] = "trips2"
    growing.graph.node.insert(0, helper.make_node("Shape", ["x"], ["shape"]))
    growing.graph.node.insert(1, helper.make_node("ReduceSum", ["shape"], ["trips2"], keepdims=0))
    with pytest.raises(disc.errors.CompileError, match="trip count is computed at run time"):
        disc.onnx.compile(growing)


def test_linear_attention_unrolled_over_its_tokens_matches_the_reference():
    n = helper.make_node
    node = n("LinearAttention", ["q", "k", "v", "past", "decay", "beta"], ["y", "state"], q_num_heads=4, kv_num_heads=2, update_rule="gated_delta")
    inputs = [("q", ["b", 3, 16]), ("k", ["b", 3, 8]), ("v", ["b", 3, 6]), ("past", ["b", 2, 4, 3]), ("decay", ["b", 3, 2]), ("beta", ["b", 3, 2])]
    m = helper.make_model(
        helper.make_graph([node], "m", [helper.make_tensor_value_info(k, F, d) for k, d in inputs], [helper.make_tensor_value_info("y", F, ["b", 3, 12]), helper.make_tensor_value_info("state", F, ["b", 2, 4, 3])]),
        opset_imports=[helper.make_opsetid("", 27)],
    )
    ref, prog = ReferenceEvaluator(m), disc.onnx.compile(m)
    rng = np.random.default_rng(5)
    for b in (1, 3):
        feeds = {k: rng.standard_normal([b, *d[1:]]).astype(np.float32) * 0.5 for k, d in inputs}
        feeds["decay"] = -np.abs(feeds["decay"])
        feeds["beta"] = 1 / (1 + np.exp(-feeds["beta"]))
        for g, w in zip(prog(**feeds), ref.run(None, feeds), strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    m.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "t"
    with pytest.raises(disc.errors.CompileError, match="unrolls the recurrence over a length known"):
        disc.onnx.compile(m)


def test_an_optional_input_compiles_per_presence_and_an_empty_one_comes_back_as_none():
    n = helper.make_node
    opt = helper.make_value_info("maybe", helper.make_optional_type_proto(helper.make_tensor_type_proto(F, ["n", 2])))
    out_opt = helper.make_value_info("same", helper.make_optional_type_proto(helper.make_tensor_type_proto(F, ["n", 2])))
    nodes = [n("OptionalHasElement", ["maybe"], ["has"]), n("Identity", ["maybe"], ["same"]), n("Add", ["x", "x"], ["twice"])]
    m = _model(nodes, [opt, helper.make_tensor_value_info("x", F, [3])], [helper.make_tensor_value_info("has", TensorProto.BOOL, []), out_opt, helper.make_tensor_value_info("twice", F, [3])], [], opset=18)
    prog = disc.onnx.compile(m)
    x = np.arange(3, dtype=np.float32)
    has, same, twice = prog(None, x)
    assert has.item() is False and same is None and np.array_equal(twice, 2 * x)
    for rows in (1, 4):
        value = np.random.default_rng(rows).standard_normal((rows, 2)).astype(np.float32)
        has, same, twice = prog(maybe=value, x=x)
        assert has.item() is True and np.array_equal(same, value) and np.array_equal(twice, 2 * x)
    assert prog.compilations == 2  # absent, present (any number of rows)
    with pytest.raises(disc.errors.CompileError, match="optional input\\(s\\) \\['maybe'\\]"):
        prog.save("/nonexistent")  # (an IndexError before: the message read value_inputs[0] of an empty list)
