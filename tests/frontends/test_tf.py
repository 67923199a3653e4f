"""The TensorFlow frontend against TensorFlow itself: Keras models built in code with random
weights over shape streams that start at size 1 (one compilation each), the ops Keras graphs
use one by one at several shapes (1-sized and odd dims included), bad inputs, unsupported ops,
saving, and a process without PyTorch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import disc  # noqa: E402
import disc.tf  # noqa: E402
from disc.errors import CompileError, InputError, ShapeError  # noqa: E402
from disc.report import reports  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
import tf_models  # noqa: E402


def _close(got, want, tol: float = 1e-4) -> None:
    got, want = tf.nest.flatten(got), tf.nest.flatten(want)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        if w.dtype.kind in "biu":
            np.testing.assert_array_equal(g, w)
            continue
        scale = max(float(np.abs(w).max()) if w.size else 0.0, 1e-6)
        err = float(np.abs(g.astype(np.float64) - w).max()) / scale if w.size else 0.0
        assert err <= tol, f"relative error {err:.2e} > {tol:.0e}"


def _stream(program, reference, inputs, shapes) -> None:
    before = len([r for r in reports() if r.source == "disc.tf"])
    for shape in shapes:
        xs = inputs(*shape)
        _close(program(*xs), reference(*xs))
    after = len([r for r in reports() if r.source == "disc.tf"])
    assert after == before, f"{after - before} compilations over the stream"
    compiled = getattr(program.runner, "compiled", None)
    if compiled is not None:
        assert compiled.num_compilations == 1


# -- models -------------------------------------------------------------------------------------------------
TEXT_SHAPES = [(1, 1), (2, 7), (1, 16), (3, 33)]
IMAGE_SHAPES = [(1, 32, 32), (2, 47, 61), (1, 64, 33)]


def _text(batch: int, n: int, masked: bool = True) -> list[np.ndarray]:
    r = np.random.default_rng(batch * 1000 + n)
    ids = r.integers(0, 100, (batch, n)).astype(np.int32)
    if not masked:
        return [ids]
    mask = np.ones((batch, n), np.int32)
    mask[0, n // 2 + 1 :] = 0  # padding at the end of the first row
    return [ids, mask]


@pytest.mark.slow
def test_bert_style_encoder_one_compilation_over_a_stream() -> None:
    model, sig = tf_models.bert()
    call = tf.function(lambda ids, mask: model(ids, mask, training=False))
    prog = disc.tf.compile(call, sig, dynamic={"ids": {0: "batch", 1: "seq"}, "mask": {0: "batch", 1: "seq"}})
    assert [[str(d) for d in x.shape] for x in prog.graph.inputs] == [["batch", "seq"]] * 2  # one symbol per name
    _stream(prog, call, _text, TEXT_SHAPES)


@pytest.mark.slow
def test_gpt_style_decoder_one_compilation_over_a_stream() -> None:
    model, sig = tf_models.gpt()
    call = tf.function(lambda ids: model(ids, training=False))
    prog = disc.tf.compile(call, sig)
    _stream(prog, call, lambda b, n: _text(b, n, masked=False), TEXT_SHAPES)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ResNet50", "MobileNetV2", "EfficientNetB0"])
def test_keras_application_one_compilation_over_image_sizes(name: str) -> None:
    model, _ = tf_models.cnn(name)
    prog = disc.tf.compile(model)  # a functional model knows its inputs: no signature needed
    reference = tf.function(lambda x: model(x, training=False))

    def image(batch: int, h: int, w: int) -> list[np.ndarray]:
        return [np.random.default_rng(h * 100 + w).standard_normal((batch, h, w, 3)).astype(np.float32)]

    _stream(prog, reference, image, IMAGE_SHAPES)


# -- ops, one by one ------------------------------------------------------------------------------------------
def _spec(*dims, dtype=tf.float32, name=None):
    return tf.TensorSpec(list(dims), dtype, name=name)


def _check(fn, sig, *shape_sets, dtype=np.float32, seed=0):
    """Compile ``fn`` once for ``sig``; at each set of input shapes, equal to TensorFlow."""
    call = tf.function(fn)
    prog = disc.tf.compile(call, sig)
    r = np.random.default_rng(seed)
    for shapes in shape_sets:
        xs = [r.standard_normal(s).astype(dtype) if np.dtype(dtype).kind == "f" else r.integers(-9, 9, s).astype(dtype) for s in shapes]
        _close(prog(*xs), call(*xs))
    return prog


def test_strided_slices_with_masks_and_shape_arithmetic() -> None:
    def f(x):
        n = tf.shape(x)[1]
        a = x[:, 1:, None, ::2]  # begin/end masks, a new axis, a stride
        b = x[..., -1]  # ellipsis, shrink, a negative index
        c = tf.reshape(x, [tf.shape(x)[0], n * tf.shape(x)[2]])  # Pack of computed dims
        d = x[:, : n // 2]  # an end computed from the shape
        return a, b, c, d + 1.0

    _check(f, [_spec(None, None, None)], [(1, 1, 1)], [(2, 5, 3)], [(3, 8, 7)])


def test_conv_same_padding_strided_dilated_depthwise_and_grouped_at_odd_sizes() -> None:
    r = np.random.default_rng(0)
    w = r.standard_normal((3, 3, 4, 6)).astype(np.float32)
    dw = r.standard_normal((3, 3, 4, 2)).astype(np.float32)
    grouped = r.standard_normal((3, 3, 2, 6)).astype(np.float32)

    def f(x):
        return (
            tf.nn.conv2d(x, w, strides=2, padding="SAME"),  # padding depends on the size's parity
            tf.nn.conv2d(x, w, strides=1, padding="SAME", dilations=2),
            tf.nn.depthwise_conv2d(x, dw, strides=[1, 2, 2, 1], padding="SAME"),
            tf.nn.conv2d(x, grouped, strides=1, padding="VALID"),
            tf.nn.conv2d(x, w, strides=1, padding=[[0, 0], [1, 2], [0, 1], [0, 0]]),
        )

    _check(f, [_spec(None, None, None, 4)], [(1, 3, 3, 4)], [(2, 7, 4, 4)], [(1, 8, 9, 4)])


def test_pooling_same_and_valid_at_odd_sizes() -> None:
    def f(x):
        return (
            tf.nn.max_pool2d(x, 3, 2, "SAME"),
            tf.nn.avg_pool2d(x, 3, 2, "SAME"),  # the average counts real elements only
            tf.nn.max_pool2d(x, 2, 2, "VALID"),
            tf.nn.avg_pool2d(x, 3, 1, "SAME"),
        )

    _check(f, [_spec(None, None, None, 3)], [(1, 2, 2, 3)], [(2, 7, 5, 3)], [(1, 10, 11, 3)])


def test_linear_algebra_einsum_and_normalisation() -> None:
    r = np.random.default_rng(1)
    w = r.standard_normal((6, 2, 3)).astype(np.float32)
    scale, offset = r.random(6).astype(np.float32) + 0.5, r.standard_normal(6).astype(np.float32)
    mu, var = r.standard_normal(6).astype(np.float32), r.random(6).astype(np.float32) + 0.1

    def f(x, y):
        q = tf.einsum("abc,cde->abde", x, w)
        s = tf.einsum("btnh,bsnh->bnts", q, q)
        o = tf.einsum("bnts,bsnh->btnh", tf.nn.softmax(s), q)
        m = tf.linalg.matmul(x, y, transpose_b=True)  # BatchMatMulV2 with adj_y
        bn = tf.raw_ops.FusedBatchNormV3(
            x=x[:, :, None, :], scale=scale, offset=offset, mean=mu, variance=var, epsilon=1e-3, is_training=False
        )[0]
        return o, m, bn, tf.einsum("abc->cb", x)

    _check(f, [_spec(None, None, 6), _spec(None, None, 6)], [(1, 1, 6), (1, 1, 6)], [(2, 5, 6), (2, 3, 6)], [(3, 4, 6), (3, 7, 6)])


def test_elementwise_reductions_and_movement() -> None:
    def f(x):
        n = tf.shape(x)[0]
        band = tf.linalg.band_part(tf.ones([n, n]), -1, 0)  # causal
        parts = tf.split(x, 2, axis=1)
        return (
            tf.nn.relu6(x * 4.0) + tf.math.softplus(x * 30.0) + tf.math.erfc(x) + tf.nn.leaky_relu(x) + tf.nn.elu(x) + tf.nn.selu(x),
            tf.math.divide_no_nan(x, tf.where(x > 0.5, 0.0, x)),
            tf.reduce_max(x, axis=1, keepdims=True) - tf.reduce_min(x, axis=0) + tf.reduce_prod(x[:, :2], axis=1, keepdims=True),
            tf.argmax(x, axis=1, output_type=tf.int32),
            tf.math.cumsum(x, axis=1),
            tf.tile(x, [2, 1]),
            tf.pad(x, [[1, 0], [0, 2]], constant_values=-3.0),
            band @ x,
            parts[1] - parts[0],
            tf.concat(tf.split(x, [1, -1], axis=1)[::-1], axis=1),
            tf.reduce_all(x > -1.0, axis=1),
            tf.range(2, n * 3 + 2, 3),
        )

    _check(f, [_spec(None, 4)], [(1, 4)], [(5, 4)], [(8, 4)])


@pytest.mark.parametrize("align_corners, half_pixel", [(False, False), (True, False), (False, True)])
def test_resize_bilinear_and_nearest_in_every_coordinate_mode(align_corners: bool, half_pixel: bool) -> None:
    def f(x):
        out = []
        for size in ([5, 7], [1, 1], [3, 3], [12, 3]):
            for op in (tf.raw_ops.ResizeBilinear, tf.raw_ops.ResizeNearestNeighbor):
                out.append(op(images=x, size=size, align_corners=align_corners, half_pixel_centers=half_pixel))
        return out

    # 6 -> 3 with aligned corners puts a source coordinate exactly halfway (2.5): TensorFlow rounds it up.
    _check(f, [_spec(None, None, None, 3)], [(1, 1, 1, 3)], [(2, 6, 6, 3)], [(1, 13, 9, 3)])


def test_resize_to_sizes_computed_from_the_input_shape_and_of_integer_images() -> None:
    def f(x):
        twice = tf.shape(x)[1:3] * 2  # what an upsampling layer builds: symbolic at compile time
        return tf.image.resize(x, twice), tf.image.resize(x, twice, method="nearest"), tf.image.resize(x, [7, 4], method="nearest")

    prog = _check(f, [_spec(None, None, None, 3)], [(1, 1, 1, 3)], [(2, 5, 3, 3)], [(1, 8, 11, 3)])
    assert prog.report.fallbacks == {}
    ints = _check(
        lambda x: (tf.raw_ops.ResizeBilinear(images=x, size=[4, 9]), tf.raw_ops.ResizeNearestNeighbor(images=x, size=[4, 9])),
        [_spec(None, None, None, 2, dtype=tf.int32)],
        [(1, 3, 3, 2)],
        [(2, 7, 2, 2)],
        dtype=np.int32,
    )
    assert ints.report.fallbacks == {}


def test_top_k_values_and_indices_ties_by_the_lower_index() -> None:
    def f(x):
        top, one = tf.math.top_k(x, 3), tf.math.top_k(x, 1, sorted=False)
        return top.values, top.indices, one.values, one.indices

    prog = _check(f, [_spec(None, None)], [(1, 3)], [(4, 9)], [(2, 17)])
    assert prog.report.fallbacks == {}
    ties = np.array([[1, 3, 3, 2, 3], [0, 0, 0, 0, 0]], np.float32)
    _close(prog(ties), f(tf.constant(ties)))
    with pytest.raises(ShapeError, match=r"input .x. dim 1 is 2 but .* must be in \[3, inf\]"):
        prog(np.ones((2, 2), np.float32))
    ints = _check(lambda x: tf.math.top_k(x, 2), [_spec(None, 6, dtype=tf.int32)], [(1, 6)], [(5, 6)], dtype=np.int32)
    assert ints.report.fallbacks == {}


def test_integer_ops_floor_semantics() -> None:
    def f(a, b):
        b = tf.where(b == 0, 1, b)
        return a // b, a % b, tf.maximum(a, b), tf.cast(a, tf.float32) * 0.5, tf.reduce_sum(a, axis=0)

    _check(f, [_spec(None, 3, dtype=tf.int32), _spec(None, 3, dtype=tf.int32)], [(1, 3), (1, 3)], [(6, 3), (6, 3)], dtype=np.int32)


# -- the API -------------------------------------------------------------------------------------------------
def test_decorator_by_name_inputs_and_structure() -> None:
    @disc.tf.function(input_signature=[_spec(None, 3, name="x"), _spec(None, 3, name="y")])
    def f(x, y):
        return {"sum": x + y, "pair": (x * y, tf.reduce_sum(x))}

    x, y = np.ones((2, 3), np.float32), np.full((2, 3), 2.0, np.float32)
    out = f(x, y=tf.constant(y))
    assert isinstance(out["sum"], tf.Tensor) and set(out) == {"sum", "pair"}
    np.testing.assert_array_equal(out["sum"].numpy(), x + y)
    np.testing.assert_array_equal(out["pair"][0].numpy(), x * y)
    assert float(out["pair"][1]) == 6.0
    f(x[:1], y[:1])
    assert len(f.compiled) == 1


def test_bad_inputs_are_named() -> None:
    prog = disc.tf.compile(tf.function(lambda x, y: x + y), [_spec(None, 3, name="x"), _spec(None, 3, name="y")])
    with pytest.raises(InputError, match="missing input 'y'"):
        prog(np.ones((2, 3), np.float32))
    with pytest.raises(ShapeError, match="input 'x' dim 1 is 4 but must be 3"):
        prog(np.ones((2, 4), np.float32), np.ones((2, 4), np.float32))
    with pytest.raises(InputError, match="'y'.*int32|'y'.*i32"):
        prog(np.ones((2, 3), np.float32), np.ones((2, 3), np.int32))
    with pytest.raises(ShapeError, match="input 'y' dim 0 is 5 but must equal input 'x' dim 0"):
        prog(np.ones((2, 3), np.float32), np.ones((5, 3), np.float32))  # the two batch dims differ
    # A dim that is 1 only at run time is not broadcast (the program was built for equal dims):
    # refused by name, never read as if it were 5.
    with pytest.raises(ShapeError, match="input 'y' dim 0 is 5 but must equal input 'x' dim 0"):
        prog(np.ones((1, 3), np.float32), np.ones((5, 3), np.float32))
    with pytest.raises(InputError, match="'x'"):
        prog(np.array([["a"] * 3], dtype=object), np.ones((1, 3), np.float32))


def test_ops_outside_the_table_run_in_tensorflow_between_compiled_segments(tmp_path: Path) -> None:
    def f(x):
        y = tf.nn.relu(x) * 2.0
        gram = tf.matmul(y, y, transpose_b=True)
        gram += 3.0 * tf.linalg.band_part(tf.ones_like(gram), 0, 0)
        sign, logdet = tf.linalg.slogdet(gram)  # LogMatrixDeterminant: not in the table (two outputs, one call)
        image = tf.image.resize(y[..., None], [5, 7], method="bicubic")  # ResizeBicubic: not in the table
        ex = tf.math.cumsum(y, axis=1, exclusive=True, reverse=True)  # lowered (a flip, a shifted zero)
        steps = tf.range(0, tf.shape(y)[1], tf.shape(y)[0])  # in the table, refused: a step computed at run time
        return sign + 1.0, logdet, tf.reduce_sum(image, axis=[1, 2]) - 1.0, ex * x, steps * 2

    call = tf.function(f)
    prog = disc.tf.compile(call, [_spec(None, None)])
    r = np.random.default_rng(0)
    for shape in [(1, 3), (4, 9), (2, 17)]:
        x = r.standard_normal(shape).astype(np.float32)
        _close(prog(x), call(x))
    assert prog.report.fallbacks == {"LogMatrixDeterminant": 1, "ResizeBicubic": 1, "Range": 1}
    text = disc.explain()
    assert "LogMatrixDeterminant" in text and "ResizeBicubic" in text
    with pytest.raises(disc.ArtifactError, match="runs in TensorFlow"):
        prog.save(tmp_path / "prog")


def test_without_fallback_an_op_outside_the_table_is_named_before_anything_runs() -> None:
    with pytest.raises(CompileError, match=r"node 'resize/ResizeBicubic' \(ResizeBicubic\): ResizeBicubic is not in disc's TensorFlow op table"):
        disc.tf.compile(tf.function(lambda x: tf.image.resize(x, [3, 4], method="bicubic")), [_spec(1, None, None, 2)], fallback=False)
    with pytest.raises(CompileError, match="input_signature"):
        disc.tf.compile(lambda x: x)


def _compilations() -> int:
    return len([r for r in reports() if r.source == "disc.tf"])


def test_a_variable_written_after_compilation_is_noticed_at_the_next_call(caplog: pytest.LogCaptureFixture) -> None:
    import keras

    keras.utils.set_random_seed(0)
    ids = keras.Input((None,), dtype="int32", name="ids")
    model = keras.Model(ids, keras.layers.Dense(3)(keras.layers.Embedding(20, 4)(ids)))
    prog = disc.tf.compile(model)
    r = np.random.default_rng(0)

    def agrees(batch: int, n: int) -> None:
        x = r.integers(0, 20, (batch, n)).astype(np.int32)
        _close(prog(x), model(x, training=False), 1e-5)

    agrees(1, 1)
    before = _compilations()
    dense = model.layers[-1]
    dense.kernel.assign(dense.kernel * -2.0)  # an eager assign
    with caplog.at_level("WARNING", logger="disc"):
        agrees(2, 5)
    assert _compilations() == before + 1 and "kernel" in caplog.text and "changed since compilation" in caplog.text
    agrees(3, 1)
    assert _compilations() == before + 1  # nothing written since: no compilation
    model.set_weights([w + 0.5 for w in model.get_weights()])
    agrees(1, 7)
    assert _compilations() == before + 2
    model.compile(optimizer="sgd", loss="mse")  # assigns inside TensorFlow's own compiled train step
    model.fit(r.integers(0, 20, (8, 3)).astype(np.int32), r.standard_normal((8, 3, 3)).astype(np.float32), epochs=1, verbose=0)
    agrees(2, 3)
    assert _compilations() == before + 3


def test_a_variable_read_by_copy_is_compared_by_value_and_threads_compile_it_once() -> None:
    import threading

    table = tf.Variable(np.arange(12, dtype=np.float32).reshape(6, 2))
    fn = tf.function(lambda ids: tf.gather(table, ids) * 2.0)
    table.scatter_nd_update([[1]], [[7.0, 7.0]])  # a sparse write: reads of the table now copy
    prog = disc.tf.compile(fn, [_spec(None, dtype=tf.int32)])
    ids = np.array([1, 5, 1], np.int32)
    _close(prog(ids), fn(ids))
    before = _compilations()
    _close(prog(ids), fn(ids))
    assert _compilations() == before  # a copy on every read is not a write
    table.scatter_nd_update([[5]], [[-1.0, -3.0]])
    results = []
    threads = [threading.Thread(target=lambda: results.append(prog(ids))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 4 and _compilations() == before + 1
    for got in results:
        _close(got, fn(ids))


def test_the_watch_reads_the_variables_where_its_library_cannot_be_built(monkeypatch: pytest.MonkeyPatch) -> None:
    from disc.frontends.tf import variables

    monkeypatch.setattr(variables, "buffers_library", lambda: None)
    weight = tf.Variable(np.ones((3, 2), np.float32))
    table = tf.Variable(np.arange(8, dtype=np.float32).reshape(4, 2))
    table.scatter_nd_update([[0]], [[5.0, 5.0]])  # copy-on-read: compared by value
    fn = tf.function(lambda x, ids: (x @ weight, tf.gather(table, ids)))
    prog = disc.tf.compile(fn, [_spec(None, 3), _spec(None, dtype=tf.int32)])
    x, ids = np.ones((2, 3), np.float32), np.array([0, 3], np.int32)
    _close(prog(x, ids), fn(x, ids))
    before = _compilations()
    _close(prog(x, ids), fn(x, ids))
    assert _compilations() == before
    weight.assign_add(tf.ones((3, 2)))  # in place, were no read held
    _close(prog(x, ids), fn(x, ids))
    assert _compilations() == before + 1
    table.scatter_nd_update([[3]], [[-1.0, -2.0]])
    _close(prog(x, ids), fn(x, ids))
    assert _compilations() == before + 2


def test_without_the_watch_variables_are_read_once() -> None:
    weight = tf.Variable(np.ones((3, 2), np.float32))
    prog = disc.tf.compile(tf.function(lambda x: x @ weight), [_spec(None, 3)], watch_variables=False)
    x = np.ones((1, 3), np.float32)
    before = _compilations()
    weight.assign(weight * 2.0)
    np.testing.assert_array_equal(prog(x).numpy(), np.full((1, 2), 3.0, np.float32))  # as compiled, by request
    assert _compilations() == before


def test_saved_program_runs_without_tensorflow(tmp_path: Path) -> None:
    call = tf.function(lambda x: tf.nn.gelu(tf.matmul(x, tf.ones([4, 2])) + 1.0))
    prog = disc.tf.compile(call, [_spec(None, 4)])
    folder = prog.save(tmp_path / "prog")
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    code = (
        "import sys, numpy as np; sys.modules['tensorflow'] = None\n"
        f"import disc_runtime; m = disc_runtime.load({str(folder)!r})\n"
        f"x = np.load({str(tmp_path / 'x.npy')!r}); np.save({str(tmp_path / 'y.npy')!r}, m.run(x)[0])\n"
    )
    np.save(tmp_path / "x.npy", x)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _close(np.load(tmp_path / "y.npy"), call(x).numpy())


def test_keras_bert_without_torch() -> None:
    # Without PyTorch the program is the native CPU one, run through disc_runtime.
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import numpy as np, tensorflow as tf, disc.tf, tf_models\n"
        "model, sig = tf_models.bert()\n"
        "call = tf.function(lambda ids, mask: model(ids, mask, training=False))\n"
        "prog = disc.tf.compile(call, sig)\n"
        "print(type(prog.runner).__name__)\n"
        "for b, n in [(1, 1), (2, 9)]:\n"
        "    ids = np.random.default_rng(n).integers(0, 100, (b, n)).astype(np.int32); mask = np.ones_like(ids)\n"
        "    got, want = prog(ids, mask), call(ids, mask)\n"
        "    err = max(float(np.abs(got[k].numpy() - want[k].numpy()).max()) for k in want)\n"
        "    assert err < 1e-4, err\n"
        "print('ok')\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(HERE)])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stdout.split() == ["StandaloneRunner", "ok"], proc.stdout
