"""Noticing that a TensorFlow variable changed after its function was compiled.

``disc.tf`` freezes a function's variables into the program's constants (and the RAL packs the
GEMM weights among them), so a variable assigned afterwards (``model.set_weights``,
``load_weights``, ``fit``, an ``assign`` in eager or inside another tf.function) would leave the
program computing with its old values. TensorFlow variables have no version counter, but their
writes copy on write: a variable whose buffer is shared with another tensor gets a new buffer
when it is assigned or updated. The watch therefore holds one read of every variable (sharing
its buffer), and at each call asks where each variable's buffer is now: one that moved was
written.

Asking goes around TensorFlow's dispatch (50-500 us for even one op between the program's calls):
``variable_buffers.cc``, built against the installed TensorFlow once and cached like any compiled
kernel, has an op that looks the variables up once and keeps them, and a C function (called
through ctypes) that reads their current buffers: a few microseconds a call. Where that library
cannot be built the watch reads every variable through one concrete function and takes each
read's address (~3 ms a call for ResNet50's 320 variables, measured between calls of its program). A variable in TensorFlow's copy-on-read mode
(after a sparse access: ``ResourceGather``, a scatter update) copies at every read and is written
in place, so its buffer says nothing; those are compared by value, which reads them whole.
Holding the reads costs nothing until a variable is written; then its old buffer stays alive
(one copy of what was written) until the next call compiles again and lets it go.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import platform
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger("disc")

COPIES = -1  # DiscVariableBuffers' address of a variable in copy-on-read mode


@functools.cache
def buffers_library() -> tuple[Any, Any] | None:
    """The watch's library (``variable_buffers.cc``) as TensorFlow loaded it (the op
    ``disc_watch_variables``) and through ctypes (``disc_variable_buffers``), or None where it
    cannot be built."""
    import tensorflow as tf

    from disc.codegen.cpu import toolchain
    from disc.errors import CompileError

    source = (Path(__file__).parent / "variable_buffers.cc").read_text()
    # The version is in the flags so that the cached library is rebuilt for another TensorFlow.
    flags = [*tf.sysconfig.get_compile_flags(), f"-DDISC_TF_VERSION={tf.__version__}"]
    if platform.machine() in ("x86_64", "AMD64"):
        flags.append("-march=x86-64-v2")  # Eigen's headers in TensorFlow's wheel do not compile for every -march=native (AVX512-FP16)
    try:
        built = toolchain.build(source, "tf_variable_buffers", flags=flags, libs=tf.sysconfig.get_link_flags())
        ops = tf.load_op_library(str(built.path))
        c = ctypes.CDLL(str(built.path))  # the same loaded library: its watches are the op's
    except (CompileError, OSError, tf.errors.OpError) as e:
        logger.warning("disc: the library that locates TensorFlow variable buffers could not be built (%s); the variable watch reads every variable instead", str(e).splitlines()[0] if str(e) else type(e).__name__)
        return None
    c.disc_variable_buffers.argtypes = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64]
    c.disc_variable_buffers.restype = ctypes.c_int
    c.disc_variable_release.argtypes = [ctypes.c_int64]
    c.disc_variable_release.restype = None
    return ops, c


def _address(t: Any) -> int:
    # EagerTensor._numpy() is a view of the tensor's own buffer on the CPU (numpy() would copy it).
    return int(t._numpy().ctypes.data)


class VariableWatch:
    """The variables a program froze, and what each held when it was compiled."""

    def __init__(self, variables: Sequence[Any]) -> None:
        import tensorflow as tf

        self.variables = list(variables)
        self.names = [getattr(v, "name", f"variable {i}") for i, v in enumerate(self.variables)]
        if not self.variables:
            return
        read = tf.function(lambda: [v.read_value() for v in self.variables]).get_concrete_function()
        self.held = read()  # shares each variable's buffer (but in copy-on-read mode): a write moves it
        self._locate = self._op_locator() or self._read_locator(read)
        self.addresses = self._locate()
        self.by_value = {int(i): self.held[i]._numpy() for i in np.flatnonzero(self.addresses == COPIES)}

    def _read_locator(self, read: Any) -> Callable[[], np.ndarray]:
        """The addresses of a read of every variable (through ``read``, one concrete function)."""

        def addresses() -> np.ndarray:
            return np.array([_address(t) for t in read()], np.int64)

        copies = addresses() != addresses()  # a read that copies: a fresh address each time, so no address

        def locate() -> np.ndarray:
            now = addresses()
            now[copies] = COPIES
            return now

        return locate

    def _op_locator(self) -> Callable[[], np.ndarray] | None:
        """The addresses through the watch library, or None (not built; variables on a device
        it has no kernel for)."""
        import tensorflow as tf

        library = buffers_library()
        if library is None:
            return None
        ops, c = library
        try:
            watch = int(ops.disc_watch_variables(tf.stack([v.handle for v in self.variables])))
        except (tf.errors.OpError, TypeError, ValueError) as e:
            logger.info("disc: variable buffers not located by the library (%s); reading the variables instead", type(e).__name__)
            return None
        weakref.finalize(self, c.disc_variable_release, watch)
        n = len(self.variables)

        def locate() -> np.ndarray:
            out = np.empty(n, np.int64)
            if c.disc_variable_buffers(watch, out.ctypes.data, n) != 0:
                raise RuntimeError(f"disc: variable watch {watch} is gone")  # (released only with this object)
            return out

        return locate

    def changed(self) -> list[str]:
        """Names of the variables written since the watch began (usually empty)."""
        if not self.variables:
            return []
        now = self._locate()
        if not self.by_value and np.array_equal(now, self.addresses):
            return []
        out = [self.names[i] for i in np.flatnonzero(now != self.addresses)]
        for i, old in self.by_value.items():
            if now[i] != COPIES:
                continue  # (it left copy-on-read mode: reported above)
            value = self.variables[i].read_value()._numpy()
            if value.shape != old.shape or not np.array_equal(value, old):
                out.append(self.names[i])
        return out
