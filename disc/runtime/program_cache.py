"""The program cache: ``disc.compile`` of a model this machine compiled before loads the program.

Capturing the model with ``torch.export`` is most of a compilation (about 3 of the 4.5 s
of BERT-base on a 2-core machine), and the compile cache of the C++ libraries does not
help with it: a second process compiling the same model would export it again. So
``disc.compile`` first computes a key of everything its result depends on and, where a
program was stored under that key, loads it as ``disc.load`` does (parse the IR, lower it,
reuse the built library), binding the model's own parameters instead of copies.

The key covers (``program_key``):
  - disc's own source (every ``.py``, ``.cc`` and ``.h`` of the package), torch's and
    Python's versions, the ``DISC_*`` environment variables that change code generation,
    grad mode and the default dtype;
  - the model's code: the source files of every class of every submodule (and their bases,
    torch's excluded since torch's version is in the key) and of every module imported from
    outside the standard library and site-packages (the user's own files);
  - its state: each submodule's class, training flag and plain attributes (numbers,
    strings, dtypes, containers of them, dataclasses and other objects whose state is their
    ``__dict__``, functions by name and source file), and every
    parameter and buffer: name, dtype, shape, strides and the SHA-256 of its bytes;
  - the call: the example inputs' dtypes, shapes and strides (not their values: torch.export
    refuses a branch on a value rather than specialising on it), ``dynamic``,
    ``constraints`` and ``backend``.

The weights' bytes are in the key because passes read constant values (CSE merges equal
parameters, simplification folds by value): a program compiled for other weights is never
loaded. A model the key cannot describe (a hook, a tensor subclass, an attribute of an
unknown type) is compiled as usual and the report says why it was not cached. Not
noticed: code in an installed package that is reached from ``forward`` other than through
the model's classes, edited in place without a version change. ``DISC_PROGRAM_CACHE=0`` or
``disc.compile(..., cache=False)`` turns the cache off.

An entry is a saved program (``runtime/artifact.py``) whose parameters stay in the model.
An entry that cannot be loaded (damaged, or written by another disc) is removed and the
model compiled again; the report says so.
"""

from __future__ import annotations

import builtins
import dataclasses
import enum
import functools
import hashlib
import inspect
import itertools
import linecache
import logging
import os
import shutil
import sys
import sysconfig
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

logger = logging.getLogger("disc")

# Environment variables that change what is compiled or how it runs are part of the key; these do not.
_ENV_NOT_KEYED = frozenset({"DISC_CACHE_DIR", "DISC_PROGRAM_CACHE", "DISC_VERIFY"})
# The attributes every nn.Module has: its parameters, buffers, submodules and hooks, handled apart.
_MODULE_INTERNALS = frozenset(vars(nn.Module()))
_HOOKS = tuple(k for k in _MODULE_INTERNALS if k.endswith("hooks") and ("forward" in k or "backward" in k))


@dataclass
class _KeyContext:
    files: set[str]  # source files of the classes and functions met so far
    modules: dict[int, str]  # the model's submodules, by id: their name in the model


class Uncacheable(Exception):
    """What the key cannot describe (the message says which submodule and attribute)."""


@dataclass
class ProgramKey:
    digest: str
    state: dict[str, torch.Tensor]  # the model's parameters and buffers, by state-dict name
    digests: dict[str, str] = field(default_factory=dict)  # state-dict name -> SHA-256 of the tensor (computed for the key)

    @property
    def folder(self) -> Path:
        return programs_dir() / self.digest[:32]


def programs_dir() -> Path:
    """Where entries live: ``programs/`` in the compile cache (``$DISC_CACHE_DIR``)."""
    from disc.codegen.cpu.toolchain import cache_dir

    return cache_dir() / "programs"


def enabled(cache: bool | None) -> bool:
    if cache is not None:
        return cache
    return os.environ.get("DISC_PROGRAM_CACHE", "1").strip() not in ("0", "false", "no", "off")


