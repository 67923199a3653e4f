"""disc: a dynamic-shape deep-learning compiler. Compile once, run at any shape.

Importing disc registers the torch.compile backend ``"disc"``. Where PyTorch is not installed,
the core (``disc.ir``, ``disc.shape``, the toolchain, the standalone runtime's build) still
imports; the PyTorch API (``disc.compile``, ``disc.load``...) then says what it needs.
"""

from disc.errors import CompileError, DiscError, InputError, ShapeError

try:
    import torch  # noqa: F401  (the PyTorch API below needs it anyway)

    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False
if HAVE_TORCH:
    from disc.api import CompiledModule, CompileReport, clear_reports, compile, explain, reports
    from disc.runtime.artifact import ArtifactError, load, save

__version__ = "0.1.0"

__all__ = [
    "ArtifactError",
    "CompileError",
    "CompileReport",
    "CompiledModule",
    "DiscError",
    "InputError",
    "ShapeError",
    "clear_reports",
    "compile",
    "explain",
    "load",
    "release_memory",
    "reports",
    "save",
]


def release_memory() -> int:
    """Give back the memory compiled CPU programs keep between calls (the calling thread's workspace,
    freed outputs held for reuse); returns the bytes freed. The next call allocates afresh."""
    from disc.runtime.native import release_memory as release  # imported on use: it loads the code generator

    return release()


def __getattr__(name: str) -> object:
    if name in __all__:  # only reached without torch
        raise ImportError(
            f"disc.{name} needs PyTorch, which is not installed here; to run a saved program without it use "
            "disc_runtime (Python, numpy only), disc-run or the C API (disc_runtime.h)"
        )
    raise AttributeError(f"module 'disc' has no attribute {name!r}")


def _register_backend() -> None:
    try:
        from disc.frontends.torch.dynamo import register

        register()
    except ImportError:  # torch without dynamo: disc.compile still works
        pass


if HAVE_TORCH:
    _register_backend()
