"""Building the RAL library, without torch: the CPU programs' library routines and the standalone runtime.

One library holds both: ``ral_cpu.cc`` (the ``disc_ral`` table generated programs call for GEMMs
and convolutions) and ``runtime.cc`` (``disc_runtime.h``: load a saved folder and run it from C).
`disc.runtime.ral` opens it for PyTorch hosts; the numpy-only ``disc_runtime`` package and C
programs use the runtime half. Importing this module needs only the toolchain.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Literal

from disc.codegen.cpu import toolchain
from disc.errors import CompileError

RAL_DIR = Path(__file__).resolve().parent / "ral"
SOURCES = ("ral_cpu.cc", "runtime.cc")  # one translation unit, in this order
Variant = Literal["auto", "dnnl", "builtin"]
ABI_VERSION = 5  # DISC_RAL_ABI_VERSION in ral.h: generated programs and the library must agree


def ral_source() -> str:
    """The library's C++ source: the RAL, then the standalone runtime built on it."""
    return "\n".join((RAL_DIR / name).read_text() for name in SOURCES)


def resolve_variant(variant: Variant) -> str:
    """"dnnl" or "builtin": which GEMM and convolution routines the library is built with."""
    if variant == "auto":
        return "dnnl" if toolchain.have_dnnl() else "builtin"
    if variant == "dnnl" and not toolchain.have_dnnl():
        raise CompileError("disc RAL: oneDNN was requested but is not available (oneDNN 3.x: `pip install onednn-cpu-gomp onednn-devel-cpu-gomp`, or set DISC_DNNL_ROOT to an install)")
    if variant not in ("dnnl", "builtin"):
        raise ValueError(f"unknown RAL variant {variant!r}")
    return variant


def build_ral(variant: Variant = "auto") -> toolchain.BuildResult:
    """Build (or fetch from the cache) the CPU RAL: "dnnl", "builtin" or "auto" (dnnl if available)."""
    use_dnnl = resolve_variant(variant) == "dnnl"
    flags, libs = toolchain.dnnl_build_args() if use_dnnl else ([], [])
    return toolchain.build(ral_source(), "ral_cpu" if use_dnnl else "ral_cpu_builtin", flags=flags, libs=libs)


def preload_dnnl() -> bool:
    """Load this environment's ``libdnnl.so.3``; True if there is one.

    A RAL built on another machine (a saved program's ``ral.so``) finds oneDNN through an rpath
    into that machine's Python environment. Once this environment's copy is loaded, the
    dynamic loader satisfies the dependency by its soname, wherever the rpath points.
    """
    root = toolchain.dnnl_root()
    lib = root / "lib" / "libdnnl.so.3" if root is not None else None
    if lib is None or not lib.is_file():
        return False
    ctypes.CDLL(str(lib))
    return True


def runtime_library(variant: Variant = "auto") -> Path:
    """The built library a C program links to run saved programs (``disc_runtime.h``)."""
    return build_ral(variant).path