def program_key(model: nn.Module, args: Sequence[Any], options: Mapping[str, Any]) -> ProgramKey:
    """The key of compiling ``model`` at ``args`` with ``options``; raises ``Uncacheable``."""
    h = hashlib.sha256()

    def feed(*parts: Any) -> None:
        for p in parts:
            h.update(repr(p).encode())
            h.update(b"\0")

    feed("disc-program/1", _disc_source_digest(), torch.__version__, sys.version)
    feed(sorted((k, v) for k, v in os.environ.items() if k.startswith("DISC_") and k not in _ENV_NOT_KEYED))
    feed(torch.is_grad_enabled(), torch.get_default_dtype())
    ctx = _KeyContext(set(), {id(m): name for name, m in model.named_modules()})
    files = ctx.files
    for name, m in model.named_modules(remove_duplicate=False):
        feed("module", name, _qualname(type(m)), m.training)
        files.update(_class_files(type(m)))
        for hook in _HOOKS:
            if getattr(m, hook, None):
                raise Uncacheable(f"submodule {name or '(root)'!r} has {hook.strip('_').replace('_', ' ')}")
        for attr, value in sorted(vars(m).items()):
            if attr not in _MODULE_INTERNALS:
                feed(attr, _encode(value, f"{name or '(root)'}.{attr}", ctx, 0))
    if nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks:
        raise Uncacheable("a global module forward hook is registered")
    files.update(_user_files())
    feed("files", [(f, _file_digest(f)) for f in sorted(files)])
    state = dict(itertools.chain(model.named_parameters(remove_duplicate=False), model.named_buffers(remove_duplicate=False)))
    for i, a in enumerate(args):  # their types, not their values: a capture never depends on those
        if not isinstance(a, torch.Tensor):
            raise Uncacheable(f"input {i} is a {type(a).__name__}, not a tensor")
        feed("input", i, a.dtype, tuple(a.shape), tuple(a.stride()), a.device.type, a.requires_grad, type(a).__name__)
    tensors = [(f"state {k}", v) for k, v in state.items()]
    digests = _tensor_digests(tensors)
    for (what, _), digest in zip(tensors, digests):
        feed(what, digest)
    for k in sorted(options):
        feed(k, _encode(options[k], k, ctx, 0))
    return ProgramKey(h.hexdigest(), state, dict(zip(state, digests)))


def lookup(key: ProgramKey, load: Callable[..., Any]) -> tuple[Any, str]:
    """(the stored program or None, what happened, for the report); ``load`` is ``disc.load``."""

    folder = key.folder
    if not (folder / "manifest.json").is_file():
        return None, "miss"
    try:
        compiled = load(folder, external=key.state, external_digests=key.digests)
    except Exception as e:  # a damaged entry, or one another disc wrote: never used, compiled again
        logger.warning("disc: program cache entry %s cannot be loaded (%s); compiling again", folder, e)
        shutil.rmtree(folder, ignore_errors=True)
        return None, f"miss: the entry could not be loaded ({e}) and was replaced"
    compiled.report.source = "disc.compile"
    return compiled, f"hit: loaded {folder} (no torch.export, no passes)"


def store(key: ProgramKey, compiled: Any) -> str:
    """Store ``compiled`` under ``key``, its parameters named by the model; what happened."""
    from disc.runtime.artifact import save

    owners = {_tensor_identity(t): name for name, t in key.state.items()}
    external = {ref: owners[_tensor_identity(t)] for ref, t in compiled.graph.constants.items() if _tensor_identity(t) in owners}
    try:
        save(compiled, key.folder, external=external, external_digests={owner: key.digests[owner] for owner in external.values() if owner in key.digests})
    except Exception as e:  # e.g. an output structure or a fallback the artifact format cannot write
        logger.info("disc: not stored in the program cache: %s", e)
        return f"not stored: {e}"
    return f"stored as {key.folder}"


