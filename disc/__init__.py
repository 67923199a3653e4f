"""disc: a dynamic-shape deep-learning compiler. Compile once, run at any shape.

The PyTorch API (``disc.compile``, ``disc.load``...) is imported on first use, or at once where
torch is already imported; either way the torch.compile backend ``"disc"`` is registered (it is
also an entry point, found by torch.compile itself). Without PyTorch the core (``disc.shape``, the
toolchain, the standalone runtime's build) still imports, and ``disc_runtime`` runs saved programs
with numpy alone; the PyTorch API then says what it needs.
"""

import importlib
import sys

from disc.errors import CaptureError, CompileError, DiscError, InputError, ShapeError

__version__ = "0.1.0"

# The PyTorch API, by the module that defines each name.
_TORCH_API = {
    "CompiledModule": "disc.compiled",
    "PerBranchModule": "disc.compiled",
    "CompileReport": "disc.report",
    "clear_reports": "disc.report",
    "compile": "disc.api",
    "explain": "disc.api",
    "reports": "disc.report",
    "ArtifactError": "disc.runtime.artifact",
    "load": "disc.api",
    "save": "disc.api",
}

__all__ = ["CaptureError", "CompileError", "DiscError", "InputError", "ShapeError", "release_memory", *_TORCH_API]


def __getattr__(name: str) -> object:
    module = _TORCH_API.get(name)
    if module is None:
        raise AttributeError(f"module 'disc' has no attribute {name!r}")
    try:
        import torch  # noqa: F401
    except ImportError:
        raise ImportError(
            f"disc.{name} needs PyTorch, which is not installed here; to run a saved program without it use "
            "disc_runtime (Python, numpy only), disc-run or the C API (disc_runtime.h)"
        ) from None
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    _register_backend()
    return value


def release_memory() -> int:
    """Give back the memory compiled CPU programs keep between calls (the calling thread's workspace,
    freed outputs held for reuse); returns the bytes freed. The next call allocates afresh."""
    from disc.runtime.native import release_memory as release  # imported on use: it loads the code generator

    return release()


_registered = False


def _register_backend() -> None:
    global _registered
    if _registered:
        return
    _registered = True
    try:
        from disc.frontends.torch.dynamo import register

        register()
    except ImportError:  # torch without dynamo: disc.compile still works
        pass


if sys.modules.get("torch") is not None:  # a PyTorch program: the API and the backend at once, as it expects
    for _name in _TORCH_API:
        __getattr__(_name)
