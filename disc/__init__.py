"""disc: a dynamic-shape deep-learning compiler. Compile once, run at any shape.

Importing disc registers the torch.compile backend ``"disc"``.
"""

from disc.api import CompiledModule, CompileReport, clear_reports, compile, explain, reports
from disc.errors import CompileError, DiscError, InputError, ShapeError
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


def _register_backend() -> None:
    try:
        from disc.frontends.torch.dynamo import register

        register()
    except ImportError:  # torch without dynamo: disc.compile still works
        pass


_register_backend()