def _tensor_identity(t: torch.Tensor) -> tuple:
    return (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)


def _tensor_digests(tensors: list[tuple[str, Any]]) -> list[str]:
    """SHA-256 of each tensor's bytes (with its dtype, shape and strides), two threads at a time:
    hashlib releases the GIL, and BERT-base's 440 MB of weights take ~0.15 s rather than 0.3."""

    def one(item: tuple[str, Any]) -> str:
        what, t = item
        if not isinstance(t, torch.Tensor):
            raise Uncacheable(f"{what} is a {type(t).__name__}, not a tensor")
        if type(t) not in (torch.Tensor, nn.Parameter) or t.is_sparse or t.is_quantized or t.device.type == "meta":
            raise Uncacheable(f"{what} is a {type(t).__name__} ({t.layout}, {t.device}), which the key cannot read")
        c = t.detach().contiguous().cpu()
        h = hashlib.sha256(repr((c.dtype, tuple(t.shape), tuple(t.stride()), t.device.type, t.requires_grad)).encode())
        if c.numel():
            h.update(memoryview(c.reshape(-1).view(torch.uint8).numpy()))
        return h.hexdigest()

    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(one, tensors))


def _encode(value: Any, where: str, ctx: _KeyContext, depth: int) -> Any:
    """A plain, comparable form of a module attribute (or a compile option); ``ctx.files`` collects
    the source files of functions and classes it names."""
    if depth > 8:
        raise Uncacheable(f"{where} nests too deeply to be keyed")
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        return (type(value).__name__, value)
    if isinstance(value, (torch.dtype, torch.device, torch.memory_format, torch.layout, enum.Enum)):
        return repr(value)
    if isinstance(value, (tuple, list, set, frozenset)):
        items = [_encode(v, f"{where}[]", ctx, depth + 1) for v in value]
        return (type(value).__name__, sorted(items, key=repr) if isinstance(value, (set, frozenset)) else items)
    if isinstance(value, Mapping):
        return ("mapping", sorted(((repr(k), _encode(v, f"{where}[{k!r}]", ctx, depth + 1)) for k, v in value.items()), key=repr))
    if isinstance(value, torch.Tensor):
        return ("tensor", _tensor_digests([(where, value)])[0])
    if isinstance(value, nn.Module):
        if id(value) not in ctx.modules:
            raise Uncacheable(f"{where} holds a module that is not a registered submodule")
        return ("submodule", ctx.modules[id(value)])  # its own state is keyed where the walk meets it
    if isinstance(value, (types.FunctionType, types.BuiltinFunctionType, type)):
        ctx.files.update(_class_files(value) if isinstance(value, type) else _function_files(value))
        return ("callable", _qualname(value))
    if isinstance(value, functools.partial):
        return ("partial", _encode(value.func, where, ctx, depth + 1), _encode(value.args, where, ctx, depth + 1), _encode(value.keywords, where, ctx, depth + 1))
    if isinstance(value, types.MethodType):
        return ("method", _encode(value.__func__, where, ctx, depth + 1), _encode(value.__self__, f"{where}.__self__", ctx, depth + 1))
    if dataclasses.is_dataclass(value):
        ctx.files.update(_class_files(type(value)))
        return (_qualname(type(value)), [(f.name, _encode(getattr(value, f.name), f"{where}.{f.name}", ctx, depth + 1)) for f in dataclasses.fields(value)])
    if _plain_object(value):  # a configuration object: its class's code and its attributes decide what it does
        ctx.files.update(_class_files(type(value)))
        return (_qualname(type(value)), [(k, _encode(v, f"{where}.{k}", ctx, depth + 1)) for k, v in sorted(vars(value).items())])
    raise Uncacheable(f"{where} is a {_qualname(type(value))}, which the key cannot describe")


