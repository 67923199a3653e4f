"""The standalone C runtime (``disc_runtime.h``, ``runtime.cc``): saved programs run from C, no Python.

Programs are compiled and saved here; the example runner ``examples/c/run_saved.c`` runs them in a
subprocess on ``.npy`` inputs, and every output must be the compiled module's own (the same
program, so exactly, within 1e-6). The C API is also called in this process through ctypes:
the input checks' messages (those of ``disc/runtime/checks.py``), folders it must refuse (a
damaged file, a ``needs`` line, another CPU, an interface.txt breaking a rule of
``disc/runtime/interface.py``, with the Python parser's own messages), caller-given outputs,
outputs that pass an input or a constant through, and four threads calling one model at once.
"""

from __future__ import annotations

import ctypes
import random
import shutil
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import disc
from disc.errors import InputError, ShapeError
from disc.runtime.interface import InterfaceError, parse_interface

REPO = Path(__file__).resolve().parents[2]
RAL_DIR = REPO / "disc" / "runtime" / "ral"
EXAMPLE = REPO / "examples" / "c" / "run_saved.c"

OK, E_FILE, E_INPUT, E_SHAPE, E_RUN, E_UNSUPPORTED = 0, 1, 2, 3, 4, 5
# DISC_F16 .. DISC_BOOL; bf16 travels as its raw bits in uint16.
CODES = {np.dtype(np.float16): 0, np.dtype(np.float32): 2, np.dtype(np.float64): 3, np.dtype(np.int8): 4, np.dtype(np.uint8): 5,
         np.dtype(np.int16): 6, np.dtype(np.int32): 7, np.dtype(np.int64): 8, np.dtype(np.bool_): 9}  # fmt: skip
BF16 = 1
NUMPY = {code: dtype for dtype, code in CODES.items()} | {BF16: np.dtype(np.uint16)}


# -- the C API through ctypes -----------------------------------------------------------------------
class Error(ctypes.Structure):
    _fields_ = [("status", ctypes.c_int32), ("message", ctypes.c_char * 1024)]


class Tensor(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int32), ("rank", ctypes.c_int32), ("shape", ctypes.c_int64 * 16), ("data", ctypes.c_void_p)]


class TensorInfo(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int32), ("rank", ctypes.c_int32), ("dims", ctypes.POINTER(ctypes.c_char_p))]


class CError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"[{status}] {message}")
        self.status, self.message = status, message


def _library() -> Path:
    """The RAL library holding runtime.cc."""
    from disc.runtime.ral_build import runtime_library

    return runtime_library()


class Api:
    def __init__(self, path: Path) -> None:
        lib = self.lib = ctypes.CDLL(str(path))
        p, i32 = ctypes.c_void_p, ctypes.c_int32
        err, tensors = ctypes.POINTER(Error), ctypes.POINTER(Tensor)
        for name, res, args in [
            ("disc_model_load", p, [ctypes.c_char_p, err]),
            ("disc_model_free", None, [p]),
            ("disc_model_name", ctypes.c_char_p, [p]),
            ("disc_model_num_inputs", i32, [p]),
            ("disc_model_num_outputs", i32, [p]),
            ("disc_model_input_info", i32, [p, i32, ctypes.POINTER(TensorInfo)]),
            ("disc_model_output_info", i32, [p, i32, ctypes.POINTER(TensorInfo)]),
            ("disc_model_output_shapes", i32, [p, tensors, i32, tensors, i32, err]),
            ("disc_model_run", i32, [p, tensors, i32, tensors, i32, err]),
            ("disc_free", None, [p]),
            ("disc_dtype_size", ctypes.c_size_t, [i32]),
            ("disc_dtype_name", ctypes.c_char_p, [i32]),
        ]:
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args

    def load(self, folder: Path) -> Model:
        error = Error()
        handle = self.lib.disc_model_load(str(folder).encode(), ctypes.byref(error))
        if not handle:
            raise CError(error.status, error.message.decode())
        assert error.status == OK and error.message == b""
        return Model(self, handle)


def _tensors(arrays: list[np.ndarray], dtypes: list[int] | None = None) -> ctypes.Array:
    out = (Tensor * max(len(arrays), 1))()
    for k, a in enumerate(arrays):
        out[k].dtype = dtypes[k] if dtypes else CODES[a.dtype]
        out[k].rank = a.ndim
        out[k].shape[: a.ndim] = a.shape
        out[k].data = a.ctypes.data if a.size else None
    return out


