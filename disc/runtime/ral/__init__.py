"""The runtime abstraction layer (RAL) from Python: build, load and call the CPU RAL.

`load_ral()` compiles ``ral_cpu.cc`` through the toolchain (against oneDNN when `have_dnnl()`,
else with the builtin fallbacks), loads it with ctypes and returns a `Ral`: the address of the
``disc_ral`` table that generated programs receive, its ``gemm_library``, and thin `gemm` /
`conv2d` wrappers over torch tensors (used by tests and benchmarks). The ctypes Structures below
mirror ``ral.h`` field for field; tests compare their layout with the C compiler's.
"""

from __future__ import annotations

import ctypes
import math
import os
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from disc.errors import RuntimeFailure
from disc.runtime.ral_build import ABI_VERSION, Variant, build_ral, preload_dnnl, resolve_variant

MAX_BATCH_DIMS = 6

_i64 = ctypes.c_int64
_i32 = ctypes.c_int32
_ptr = ctypes.c_void_p
_dims = _i64 * MAX_BATCH_DIMS
_pair = _i64 * 2


class Ctx(ctypes.Structure):
    """``disc_ral_ctx``: per-call state; ``error`` holds the first message after a failure."""

    _fields_ = [("failed", _i32), ("error", ctypes.c_char * 1020)]


class GemmArgs(ctypes.Structure):
    """``disc_gemm_args``."""

    _fields_ = [
        ("m", _i64), ("n", _i64), ("k", _i64),
        ("batch_rank", _i32), ("batch_shape", _dims),
        ("a", _ptr), ("a_rs", _i64), ("a_cs", _i64), ("a_bs", _dims),
        ("b", _ptr), ("b_rs", _i64), ("b_cs", _i64), ("b_bs", _dims),
        ("c", _ptr), ("c_rs", _i64), ("c_bs", _dims),
        ("alpha", ctypes.c_float), ("beta", ctypes.c_float),
        ("b_is_constant", _i32), ("dtype", _i32),
    ]  # fmt: skip


# disc_gemm_args.dtype of each element type a GEMM takes (DISC_GEMM_* in ral.h).
GEMM_DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


class Conv2dArgs(ctypes.Structure):
    """``disc_conv2d_args``."""

    _fields_ = [
        ("n", _i64), ("ci", _i64), ("h", _i64), ("w", _i64),
        ("co", _i64), ("kh", _i64), ("kw", _i64),
        ("oh", _i64), ("ow", _i64),
        ("stride", _pair), ("dilation", _pair), ("pad_lo", _pair), ("pad_hi", _pair),
        ("groups", _i64), ("channels_last", _i32),
        ("input", _ptr), ("weight", _ptr), ("weight_is_constant", _i32), ("output", _ptr),
        ("bias", _ptr), ("relu", _i32),
    ]  # fmt: skip


_CtxP = ctypes.POINTER(Ctx)
ErrorFn = ctypes.CFUNCTYPE(None, _CtxP, ctypes.c_char_p)
AllocFn = ctypes.CFUNCTYPE(_ptr, _CtxP, _i64)
FreeFn = ctypes.CFUNCTYPE(None, _CtxP, _ptr)
GemmFn = ctypes.CFUNCTYPE(_i32, _CtxP, ctypes.POINTER(GemmArgs))
Conv2dFn = ctypes.CFUNCTYPE(_i32, _CtxP, ctypes.POINTER(Conv2dArgs))


class RalTable(ctypes.Structure):
    """``disc_ral``: the function table."""

    _fields_ = [
        ("abi_version", _i32),
        ("gemm_library", ctypes.c_char_p),
        ("error", ErrorFn),
        ("alloc", AllocFn),
        ("free", FreeFn),
        ("gemm", GemmFn),
        ("conv2d", Conv2dFn),
        ("conv2d_backward_data", Conv2dFn),
        ("conv2d_backward_weights", Conv2dFn),
    ]


def _raise_if_failed(rc: int, ctx: Ctx, what: str) -> None:
    if rc != 0:
        message = ctx.error.decode(errors="replace") or f"{what} returned {rc} without a message"
        raise RuntimeFailure(f"disc RAL: {message}")