def _plain_object(value: Any) -> bool:
    """An instance of a Python class (not torch's, not a builtin) that keeps its state in ``__dict__`` alone."""
    cls = type(value)
    if cls.__module__.split(".")[0] in ("torch", "builtins") or not hasattr(value, "__dict__"):
        return False
    return not any("__slots__" in vars(base) for base in cls.__mro__ if base is not object)


def _qualname(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__name__)}"


def _class_files(cls: type) -> Iterator[str]:
    for base in cls.__mro__:
        if base.__module__.split(".")[0] == "torch" or getattr(builtins, base.__name__, None) is base:
            continue  # (a class exec'd without a __name__ also reports the module "builtins")
        f = _source_file(base)
        if f:
            yield f


def _function_files(fn: Any) -> Iterator[str]:
    if (getattr(fn, "__module__", None) or "").split(".")[0] == "torch":
        return
    f = _source_file(fn)
    if f:
        yield f


def _source_file(obj: Any) -> str | None:
    """The file that defines ``obj``'s code, or a stand-in for it (see ``_file_digest``)."""
    found = [_code_file(c.co_filename, obj) for c in _code_objects(obj)]
    if found:
        return found[0] if len(set(found)) == 1 else _SOURCE_TEXT + hashlib.sha256(repr(sorted(set(found))).encode()).hexdigest()
    try:
        f = inspect.getsourcefile(obj)
    except (TypeError, OSError):
        f = None
    if f and os.path.isfile(f):
        return f
    module_file = getattr(sys.modules.get(getattr(obj, "__module__", None) or ""), "__file__", None)
    if module_file and os.path.isfile(module_file) and not module_file.endswith(".py"):
        return module_file  # a compiled extension: its binary is its code
    return None


def _code_objects(obj: Any) -> list[types.CodeType]:
    """The code of a function, or of the functions a class defines (its methods, properties...)."""
    if isinstance(obj, types.FunctionType):
        return [obj.__code__]
    out = []
    for v in vars(obj).values() if isinstance(obj, type) else ():
        for f in (getattr(v, "__func__", v), getattr(v, "fget", None), getattr(v, "fset", None)):
            if isinstance(f, types.FunctionType):
                out.append(f.__code__)
    return out


def _code_file(filename: str, obj: Any) -> str:
    """Where code compiled from ``filename`` is keyed: the file, or for code no file holds (python
    -c, exec, a notebook cell) its text where linecache has it. Code with neither cannot be keyed:
    two such classes of one name would share a key, and the second would load the first's program."""
    if os.path.isfile(filename):
        return filename
    lines = linecache.getlines(filename)
    if not lines:
        raise Uncacheable(f"{_qualname(obj)} has no source file or text to key its code by")
    return _SOURCE_TEXT + hashlib.sha256("".join(lines).encode()).hexdigest()


@functools.cache
def _library_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    return tuple(sorted(os.path.realpath(r) + os.sep for r in roots))


def _user_files() -> set[str]:
    """Source files of imported modules outside the standard library and site-packages (disc's own are keyed apart)."""
    disc_root = os.path.realpath(Path(__file__).resolve().parents[1]) + os.sep
    out = set()
    for module in list(sys.modules.values()):
        f = getattr(module, "__file__", None)
        if not f or not f.endswith(".py"):
            continue
        real = os.path.realpath(f)
        if real.startswith(disc_root) or real.startswith(_library_roots()):
            continue
        if os.path.isfile(real):
            out.add(real)
    return out


_SOURCE_TEXT = "source text sha256 "  # a ctx.files entry that is a digest of code text, not a path


def _file_digest(path: str) -> str:
    if path.startswith(_SOURCE_TEXT):
        return path.removeprefix(_SOURCE_TEXT)
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError as e:
        raise Uncacheable(f"cannot read {path} ({e.strerror})") from e


@functools.cache
def _disc_source_digest() -> str:
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".cc", ".h") and p.is_file()):
        h.update(str(f.relative_to(root)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()