class Model:
    def __init__(self, api: Api, handle: int) -> None:
        self.api, self.handle = api, handle
        lib = api.lib
        self.name = lib.disc_model_name(handle).decode()
        self.inputs = [self._info(lib.disc_model_input_info, i) for i in range(lib.disc_model_num_inputs(handle))]
        self.outputs = [self._info(lib.disc_model_output_info, k) for k in range(lib.disc_model_num_outputs(handle))]

    def _info(self, fn, index: int) -> tuple[str, str, list[str]]:
        info = TensorInfo()
        assert fn(self.handle, index, ctypes.byref(info)) == OK
        dims = [info.dims[d].decode() for d in range(info.rank)]
        assert info.dims[info.rank] is None
        return info.name.decode(), self.api.lib.disc_dtype_name(info.dtype).decode(), dims

    def _call(self, fn, arrays, dtypes, outs) -> None:
        error = Error()
        rc = fn(self.handle, _tensors(arrays, dtypes), len(arrays), outs, len(self.outputs), ctypes.byref(error))
        assert rc == error.status
        if rc != OK:
            raise CError(rc, error.message.decode())

    def output_shapes(self, arrays: list[np.ndarray], dtypes: list[int] | None = None) -> list[tuple[int, tuple[int, ...]]]:
        outs = (Tensor * max(len(self.outputs), 1))()
        self._call(self.api.lib.disc_model_output_shapes, arrays, dtypes, outs)
        return [(t.dtype, tuple(t.shape[: t.rank])) for t in outs[: len(self.outputs)]]

    def run(self, arrays: list[np.ndarray], dtypes: list[int] | None = None, out: list[np.ndarray] | None = None) -> list[np.ndarray]:
        """Outputs in memory the runtime allocates (copied out, then freed), or written into ``out``."""
        outs = (Tensor * max(len(self.outputs), 1))()
        for k, a in enumerate(out or []):
            outs[k].data = a.ctypes.data
        self._call(self.api.lib.disc_model_run, arrays, dtypes, outs)
        result = []
        for k, t in enumerate(outs[: len(self.outputs)]):
            shape, dtype = tuple(t.shape[: t.rank]), NUMPY[t.dtype]
            n = int(np.prod(shape, dtype=np.int64))
            if out is not None:
                assert t.data == out[k].ctypes.data
                result.append(out[k].reshape(-1)[:n].reshape(shape))
                continue
            assert t.data and t.data % 64 == 0
            raw = (ctypes.c_char * (n * dtype.itemsize)).from_address(t.data)
            result.append(np.frombuffer(raw, dtype=dtype, count=n).reshape(shape).copy())
            self.api.lib.disc_free(t.data)
        return result

    def close(self) -> None:
        self.api.lib.disc_model_free(self.handle)


# -- models, compiled and saved once per module --------------------------------------------------
class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(5, 16), nn.Linear(16, 3)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x)))


class Masked(nn.Module):
    """Two inputs sharing dims, and a rule on ``s`` (the input checks' messages)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(5, 4)

    def forward(self, x, m):
        return self.lin(x) * m[..., None]


class Halves(nn.Module):
    """``x``'s second dim is ``2*h``: a dim the program itself checks (``?`` in interface.txt)."""

    def forward(self, x, y):
        return x[:, ::2] + y