def _floats(t: torch.Tensor, name: str) -> None:
    if t.dtype != torch.float32 or t.device.type != "cpu":
        raise TypeError(f"{name} must be a float32 CPU tensor, got {t.dtype} on {t.device}")


def _quad(v: int | Sequence[int], name: str) -> tuple[int, int, int, int]:
    """int, (h, w) or (top, bottom, left, right) -> (top, bottom, left, right)."""
    if isinstance(v, int):
        return (v, v, v, v)
    v = tuple(int(x) for x in v)
    if len(v) == 2:
        return (v[0], v[0], v[1], v[1])
    if len(v) == 4:
        return v  # type: ignore[return-value]
    raise ValueError(f"{name} must be an int, (h, w) or (top, bottom, left, right); got {v}")


def _pair_of(v: int | Sequence[int]) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


def gemm_args(
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor | None = None,
    *,
    alpha: float = 1.0,
    beta: float = 0.0,
    b_is_constant: bool = False,
) -> tuple[GemmArgs, torch.Tensor]:
    """``disc_gemm_args`` for ``out = alpha * a @ b + beta * out``, and ``out``.

    ``a`` is ``[*batch, m, k]`` and ``b`` ``[*batch, k, n]`` with any strides (leading dims
    broadcast as in torch.matmul; broadcast dims pass stride 0). Without ``out`` a contiguous
    result is allocated (``beta`` must then be 0); ``out`` needs unit stride along its last dim.
    The args hold raw pointers: keep the tensors alive while they are used. ``b_is_constant``
    promises that ``b`` never changes while it lives (the RAL may keep a repacked copy of it).
    """
    if a.dtype not in GEMM_DTYPES or a.device.type != "cpu":
        raise TypeError(f"a must be a float32, bfloat16 or float16 CPU tensor, got {a.dtype} on {a.device}")
    for t, name in ((b, "b"), (out, "out")):
        if t is not None and (t.dtype != a.dtype or t.device.type != "cpu"):
            raise TypeError(f"{name} must be a {a.dtype} CPU tensor like a, got {t.dtype} on {t.device}")
    if a.dim() < 2 or b.dim() < 2 or a.shape[-1] != b.shape[-2]:
        raise ValueError(f"gemm: incompatible shapes {tuple(a.shape)} @ {tuple(b.shape)}")
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    shapes = [a.shape[:-2], b.shape[:-2]] + ([out.shape[:-2]] if out is not None else [])
    batch = tuple(torch.broadcast_shapes(*shapes))
    if len(batch) > MAX_BATCH_DIMS:
        raise ValueError(f"gemm: at most {MAX_BATCH_DIMS} batch dims, got {len(batch)}")
    a = a.expand(*batch, m, k)
    b = b.expand(*batch, k, n)
    if out is None:
        if beta != 0.0:
            raise ValueError("gemm: beta != 0 needs an `out` tensor to accumulate into")
        out = torch.empty(*batch, m, n, dtype=a.dtype)
    else:
        if tuple(out.shape) != (*batch, m, n):
            raise ValueError(f"gemm: out has shape {tuple(out.shape)}, expected {(*batch, m, n)}")
        if n > 1 and out.stride(-1) != 1:
            raise ValueError("gemm: out must have unit stride along its last dim")
    nb = len(batch)
    args = GemmArgs(m=m, n=n, k=k, batch_rank=nb, alpha=alpha, beta=beta, b_is_constant=int(b_is_constant), dtype=GEMM_DTYPES[a.dtype])
    args.batch_shape[:nb] = batch
    args.a, args.a_rs, args.a_cs = a.data_ptr() or None, a.stride(-2), a.stride(-1)
    args.b, args.b_rs, args.b_cs = b.data_ptr() or None, b.stride(-2), b.stride(-1)
    args.c, args.c_rs = out.data_ptr() or None, out.stride(-2)
    args.a_bs[:nb] = a.stride()[:nb]
    args.b_bs[:nb] = b.stride()[:nb]
    args.c_bs[:nb] = out.stride()[:nb]
    return args, out


