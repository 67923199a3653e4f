"""Run saved disc programs with numpy alone: no PyTorch, no compiler pipeline.

    import disc_runtime
    m = disc_runtime.load("model.disc")          # a folder written by disc.save
    m.inputs                                     # [TensorInfo(name='ids', dtype='i64', dims=('batch', 'seq')), ...]
    logits, = m.run({"ids": ids})                # or m.run(ids): a list of numpy arrays

This is a thin layer over the C runtime (``disc_runtime.h``, in the RAL library): loading checks
every file of the folder against its ``interface.txt``, the library's ABI and the CPU it was built
for; a call checks the inputs and raises `InputError` or `ShapeError` naming the input, the dim and
the rule. A model may be called from many threads at once. bf16 tensors are passed and returned
as ``numpy.uint16`` arrays of their bits (numpy has no bfloat16; an ``ml_dtypes.bfloat16`` array
is taken as is). A saved program is native code: load only programs you trust.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import threading
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from disc.errors import DiscError, InputError, ShapeError

__all__ = ["InputError", "LoadError", "Model", "RunError", "ShapeError", "TensorInfo", "load"]

MAX_RANK = 16
# disc_runtime.h's status codes and dtypes.
OK, ERROR_FILE, ERROR_INPUT, ERROR_SHAPE, ERROR_RUN, ERROR_UNSUPPORTED, ERROR_MEMORY = range(7)
DTYPES = ("f16", "bf16", "f32", "f64", "i8", "u8", "i16", "i32", "i64", "i1", "u16", "u32", "u64")
NUMPY = {"f16": np.float16, "bf16": np.uint16, "f32": np.float32, "f64": np.float64, "i8": np.int8, "u8": np.uint8,
         "i16": np.int16, "i32": np.int32, "i64": np.int64, "i1": np.bool_, "u16": np.uint16, "u32": np.uint32, "u64": np.uint64}  # fmt: skip
_CODE_OF_NUMPY = {np.dtype(v): DTYPES.index(k) for k, v in NUMPY.items() if k != "bf16"}


class LoadError(DiscError):
    """A saved program cannot be loaded here (a file is missing or damaged, or it needs PyTorch, a GPU or another CPU)."""


class RunError(DiscError, RuntimeError):
    """The program or a library routine failed during a call."""


class TensorInfo(NamedTuple):
    name: str
    dtype: str  # the IR's name: "f32", "bf16", "i64", ...
    dims: tuple[int | str, ...]  # a number for a static dim, the symbol's name for a dynamic one, "?" for a computed one


class _Error(ctypes.Structure):
    _fields_ = [("status", ctypes.c_int32), ("message", ctypes.c_char * 1024)]


class _Info(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int32), ("rank", ctypes.c_int32), ("dims", ctypes.POINTER(ctypes.c_char_p))]


class _Tensor(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int32), ("rank", ctypes.c_int32), ("shape", ctypes.c_int64 * MAX_RANK), ("data", ctypes.c_void_p)]


_lib_lock = threading.Lock()
_libs: dict[str, ctypes.CDLL] = {}


def _bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    p, i32 = ctypes.c_void_p, ctypes.c_int32
    signatures = {
        "disc_model_load": (p, [ctypes.c_char_p, ctypes.POINTER(_Error)]),
        "disc_model_free": (None, [p]),
        "disc_model_name": (ctypes.c_char_p, [p]),
        "disc_model_num_inputs": (i32, [p]),
        "disc_model_num_outputs": (i32, [p]),
        "disc_model_input_info": (i32, [p, i32, ctypes.POINTER(_Info)]),
        "disc_model_output_info": (i32, [p, i32, ctypes.POINTER(_Info)]),
        "disc_model_output_shapes": (i32, [p, ctypes.POINTER(_Tensor), i32, ctypes.POINTER(_Tensor), i32, ctypes.POINTER(_Error)]),
        "disc_model_run": (i32, [p, ctypes.POINTER(_Tensor), i32, ctypes.POINTER(_Tensor), i32, ctypes.POINTER(_Error)]),
    }
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


def _runtime_library(folder: Path) -> ctypes.CDLL:
    """This machine's runtime library (built once where a C++ compiler is), else the folder's ``ral.so``."""
    from disc.errors import CompileError
    from disc.runtime.ral_build import preload_dnnl, runtime_library

    try:
        path = runtime_library()
    except CompileError as e:
        path = folder / "ral.so"
        _check_saved_runtime(folder, path, e)
    with _lib_lock:
        lib = _libs.get(str(path))
        if lib is None:
            preload_dnnl()  # the saved library's rpath may name another machine's environment
            try:
                lib = _libs[str(path)] = _bind(ctypes.CDLL(str(path)))
            except (OSError, AttributeError) as e:
                raise LoadError(f"saved program {folder}: its runtime library {path.name} cannot be used here ({e})") from e
        return lib


def _check_saved_runtime(folder: Path, path: Path, why: Exception) -> None:
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
        expected = manifest["files"]["ral.so"]
        data = path.read_bytes()
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise LoadError(f"saved program {folder}: no runtime library can be built here ({why}) and the folder has no usable ral.so ({e})") from e
    if {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)} != expected:
        raise LoadError(f"saved program {folder}: ral.so is damaged (its size or SHA-256 differs from manifest.json)")


def _raise(err: _Error) -> None:
    message = err.message.decode(errors="replace")
    if err.status == ERROR_INPUT:
        raise InputError(message)
    if err.status == ERROR_SHAPE:
        raise ShapeError(message)
    if err.status in (ERROR_FILE, ERROR_UNSUPPORTED):
        raise LoadError(message)
    if err.status == ERROR_MEMORY:
        raise MemoryError(message)
    raise RunError(message or f"disc runtime failed (status {err.status})")


def _info(fn: Any, handle: int, count: int) -> list[TensorInfo]:
    out = []
    for k in range(count):
        info = _Info()
        fn(handle, k, ctypes.byref(info))
        dims = tuple(int(d) if d.isdigit() else d for d in (info.dims[j].decode() for j in range(info.rank)))
        out.append(TensorInfo(info.name.decode(), DTYPES[info.dtype], dims))
    return out


class Model:
    """A loaded program. Call `run` from any number of threads."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self._lib = _runtime_library(self.folder)
        err = _Error()
        handle = self._lib.disc_model_load(str(self.folder).encode(), ctypes.byref(err))
        if not handle:
            _raise(err)
        self._handle = handle
        self._finalizer = weakref.finalize(self, self._lib.disc_model_free, handle)
        self.name = self._lib.disc_model_name(handle).decode()
        self.inputs = _info(self._lib.disc_model_input_info, handle, self._lib.disc_model_num_inputs(handle))
        self.outputs = _info(self._lib.disc_model_output_info, handle, self._lib.disc_model_num_outputs(handle))
        self._index = {t.name: k for k, t in enumerate(self.inputs)}

    def __repr__(self) -> str:
        inputs = ", ".join(f"{t.name}: {t.dtype}{list(t.dims)}" for t in self.inputs)
        return f"<disc_runtime.Model {self.name}({inputs}) -> {len(self.outputs)} output(s)>"

    def close(self) -> None:
        """Free the program now (it is freed when the Model is collected otherwise)."""
        self._finalizer()

    def _arrays(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[np.ndarray]:
        if len(args) == 1 and isinstance(args[0], Mapping) and not kwargs:
            args, kwargs = (), args[0]
        if args and kwargs:
            raise InputError("pass the inputs by position or by name, not both")
        if kwargs:
            unknown = [k for k in kwargs if k not in self._index]
            missing = [t.name for t in self.inputs if t.name not in kwargs]
            if unknown or missing:
                raise InputError(f"inputs are {[t.name for t in self.inputs]}; unknown {unknown}, missing {missing}")
            args = [kwargs[t.name] for t in self.inputs]
        if len(args) != len(self.inputs):
            raise InputError(f"expected {len(self.inputs)} input(s) {[t.name for t in self.inputs]}, got {len(args)}")
        return [np.asarray(a, order="C") for a in args]

    def _tensors(self, arrays: list[np.ndarray]) -> ctypes.Array:
        tensors = (_Tensor * max(len(arrays), 1))()
        for k, (t, a) in enumerate(zip(self.inputs, arrays)):
            if a.ndim > MAX_RANK:
                raise InputError(f"input {t.name!r} has rank {a.ndim}; disc takes at most {MAX_RANK} dims")
            code = _CODE_OF_NUMPY.get(a.dtype)
            if a.dtype.itemsize == 2 and (a.dtype.name == "bfloat16" or (t.dtype == "bf16" and a.dtype == np.uint16)):
                code = DTYPES.index("bf16")
            if code is None:
                raise InputError(f"input {t.name!r} has numpy dtype {a.dtype}, which disc does not take (compiled for {t.dtype})")
            tensors[k].dtype, tensors[k].rank = code, a.ndim
            for d, size in enumerate(a.shape):
                tensors[k].shape[d] = size
            tensors[k].data = a.ctypes.data if a.size else None
        return tensors

    def output_shapes(self, *args: Any, **kwargs: Any) -> list[tuple[int, ...]]:
        """Each output's shape for these inputs (a data-dependent one at the most it can be)."""
        arrays = self._arrays(args, kwargs)
        outs, err = (_Tensor * max(len(self.outputs), 1))(), _Error()
        if self._lib.disc_model_output_shapes(self._handle, self._tensors(arrays), len(arrays), outs, len(self.outputs), ctypes.byref(err)):
            _raise(err)
        return [tuple(outs[k].shape[: outs[k].rank]) for k in range(len(self.outputs))]

    def run(self, *args: Any, **kwargs: Any) -> list[np.ndarray]:
        """The outputs for these inputs (numpy arrays, or anything numpy converts without copying
        a dtype): positional in the program's input order, by name, or one dict by name."""
        arrays = self._arrays(args, kwargs)
        tensors = self._tensors(arrays)
        n = len(self.outputs)
        outs, err = (_Tensor * max(n, 1))(), _Error()
        if self._lib.disc_model_output_shapes(self._handle, tensors, len(arrays), outs, n, ctypes.byref(err)):
            _raise(err)
        results = []
        for k, t in enumerate(self.outputs):
            buf = np.empty(tuple(outs[k].shape[: outs[k].rank]), dtype=NUMPY[t.dtype])
            outs[k].data = buf.ctypes.data if buf.size else None
            results.append(buf)
        if self._lib.disc_model_run(self._handle, tensors, len(arrays), outs, n, ctypes.byref(err)):
            _raise(err)
        for k, buf in enumerate(results):
            shape = tuple(outs[k].shape[: outs[k].rank])
            if shape != buf.shape:  # a data-dependent output: its elements come first in the buffer
                results[k] = buf.reshape(-1)[: int(np.prod(shape, dtype=np.int64))].reshape(shape).copy()
        return results

    __call__ = run


def load(folder: str | Path) -> Model:
    """Load the program ``disc.save`` wrote to ``folder``."""
    return Model(folder)