class PassOn(nn.Module):
    """Outputs of every kind: a buffer, the same buffer again, an input, a constant."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.linspace(-1, 1, 3))

    def forward(self, x):
        y = x * 2
        return y, y, x, self.w


class Kept(nn.Module):
    """A data-dependent output (nonzero's count) next to an ordinary one."""

    def forward(self, x):
        return x[x[:, 0] > 0] * 2, x.sum(0)


class Bf16(nn.Module):
    def forward(self, x):
        return (x.float() * 3).to(torch.bfloat16), x > 0


@pytest.fixture(scope="module")
def api() -> Api:
    return Api(_library())


@pytest.fixture(scope="module")
def run_saved(api: Api, tmp_path_factory) -> Path:
    """examples/c/run_saved.c, built as a user would against the library and header."""
    lib = Path(api.lib._name)
    exe = tmp_path_factory.mktemp("bin") / "run_saved"
    if shutil.which("cc") is None:
        pytest.skip("no C compiler (cc)")
    cmd = ["cc", "-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", f"-I{RAL_DIR}", str(EXAMPLE), str(lib)]
    cmd += [f"-Wl,-rpath,{lib.parent}", "-ldl", "-o", str(exe)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return exe


def _compile(model: nn.Module, inputs: tuple, **kwargs) -> disc.CompiledModule:
    torch.manual_seed(0)
    cm = disc.compile(model.eval(), inputs, **kwargs)
    assert cm.report.backend.name == "native-cpu", cm.report.backend.reason
    return cm


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, tuple[disc.CompiledModule, Path]]:
    """Every test model, compiled and saved (disc.save writes interface.txt for the runtime)."""
    from disc.models import MODELS

    root = tmp_path_factory.mktemp("saved")
    bert = MODELS["bert"]
    compiled = {
        "mlp": _compile(Mlp(), (torch.randn(2, 4, 5),), dynamic={"x": {0: "b", 1: "s"}}),
        "masked": _compile(Masked(), (torch.randn(2, 4, 5), torch.rand(2, 4)), dynamic={"x": {0: "b", 1: "s"}, "m": {0: "b", 1: "s"}},
                           constraints={"s": {"min": 2, "max": 64, "multiple_of": 2}}),
        "halves": _compile(Halves(), (torch.randn(3, 8), torch.randn(3, 4)), dynamic={"x": {0: "b", 1: "s"}, "y": {0: "b", 1: "h"}}, constraints=["s == 2*h"]),
        "pass": _compile(PassOn(), (torch.randn(2, 3),), dynamic={"x": {0: "b"}}),
        "kept": _compile(Kept(), (torch.randn(7, 5),), dynamic={"x": {0: "n"}}),
        "bf16": _compile(Bf16(), (torch.randn(3, 8).to(torch.bfloat16),), dynamic={"x": {0: "b"}}),
        "bert": _compile(bert.build(), bert.inputs(bert.export_shape), dynamic=bert.dynamic),
    }  # fmt: skip
    out = {}
    for name, cm in compiled.items():
        out[name] = (cm, disc.save(cm, root / name))
    return out


# -- helpers --------------------------------------------------------------------------------------
def _numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().contiguous()
    return t.view(torch.uint16).numpy() if t.dtype == torch.bfloat16 else t.numpy()


def _expected(cm: disc.CompiledModule, inputs: tuple) -> list[np.ndarray]:
    with torch.no_grad():
        got = cm(*inputs)
    return [_numpy(t) for t in (got if isinstance(got, (tuple, list)) else (got,))]


def _same(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        if np.issubdtype(w.dtype, np.floating):
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
        else:
            np.testing.assert_array_equal(g, w)


def _run_example(exe: Path, folder: Path, inputs: tuple, work: Path) -> tuple[str, list[np.ndarray]]:
    """run_saved on ``inputs`` (saved as .npy): its printed text and its outputs."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    paths = []
    for i, t in enumerate(inputs):
        paths.append(work / f"input{i}.npy")
        np.save(paths[-1], _numpy(t))
    proc = subprocess.run([str(exe), str(folder), str(work), *map(str, paths)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.endswith("ok\n") and proc.stderr == ""
    outputs = sorted(work.glob("output*.npy"), key=lambda p: int(p.stem.removeprefix("output")))
    return proc.stdout, [np.load(p) for p in outputs]


def _copy(folder: Path, to: Path) -> Path:
    shutil.copytree(folder, to)
    return to


def _load_error(api: Api, folder: Path) -> CError:
    with pytest.raises(CError) as e:
        api.load(folder)
    return e.value


# -- the example runner: outputs equal the compiled module's ------------------------------------
def test_example_runs_an_mlp_with_two_dynamic_dims(saved, run_saved, tmp_path) -> None:
    cm, folder = saved["mlp"]
    g = torch.Generator().manual_seed(1)
    for b, s in [(2, 4), (1, 1), (1, 9), (6, 1), (3, 17)]:
        x = torch.randn(b, s, 5, generator=g)
        text, got = _run_example(run_saved, folder, (x,), tmp_path / "work")
        _same(got, _expected(cm, (x,)))
    assert "input x: f32 [b, s, 5]\n" in text and "output output0: f32 [b, s, 3]\n" in text


def test_example_runs_bert_from_the_model_zoo(saved, run_saved, tmp_path) -> None:
    from disc.models import MODELS

    cm, folder = saved["bert"]
    entry = MODELS["bert"]
    for seed, shape in enumerate([{"batch": 1, "seq": 1}, {"batch": 2, "seq": 16}, {"batch": 3, "seq": 5}, {"batch": 1, "seq": 7}]):
        inputs = entry.inputs(shape, seed=seed)
        text, got = _run_example(run_saved, folder, inputs, tmp_path / "work")
        _same(got, _expected(cm, inputs))
    assert "input input_ids: i64 [batch, seq]\n" in text and "input attention_mask: i64 [batch, seq]\n" in text


def test_example_runs_a_data_dependent_output(saved, run_saved, tmp_path) -> None:
    cm, folder = saved["kept"]
    g = torch.Generator().manual_seed(2)
    cases = [
        torch.randn(7, 5, generator=g),
        torch.randn(1, 5, generator=g),
        -torch.rand(4, 5, generator=g),
        torch.rand(3, 2, generator=g)[:, :1].expand(3, 5) + 1,
    ]
    for x in [*cases, torch.randn(33, 5, generator=g)]:
        _, got = _run_example(run_saved, folder, (x,), tmp_path / "work")
        want = _expected(cm, (x,))
        assert got[0].shape[0] == int((x[:, 0] > 0).sum())
        _same(got, want)


def test_example_takes_bf16_as_raw_bits_and_writes_bools(saved, run_saved, tmp_path) -> None:
    cm, folder = saved["bf16"]
    for b in (3, 1):
        x = torch.randn(b, 8).to(torch.bfloat16)
        text, got = _run_example(run_saved, folder, (x,), tmp_path / "work")
        _same(got, _expected(cm, (x,)))
    assert "input x: bf16 [b, 8]\n" in text


def test_example_reports_an_error_and_exits_1(saved, run_saved, tmp_path) -> None:
    _, folder = saved["mlp"]
    np.save(tmp_path / "x.npy", np.zeros((2, 3, 4), np.float32))
    proc = subprocess.run([str(run_saved), str(folder), str(tmp_path), str(tmp_path / "x.npy")], capture_output=True, text=True)
    assert proc.returncode == 1
    assert "input 'x' dim 2 is 4 but must be 5 (a static dim of the compiled program)" in proc.stderr


# -- the C API in this process ------------------------------------------------------------------
def test_info_and_output_shapes(api, saved) -> None:
    model = api.load(saved["mlp"][1])
    try:
        assert model.name == "Mlp"
        assert model.inputs == [("x", "f32", ["b", "s", "5"])]
        assert model.outputs == [("output0", "f32", ["b", "s", "3"])]
        assert model.output_shapes([np.zeros((3, 7, 5), np.float32)]) == [(2, (3, 7, 3))]
    finally:
        model.close()
    model = api.load(saved["kept"][1])
    try:  # a data-dependent output gets the most it can be
        assert model.output_shapes([np.zeros((6, 5), np.float32)]) == [(2, (6, 5)), (2, (5,))]
    finally:
        model.close()
    assert api.lib.disc_dtype_size(1) == 2 and api.lib.disc_dtype_name(9) == b"i1"
    assert api.lib.disc_dtype_size(12) == 8 and api.lib.disc_dtype_name(12) == b"u64"
    assert api.lib.disc_dtype_size(13) == 0 and api.lib.disc_dtype_name(-1) == b"?"


def test_input_errors_have_the_python_checks_messages(api, saved) -> None:
    cm, folder = saved["masked"]
    model = api.load(folder)
    try:
        for x_shape, m_shape in [((2, 4, 5), (2, 6)), ((2, 5, 5), (2, 5)), ((2, 66, 5), (2, 66)), ((2, 4, 4), (2, 4)), ((3, 4, 5), (2, 4))]:
            x, m = torch.randn(*x_shape), torch.rand(*m_shape)
            with pytest.raises(ShapeError) as python:
                cm(x, m)
            with pytest.raises(CError) as c:
                model.run([x.numpy(), m.numpy()])
            assert c.value.status == E_SHAPE and c.value.message == str(python.value)
            with pytest.raises(CError) as c:  # the same checks before allocating
                model.output_shapes([x.numpy(), m.numpy()])
            assert c.value.status == E_SHAPE and c.value.message == str(python.value)
        x, m = np.zeros((2, 4, 5), np.float32), np.zeros((2, 4), np.float32)
        with pytest.raises(InputError) as python:
            cm(torch.zeros(2, 4), torch.zeros(2, 4))
        with pytest.raises(CError) as c:
            model.run([np.zeros((2, 4), np.float32), m])
        assert c.value.status == E_INPUT and c.value.message == str(python.value)
        assert c.value.message == "input 'x' has rank 2 (shape (2, 4)), compiled for rank 3 f32[b, s, 5]"
        for bad, message in [
            ([x.astype(np.float64), m], "input 'x' has dtype f64, compiled for f32"),
            ([x, m.astype(np.int64)], "input 'm' has dtype i64, compiled for f32"),
            ([x], "expected 2 input(s) ['x', 'm'], got 1"),
        ]:
            with pytest.raises(CError) as c:
                model.run(bad)
            assert (c.value.status, c.value.message) == (E_INPUT, message)
        with pytest.raises(CError) as c:  # a dtype code that is none of DISC_F16..DISC_BOOL
            model.run([x, m], dtypes=[2, 99])
        assert (c.value.status, c.value.message) == (E_INPUT, "input 'm' has dtype 99 (no disc dtype), compiled for f32")
        tensors = _tensors([x, m])
        tensors[1].data = None
        outs, error = (Tensor * 1)(), Error()
        assert api.lib.disc_model_run(model.handle, tensors, 2, outs, 1, ctypes.byref(error)) == E_INPUT
        assert error.message.decode() == "input 'm' has shape (2, 4) but its data is null"
        assert not outs[0].data
        assert api.lib.disc_model_run(model.handle, _tensors([x, m]), 2, outs, 2, ctypes.byref(error)) == E_INPUT
        assert error.message.decode() == "expected 1 output(s), got 2"
        assert model.run([np.zeros((0, 4, 5), np.float32), np.zeros((0, 4), np.float32)])[0].shape == (0, 4, 4)
    finally:
        model.close()


def test_the_ranges_of_a_zoo_model_and_a_check_the_program_makes(api, saved) -> None:
    cm, folder = saved["bert"]
    model = api.load(folder)
    try:
        ids = np.zeros((2, 513), np.int64)
        with pytest.raises(ShapeError) as python:
            cm(torch.from_numpy(ids), torch.from_numpy(ids))
        with pytest.raises(CError) as c:
            model.run([ids, ids])
        assert (
            c.value.status == E_SHAPE
            and c.value.message == str(python.value) == "input 'input_ids' dim 1 is 513 but seq must be in [1, 512]"
        )
    finally:
        model.close()
    # x[:, ::2] + y ties y's dim 1 to x's, (s+1)//2, a dim the interface cannot name ("?"), and the
    # user's s == 2*h makes s even: the runtime leaves both to the program's own check (disc_shapes' rc 2).
    model = api.load(saved["halves"][1])
    try:
        assert model.inputs == [("x", "f32", ["b", "s"]), ("y", "f32", ["b", "?"])]
        with pytest.raises(CError) as c:
            model.run([np.zeros((3, 8), np.float32), np.zeros((3, 5), np.float32)])
        assert c.value.status == E_SHAPE and c.value.message.startswith("shape check failed: ")
        with pytest.raises(CError) as c:  # (9 + 1) // 2 == 5 fits the add, but s == 2*h does not hold
            model.run([np.zeros((3, 9), np.float32), np.zeros((3, 5), np.float32)])
        assert c.value.status == E_SHAPE and c.value.message.startswith("shape check failed: ")
        x, y = torch.randn(3, 10), torch.randn(3, 5)
        _same(model.run([x.numpy(), y.numpy()]), _expected(saved["halves"][0], (x, y)))
    finally:
        model.close()


def test_outputs_of_every_kind_get_memory_of_their_own(api, saved) -> None:
    cm, folder = saved["pass"]
    model = api.load(folder)
    try:
        x = torch.randn(4, 3)
        want = _expected(cm, (x,))
        _same(model.run([x.numpy()]), want)  # four blocks, each freed once with disc_free
        out = [np.full(w.shape, np.nan, w.dtype) for w in want]
        _same(model.run([x.numpy()], out=out), want)  # written into the caller's buffers
        x = torch.randn(1, 3)
        _same(model.run([x.numpy()]), _expected(cm, (x,)))
    finally:
        model.close()


def test_a_data_dependent_output_in_a_callers_buffer(api, saved) -> None:
    cm, folder = saved["kept"]
    model = api.load(folder)
    try:
        x = torch.randn(9, 5, generator=torch.Generator().manual_seed(3))
        bound = model.output_shapes([x.numpy()])
        out = [np.full(shape, np.nan, np.float32) for _, shape in bound]
        got = model.run([x.numpy()], out=out)
        _same(got, _expected(cm, (x,)))
        assert got[0].shape[0] < 9  # the rows kept come first in the buffer sized for all 9
    finally:
        model.close()


def test_four_threads_at_different_shapes(api, saved) -> None:
    from disc.models import MODELS

    cm, folder = saved["bert"]
    entry = MODELS["bert"]
    shapes = [{"batch": 1, "seq": 3}, {"batch": 2, "seq": 16}, {"batch": 3, "seq": 7}, {"batch": 4, "seq": 1}]
    cases = [(entry.inputs(s, seed=k), None) for k, s in enumerate(shapes)]
    cases = [(inputs, _expected(cm, inputs)) for inputs, _ in cases]
    model = api.load(folder)
    failures: list[BaseException] = []
    start = threading.Barrier(len(cases))

    def work(inputs, want) -> None:
        try:
            start.wait()
            for _ in range(20):
                _same(model.run([t.numpy() for t in inputs]), want)
        except BaseException as e:  # reported by the main thread
            failures.append(e)

    threads = [threading.Thread(target=work, args=case) for case in cases]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        model.close()
    assert not failures, failures[0]


# -- folders the runtime refuses ----------------------------------------------------------------
def test_damaged_files_are_refused_naming_them(api, saved, tmp_path) -> None:
    _, folder = saved["masked"]
    for name, damage in [
        ("constants.bin", lambda data: data[:7] + bytes([data[7] ^ 1]) + data[8:]),
        ("constants.bin", lambda data: data[:-1]),
        ("program.so", lambda data: data[: len(data) // 2] + bytes([data[len(data) // 2] ^ 0x40]) + data[len(data) // 2 + 1 :]),
        ("program.so", lambda data: data + b"\0"),
    ]:
        bad = _copy(folder, tmp_path / f"bad{len(list(tmp_path.iterdir()))}")
        (bad / name).write_bytes(damage((bad / name).read_bytes()))
        e = _load_error(api, bad)
        assert (e.status, e.message) == (E_FILE, f"saved program {bad}: {name} is damaged (its size or SHA-256 differs from interface.txt)")
    bad = _copy(folder, tmp_path / "missing")
    (bad / "program.so").unlink()
    e = _load_error(api, bad)
    assert e.status == E_FILE and e.message.startswith(f"saved program {bad}: cannot read program.so (")
    e = _load_error(api, tmp_path / "nothing here")
    assert e.status == E_FILE and "interface.txt" in e.message


def _edited(folder: Path, to: Path, edit) -> Path:
    _copy(folder, to)
    (to / "interface.txt").write_text(edit((to / "interface.txt").read_text()))
    return to


def test_programs_that_cannot_run_standalone_are_refused(api, saved, tmp_path) -> None:
    _, folder = saved["mlp"]
    needs = "needs PyTorch for the ops it runs between compiled segments: aten.sort\nneeds the model's parameters: it is a program-cache entry\n"
    bad = _edited(folder, tmp_path / "needs", lambda t: t.replace("symbol ", needs + "symbol ", 1))
    e = _load_error(api, bad)
    assert (e.status, e.message) == (
        E_UNSUPPORTED,
        f"saved program {bad} cannot run standalone: it needs PyTorch for the ops it runs between compiled segments: aten.sort; "
        "the model's parameters: it is a program-cache entry",
    )
    host = parse_interface((folder / "interface.txt").read_text()).host
    bad = _edited(folder, tmp_path / "host", lambda t: t.replace(host, "0" * 64))
    e = _load_error(api, bad)
    assert e.status == E_UNSUPPORTED and "program.so was built for another CPU" in e.message
    bad = _edited(folder, tmp_path / "abi", lambda t: t.replace("\nabi 5\n", "\nabi 4\n"))
    e = _load_error(api, bad)
    assert e.status == E_UNSUPPORTED and "RAL ABI 4" in e.message


# Edits of a valid interface.txt, each breaking one rule of the grammar or of _check.
EDITS = [
    lambda t: "",
    lambda t: t.replace("disc-program-interface 1", "disc-program-interface 2"),
    lambda t: t[: t.index("end\n")],
    lambda t: t[: t.index("\nbuffer ")],
    lambda t: t + "junk\n",
    lambda t: t.replace("\nabi 5", "\nabi five"),
    lambda t: t.replace("\nabi 5", "\nabi 0"),
    lambda t: t.replace("input x f32 3", "input x f33 3"),
    lambda t: t.replace("input x f32 3", "input x f32 4"),
    lambda t: t.replace("input x f32 3", "input  x f32 3"),
    lambda t: t.replace("input m f32 2 b s", "input m f32 2 b t"),
    lambda t: t.replace("input m f32", "input x f32"),
    lambda t: t.replace("symbol s 2 64 2", "symbol s 2 64 0"),
    lambda t: t.replace("symbol s 2 64 2", "symbol s 2 -64 2"),
    lambda t: t.replace("\ndata_dependent 0", "\ndata_dependent 2"),
    lambda t: t.replace("\nend", "\nbogus line\nend"),
    lambda t: t.replace("\nend", "\n\nend"),
    lambda t: t.replace("\nend", "\nend "),
    lambda t: t.replace("f32 128 16 1 4", "f32 96 16 1 4"),
    lambda t: t.replace("f32 128 16 1 4", "f32 128 20 1 4"),
    lambda t: t.replace("f32 128 16 1 4", "f32 128 16 1 s"),
    lambda t: t.replace("argument p_lin_bias", "argument p_nope"),
    lambda t: t.replace("output buffer 0", "output buffer 3"),
    lambda t: t.replace("output buffer 0 f32", "output buffer 0 i64"),
    lambda t: t.replace("output buffer 0", "output same 0"),
    lambda t: t.replace("output buffer 0", "output input 2"),
    lambda t: t.replace("output buffer 0", "output constant p_none"),
    lambda t: t.replace("output buffer 0", "output tensor 0"),
    lambda t: "\n".join(line for line in t.split("\n") if not line.startswith("host ")),
    lambda t: "\n".join(line.upper() if line.startswith("host ") else line for line in t.split("\n")),
    lambda t: "\n".join(line.replace(" 144 ", " 150 ") if line.startswith("file constants.bin") else line for line in t.split("\n")),
    lambda t: "\n".join(line.replace(" 144 ", " -144 ") if line.startswith("file constants.bin") else line for line in t.split("\n")),
    lambda t: t.replace("input x f32 3 b s 5", "input x f32 17 " + " ".join(["1"] * 17)),
]


def test_a_broken_interface_is_refused_with_the_python_parsers_message(api, saved, tmp_path) -> None:
    _, folder = saved["masked"]
    text = (folder / "interface.txt").read_text()
    for k, edit in enumerate(EDITS):
        bad = _edited(folder, tmp_path / f"edit{k}", edit)
        where = str(bad / "interface.txt")
        with pytest.raises(InterfaceError) as python:
            parse_interface(edit(text), where)
        e = _load_error(api, bad)
        assert (e.status, e.message) == (E_FILE, str(python.value)), k


def test_random_edits_never_crash_and_match_the_python_parser(api, saved, tmp_path) -> None:
    """Characters and lines deleted, inserted, repeated: wherever the Python parser refuses the
    text, the runtime refuses it with the same message; elsewhere it loads or refuses, never crashes."""
    _, folder = saved["pass"]
    text = (folder / "interface.txt").read_text()
    rng = random.Random(0)
    bad = _copy(folder, tmp_path / "fuzz")
    where = str(bad / "interface.txt")
    for _ in range(300):
        t = text
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(t) + 1)
            lines = t.split("\n")
            line = rng.randrange(len(lines))
            t = rng.choice([
                t[:at] + t[at + 1 :],
                t[:at] + rng.choice(" \n0123456789-?abfsxyz") + t[at:],
                "\n".join(lines[:line] + lines[line + 1 :]),
                "\n".join(lines[: line + 1] + lines[line:]),
            ])  # fmt: skip
        (bad / "interface.txt").write_text(t)
        try:
            parse_interface(t, where)
            python = None
        except InterfaceError as e:
            python = str(e)
        try:
            api.load(bad).close()
            c = None
        except CError as e:
            c = e
        if python is not None:
            assert c is not None and (c.status, c.message) == (E_FILE, python), t