def conv2d_args(
    x: torch.Tensor,
    w: torch.Tensor,
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] = 0,
    dilation: int | Sequence[int] = 1,
    groups: int = 1,
    *,
    weight_is_constant: bool = False,
    channels_last: bool = False,
    bias: torch.Tensor | None = None,
    relu: bool = False,
) -> tuple[Conv2dArgs, torch.Tensor]:
    """``disc_conv2d_args`` for ``F.conv2d(x, w, bias)`` (then ReLU with ``relu``) and the allocated output.

    ``x`` (NCHW, or NHWC with ``channels_last``, as is the output), ``w`` (OIHW) and ``bias``
    must be contiguous; ``padding`` is an int, (h, w) or (top, bottom, left, right). Keep the
    tensors alive while the args are used.
    """
    _floats(x, "x")
    _floats(w, "w")
    if bias is not None:
        _floats(bias, "bias")
        if bias.shape != (w.shape[0],) or not bias.is_contiguous():
            raise ValueError(f"conv2d: bias must be a contiguous vector of {w.shape[0]} values (the output channels), not {tuple(bias.shape)}")
    if x.dim() != 4 or w.dim() != 4 or not x.is_contiguous() or not w.is_contiguous():
        raise ValueError(f"conv2d: x must be contiguous {'NHWC' if channels_last else 'NCHW'} and w contiguous OIHW")
    n, ci, h, wd = (x.shape[0], x.shape[3], x.shape[1], x.shape[2]) if channels_last else x.shape
    co, _, kh, kw = w.shape
    (sh, sw), (dh, dw) = _pair_of(stride), _pair_of(dilation)
    pt, pb, pl, pr = _quad(padding, "padding")
    oh = max((h + pt + pb - dh * (kh - 1) - 1) // sh + 1, 0)
    ow = max((wd + pl + pr - dw * (kw - 1) - 1) // sw + 1, 0)
    out = torch.empty(n, oh, ow, co) if channels_last else torch.empty(n, co, oh, ow)
    args = Conv2dArgs(n=n, ci=ci, h=h, w=wd, co=co, kh=kh, kw=kw, oh=oh, ow=ow, groups=groups, channels_last=int(channels_last))
    args.stride[:] = (sh, sw)
    args.dilation[:] = (dh, dw)
    args.pad_lo[:] = (pt, pl)
    args.pad_hi[:] = (pb, pr)
    args.input, args.weight, args.output = x.data_ptr() or None, w.data_ptr() or None, out.data_ptr() or None
    args.weight_is_constant = int(weight_is_constant)
    args.bias, args.relu = (bias.data_ptr() or None) if bias is not None else None, int(relu)
    return args, out


# PyCapsule_New(pointer, name, destructor): the name must outlive the capsule, so it is a module constant.
_DLTENSOR = b"dltensor"
_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class OutputCache:
    """Output tensors whose memory the RAL reuses once torch frees them (``ral_cpu.cc``'s ``OutputCache``).

    A fresh output of a megabyte or more arrives from the OS as untouched pages that the kernel
    faults in as it writes them; a freed output's block is kept instead, and `empty` hands it to
    the next call of about that size. Blocks reach torch through DLPack, so a block returns to the
    cache only when torch frees the tensor's storage: after the last view of it, never while one
    lives. Smaller outputs come from ``torch.empty`` (malloc reuses them without faulting).
    """

    MIN_BYTES = 1 << 20

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._take = lib.disc_ral_cpu_output_take
        self._take.restype, self._take.argtypes = _ptr, [_i64]
        self._give_back = lib.disc_ral_cpu_output_give_back
        self._give_back.restype, self._give_back.argtypes = None, [_ptr]
        self._release = lib.disc_ral_cpu_output_cache_release
        self._release.restype, self._release.argtypes = _i64, []
        self._limit = lib.disc_ral_cpu_output_cache_limit
        self._limit.restype, self._limit.argtypes = _i64, [_i64]
        self._stat = lib.disc_ral_cpu_output_cache_stat
        self._stat.restype, self._stat.argtypes = _i64, [_i32]

    def empty(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised contiguous tensor, as ``torch.empty(shape, dtype=dtype)``."""
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes < self.MIN_BYTES:
            return torch.empty(shape, dtype=dtype)
        managed = self._take(nbytes)
        if not managed:  # out of memory: torch.empty reports it in torch's words
            return torch.empty(shape, dtype=dtype)
        try:
            flat = torch.from_dlpack(_capsule_new(managed, _DLTENSOR, None))
        except BaseException:
            self._give_back(managed)
            raise
        return flat.view(dtype).view(shape)

    def release(self) -> int:
        """Give every cached block back to the OS; returns the bytes freed."""
        return self._release()

    def set_limit(self, max_blocks: int) -> int:
        """Keep at most ``max_blocks`` freed blocks (0: none); returns the previous limit."""
        return self._limit(max_blocks)

    def stats(self) -> dict[str, int]:
        """Cached blocks and bytes now, and how many requests were served from the cache or allocated."""
        return {"blocks": self._stat(0), "bytes": self._stat(1), "hits": self._stat(2), "misses": self._stat(3)}


_output_caches: weakref.WeakSet[OutputCache] = weakref.WeakSet()  # of every RAL opened (a saved program carries its own)


def release_cached_outputs() -> int:
    """Give every RAL's cached output blocks back to the OS; returns the bytes freed."""
    return sum(cache.release() for cache in list(_output_caches))


@dataclass(frozen=True)
class Ral:
    """A loaded RAL.

    ``table`` is the ``const disc_ral*`` (an address, pass it as ``c_void_p``) to hand to
    generated programs; ``functions`` is the same table read through ctypes; ``Ctx`` is the
    ctypes mirror of ``disc_ral_ctx`` (one per call).
    """

    lib: ctypes.CDLL
    path: Path
    functions: RalTable
    table: int
    gemm_library: str
    outputs: OutputCache | None  # None for a RAL saved before it had one: outputs come from torch.empty
    Ctx = Ctx  # so callers holding a Ral need no second import

    def gemm(
        self, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None, *, alpha: float = 1.0, beta: float = 0.0
    ) -> torch.Tensor:
        """``out = alpha * a @ b + beta * out`` through the RAL (see `gemm_args`); returns ``out``."""
        args, out = gemm_args(a, b, out, alpha=alpha, beta=beta)
        self.call_gemm(args)
        return out

    def conv2d(
        self,
        x: torch.Tensor,
        w: torch.Tensor,
        stride: int | Sequence[int] = 1,
        padding: int | Sequence[int] = 0,
        dilation: int | Sequence[int] = 1,
        groups: int = 1,
        *,
        weight_is_constant: bool = False,
        channels_last: bool = False,
        bias: torch.Tensor | None = None,
        relu: bool = False,
    ) -> torch.Tensor:
        """``F.conv2d(x, w, bias)``, then ReLU with ``relu``, through the RAL; ``padding`` may be
        (top, bottom, left, right). With ``channels_last`` x and the result are NHWC."""
        x, w = x.contiguous(), w.contiguous()
        bias = bias.contiguous() if bias is not None else None
        args, out = conv2d_args(
            x, w, stride, padding, dilation, groups, weight_is_constant=weight_is_constant, channels_last=channels_last, bias=bias, relu=relu
        )
        self.call_conv2d(args)
        return out

    def conv2d_gradients(
        self,
        x: torch.Tensor,
        w: torch.Tensor,
        gy: torch.Tensor,
        stride: int | Sequence[int] = 1,
        padding: int | Sequence[int] = 0,
        dilation: int | Sequence[int] = 1,
        groups: int = 1,
        *,
        channels_last: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(dL/dx, dL/dw) of ``F.conv2d(x, w)`` for dL/dy = ``gy``, through the RAL's two gradient routines."""
        x, w, gy = x.contiguous(), w.contiguous(), gy.contiguous()
        args, y = conv2d_args(x, w, stride, padding, dilation, groups, channels_last=channels_last)
        if y.shape != gy.shape:
            raise ValueError(f"conv2d_gradients: gy has shape {tuple(gy.shape)}, the convolution's output {tuple(y.shape)}")
        gx, gw = torch.empty_like(x), torch.empty_like(w)
        args.output = gy.data_ptr() or None
        for name, target in (("conv2d_backward_data", "input"), ("conv2d_backward_weights", "weight")):
            args.input, args.weight = x.data_ptr() or None, w.data_ptr() or None
            setattr(args, target, (gx if target == "input" else gw).data_ptr() or None)
            ctx = Ctx()
            _raise_if_failed(getattr(self.functions, name)(ctypes.byref(ctx), ctypes.byref(args)), ctx, name)
        return gx, gw

    def hold_constants(self, pointers: ctypes.Array, n: int, held: bool) -> None:
        """A program holds (or lets go of) its ``n`` constant buffers: the RAL frees its packed
        copies of a buffer when no program holds it any more."""
        fn = getattr(self.lib, "disc_ral_cpu_hold_constants", None)
        if fn is None:  # a RAL saved before programs said so: its copies live as long as the process
            return
        fn.restype, fn.argtypes = None, [ctypes.c_void_p, _i64, _i32]
        fn(pointers, n, int(held))

    def forget_constants(self, tensors: Sequence[torch.Tensor]) -> None:
        """These tensors changed in place: drop the RAL's packed copies of them (the next GEMM or
        convolution on one packs it again)."""
        fn = getattr(self.lib, "disc_ral_cpu_forget_constants", None)
        if fn is None or not tensors:  # a RAL without packed copies
            return
        pointers = (ctypes.c_void_p * len(tensors))(*[t.data_ptr() for t in tensors])
        fn.restype, fn.argtypes = None, [ctypes.c_void_p, _i64]
        fn(pointers, len(tensors))

    def cache_entries(self) -> dict[str, int]:
        """Sizes of the RAL's caches (convolution plans, reordered constant weights, matmul plans, plans
        of GEMMs on packed weights), how many matmul plans were built so far (each miss builds one),
        the bytes of packed GEMM weights held (capped by DISC_RAL_PACKED_GEMM_MB if set), how many
        GEMMs ran on the RAL's own panel kernel and up to how many rows it takes (0: never), how
        many convolutions ran by Winograd's F(2x2, 3x3) and how many batches of tiny GEMMs the RAL
        summed itself (attention's per-head products at a few tokens)."""
        fn = self.lib.disc_ral_cpu_cache_entries
        fn.restype, fn.argtypes = _i64, [_i32]
        return {
            "conv_plans": fn(0),
            "packed_weights": fn(1),
            "matmul_plans": fn(2),
            "matmul_plans_built": fn(3),
            "packed_gemm_plans": fn(4),
            "packed_gemm_bytes": fn(5),
            "panel_gemm_calls": fn(6),
            "panel_gemm_rows": fn(7),
            "winograd_calls": fn(8),
            "tiny_gemm_calls": fn(9),
        }

    def set_packed_gemm_mb(self, mb: float) -> float:
        """Sets how many megabytes of packed constant GEMM weights this process may keep (0: none,
        ``math.inf``: no cap, the default) and returns the previous limit. Copies already made stay."""
        fn = self.lib.disc_ral_cpu_set_packed_gemm_mb
        fn.restype, fn.argtypes = ctypes.c_double, [ctypes.c_double]
        return fn(mb)

    def set_small_m_rows(self, rows: int) -> int:
        """Sets up to how many rows a GEMM on a packed constant weight takes the RAL's panel kernel
        (0: none, oneDNN runs them all) and returns the previous limit; without AVX-512 the kernel
        is never used whatever the limit."""
        fn = self.lib.disc_ral_cpu_set_small_m_rows
        fn.restype, fn.argtypes = _i64, [_i64]
        return fn(rows)

    def set_tiny_gemm(self, on: bool) -> bool:
        """Turns on or off the RAL's own loop for batches of tiny float32 GEMMs (each at most 2^18
        multiply-adds, B at most 8192 floats once its rows are padded to whole vectors; any
        strides); returns the previous setting. Off, the library runs them one by one. A RAL saved
        before it existed keeps the library."""
        fn = getattr(self.lib, "disc_ral_cpu_set_tiny_gemm", None)
        if fn is None:
            return False
        fn.restype, fn.argtypes = _i32, [_i32]
        return bool(fn(int(on)))

    def set_winograd(self, mode: int) -> int:
        """Sets when forward 3x3 convolutions of stride 1 on constant weights run by Winograd's
        F(2x2, 3x3): 0 never, 1 whenever they can (tests), 2 where it wins (the default); returns
        the previous setting. A RAL without it (no oneDNN, no AVX-512) keeps 0."""
        fn = getattr(self.lib, "disc_ral_cpu_set_winograd", None)
        if fn is None:
            return 0
        fn.restype, fn.argtypes = _i32, [_i32]
        return fn(mode)

    def conv_plan(self, args: Conv2dArgs) -> str | None:
        """How oneDNN runs the forward convolution ``args`` describes: "<kernel>; reorders: <operands
        reordered per call, or none>"; None for a RAL without oneDNN (or saved before it said)."""
        fn = getattr(self.lib, "disc_ral_cpu_conv_plan", None)
        if fn is None:
            return None
        fn.restype, fn.argtypes = _i32, [ctypes.c_void_p, ctypes.c_char_p, _i64]
        out = ctypes.create_string_buffer(256)
        return out.value.decode() if fn(ctypes.byref(args), out, len(out)) == 0 else None

    def call_gemm(self, args: GemmArgs) -> None:
        """Call the table's ``gemm`` with a fresh ctx; raise RuntimeFailure on failure."""
        ctx = Ctx()
        _raise_if_failed(self.functions.gemm(ctypes.byref(ctx), ctypes.byref(args)), ctx, "gemm")

    def call_conv2d(self, args: Conv2dArgs) -> None:
        """Call the table's ``conv2d`` with a fresh ctx; raise RuntimeFailure on failure."""
        ctx = Ctx()
        _raise_if_failed(self.functions.conv2d(ctypes.byref(ctx), ctypes.byref(args)), ctx, "conv2d")


_lock = threading.Lock()
_loaded: dict[str, Ral] = {}
_opened_lock = threading.Lock()  # not _lock: load_ral holds that while it opens
_opened: list[Ral] = []  # every RAL library opened (a saved program may carry its own); never unloaded


def load_ral(variant: Variant = "auto") -> Ral:
    """The process's RAL of that variant, built and loaded on first use (thread-safe)."""
    with _lock:
        resolved = resolve_variant(variant)
        ral = _loaded.get(resolved)
        if ral is None:
            ral = _loaded[resolved] = open_ral(build_ral(resolved).path)  # type: ignore[arg-type]
        return ral


def open_ral(path: Path) -> Ral:
    """Load a built RAL library (``load_ral``'s, or one a saved program carries)."""
    lib = ctypes.CDLL(str(path))
    entry = lib.disc_ral_cpu
    entry.restype = ctypes.POINTER(RalTable)
    entry.argtypes = []
    table_ptr = entry()
    table = table_ptr.contents
    if table.abi_version != ABI_VERSION:
        raise RuntimeFailure(f"disc RAL: {path} has ABI {table.abi_version}, expected {ABI_VERSION}")
    address = ctypes.cast(table_ptr, ctypes.c_void_p).value or 0
    outputs = OutputCache(lib) if hasattr(lib, "disc_ral_cpu_output_take") else None
    if outputs is not None:
        _output_caches.add(outputs)
    limit = os.environ.get("DISC_OUTPUT_CACHE_BLOCKS")
    if outputs is not None and limit:
        try:
            outputs.set_limit(int(limit))
        except ValueError:
            raise ValueError(f"DISC_OUTPUT_CACHE_BLOCKS must be a whole number of blocks, got {limit!r}") from None
    ral = Ral(lib, path, table, address, table.gemm_library.decode(), outputs)
    with _opened_lock:
        _opened.append(ral)
    return ral


def forget_packed_copies(tensors: Sequence[torch.Tensor]) -> None:
    """``tensors`` changed in place: every RAL opened in this process drops its packed copies of them."""
    cpu = [t for t in tensors if t.device.type == "cpu"]
    with _opened_lock:
        rals = list(_opened)
    for ral in rals:
        ral.forget_constants(cpu)


__all__ = ["ABI_VERSION", "Conv2dArgs", "Ctx", "GemmArgs", "OutputCache", "Ral", "RalTable", "build_ral", "conv2d_args", "forget_packed_copies", "gemm_args", "load_ral", "open_ral", "preload_dnnl", "release_cached_outputs"]
