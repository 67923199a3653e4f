"""Builds generated C++ into shared libraries, with a content-addressed on-disk cache.

Every CPU artifact of disc (the RAL, generated kernels) goes through `build`. The cache key
hashes everything that changes the produced bytes: the source, flags, link arguments, include
dirs, the RAL header, the compiler's ``--version`` and the host CPU (``-march=native``), plus
`CACHE_FORMAT`. An entry is a folder ``<cache>/<key[:32]>/`` holding ``<name>.cc`` (the readable
source), ``<name>.so`` and ``<name>.so.json`` (sha256 and size of the .so bytes).

Files are written to temporaries in the same folder and moved into place with `os.replace`,
so a concurrent process sees either no entry or a complete one; a hit is trusted only when the
sidecar's hash matches the .so and the .so is a shared ELF for this machine. Anything else is
treated as a miss and rebuilt over the old entry (the path is replaced atomically, never left
missing, so a process loading it concurrently gets either the old or the new complete file).
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from disc.errors import CompileError

# Bump when the layout of an entry or the base flags change: old entries are then ignored.
CACHE_FORMAT = "disc-cpu-cache-1"
# 512-bit vectors where the CPU has them: GCC's default on AVX-512 hosts is 256-bit, and a row
# reduction is bound by its one accumulator's add latency (LayerNorm 8192x768: 1.42 -> 1.16 ms).
# Unrolling with variable expansion gives a vectorised reduction several accumulators, so its
# adds no longer wait on each other (LayerNorm 8192x768 kernel: 1.21-1.39 -> 0.98-1.02 ms,
# softmax 8192x384: 1.08 -> 0.99 ms); the program's compile time did not change measurably.
BASE_FLAGS = (
    "-O3",
    "-march=native",
    "-mprefer-vector-width=512",
    "-funroll-loops",
    "-fvariable-expansion-in-unroller",
    "-fPIC",
    "-shared",
    "-fopenmp",
    "-std=c++17",
)
RAL_INCLUDE_DIR = Path(__file__).resolve().parents[2] / "runtime" / "ral"
RAL_HEADERS = ("ral.h", "ral_half.h", "disc_runtime.h")
DNNL_HEADER = Path("/usr/include/oneapi/dnnl/dnnl.h")
# Compiles faster than this stay silent; slower ones announce themselves and their time.
SLOW_COMPILE_S = 1.0
# Keep the start of the compiler's stderr: the first errors are the useful ones.
MAX_STDERR_CHARS = 4000
# A line of its own in a source: what precedes the first one is common to every translation unit,
# each section after one may be compiled as a unit of its own (in parallel, then linked).
UNIT_MARKER = "// disc: translation unit"
MAX_UNITS = 8
# Smaller sources build as one unit: each unit parses the standard headers again (~0.35 s) and
# a test suite building many small programs side by side has no idle core to give them.
MIN_SPLIT_CHARS = 32_000
# Set to 0 to parse a source's standard headers every time instead of loading them precompiled.
PCH_ENV = "DISC_PCH"

logger = logging.getLogger("disc")


@dataclass(frozen=True)
class BuildResult:
    """What `build` produced: ``cached`` is True when the entry was served without compiling."""

    path: Path
    source_path: Path
    cached: bool
    key: str


def find_compiler() -> str:
    """The C++ compiler: ``$CXX`` if set, else ``g++`` or ``c++`` from PATH."""
    env = os.environ.get("CXX", "").strip()
    if env:
        found = shutil.which(env)
        if found is None:
            raise CompileError(f"disc: $CXX is {env!r}, which is not an executable on PATH")
        return found
    for candidate in ("g++", "c++"):
        found = shutil.which(candidate)
        if found is not None:
            return found
    raise CompileError("disc: no C++ compiler found (set $CXX or install g++, e.g. `apt-get install g++`)")


def cache_dir() -> Path:
    """``$DISC_CACHE_DIR``, else ``~/.cache/disc``; refused if another user could plant files in it."""
    env = os.environ.get("DISC_CACHE_DIR", "").strip()
    root = Path(env) if env else Path.home() / ".cache" / "disc"
    _check_private(root)
    return root


_private: set[Path] = set()


def _check_private(root: Path) -> None:
    """A cache holds shared libraries this process loads: a directory owned by another user, or
    writable by everyone, could serve a planted library whose constructors run at load (checked
    once per directory per process). Group-writable is allowed: with a user-private group (umask
    002) that is every directory the user makes."""
    if root in _private or not root.exists():
        return
    st = root.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o002:
        who = f"owned by uid {st.st_uid}" if st.st_uid != os.getuid() else "writable by every user"
        raise CompileError(
            f"disc's cache {root} is {who}: a library planted there would run in this process. "
            "Set DISC_CACHE_DIR to a directory only you can write (or fix its owner and mode)."
        )
    _private.add(root)


def dnnl_root() -> Path | None:
    """Where oneDNN is installed, if not in the system's default paths.

    ``$DISC_DNNL_ROOT`` first, then this Python environment: the pip packages
    ``onednn-cpu-gomp`` and ``onednn-devel-cpu-gomp`` put ``lib/`` and ``include/`` under
    ``sys.prefix``. None: use the compiler's default paths (a system ``libdnnl-dev``).
    """
    env = os.environ.get("DISC_DNNL_ROOT", "").strip()
    for root in (Path(env) if env else None, Path(sys.prefix)):
        if root is not None and (root / "include" / "oneapi" / "dnnl" / "dnnl.h").is_file():
            return root
    return None


def dnnl_build_args() -> tuple[list[str], list[str]]:
    """(compile flags, link arguments) that build against oneDNN; meaningful when `have_dnnl()`."""
    root = dnnl_root()
    if root is None:
        return ["-DDISC_HAVE_DNNL=1"], ["-ldnnl"]
    lib = root / "lib"
    return [f"-I{root / 'include'}", "-DDISC_HAVE_DNNL=1"], [f"-L{lib}", f"-Wl,-rpath,{lib}", "-ldnnl"]


def have_dnnl() -> bool:
    """True when oneDNN's headers are present and a program using it links.

    ``DISC_NO_DNNL=1`` forces False (tests and users can select the builtin fallbacks).
    """
    if os.environ.get("DISC_NO_DNNL", "") not in ("", "0"):
        return False
    if dnnl_root() is None and not DNNL_HEADER.is_file():
        return False
    return _dnnl_links(str(dnnl_root() or ""))


@functools.lru_cache(maxsize=None)
def _dnnl_links(root: str) -> bool:
    # A tiny link probe, cached per process (and on disk through `build`): headers without the
    # library (or a broken install) must select the fallback rather than fail the RAL build.
    flags, libs = dnnl_build_args()
    # The RAL uses the v3 API: an older install (Debian 12's libdnnl-dev is 2.6) fails the probe.
    probe = (
        '#include "oneapi/dnnl/dnnl.h"\n'
        '#if DNNL_VERSION_MAJOR < 3\n#error "oneDNN 3.x needed"\n#endif\n'
        'extern "C" int disc_probe() { return dnnl_version()->major; }\n'
    )
    try:
        build(probe, "dnnl_probe", flags=flags, libs=libs)
    except CompileError:
        return False
    return True


@functools.lru_cache(maxsize=None)
def _compiler_identity(compiler: str) -> str:
    proc = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=False)
    return proc.stdout + proc.stderr


@functools.lru_cache(maxsize=1)
def _host_identity() -> str:
    # -march=native makes the bytes depend on the CPU; a cache shared between machines (an NFS
    # home) must not hand one machine's library to another.
    cpu = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("model name", "flags")):
                    cpu += line
                if line.strip() == "":
                    break
    except OSError:
        pass
    return f"{platform.machine()}\n{cpu}"


def cpu_model() -> str:
    """The CPU's model name (for reports beside measurements)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cache_key(compiler: str, source: str, flags: Sequence[str], libs: Sequence[str], include_dirs: Sequence[str]) -> str:
    h = hashlib.sha256()
    # The RAL's headers, which every program and the RAL include, change what they compile to.
    header = b"".join((RAL_INCLUDE_DIR / h).read_bytes() for h in RAL_HEADERS if (RAL_INCLUDE_DIR / h).is_file())
    parts = [CACHE_FORMAT, source, "\0".join(BASE_FLAGS), "\0".join(flags), "\0".join(libs), "\0".join(include_dirs)]
    parts += [_compiler_identity(compiler), _host_identity()]
    for part in parts:
        data = part.encode()
        h.update(len(data).to_bytes(8, "little") + data)
    h.update(header)
    return h.hexdigest()


def _is_shared_elf(data: bytes) -> bool:
    """A 64-bit little-endian ELF shared object for this machine (the ELF header, not a dlopen)."""
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return False
    e_type = int.from_bytes(data[16:18], "little")
    e_machine = int.from_bytes(data[18:20], "little")
    machines = {"x86_64": 62, "aarch64": 183, "ppc64le": 21, "riscv64": 243}
    expected = machines.get(platform.machine())
    return e_type == 3 and (expected is None or e_machine == expected)


def _valid_entry(so: Path, sidecar: Path) -> bool:
    try:
        meta = json.loads(sidecar.read_text())
        data = so.read_bytes()
    except (OSError, ValueError):
        return False
    if not isinstance(meta, dict) or meta.get("format") != CACHE_FORMAT:
        return False
    return meta.get("sha256") == hashlib.sha256(data).hexdigest() and meta.get("bytes") == len(data) and _is_shared_elf(data)


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _safe_name(name: str) -> str:
    cleaned = "".join(c if c.isalnum() or c in "_-." else "_" for c in name).strip(".")
    return cleaned or "module"


def leading_system_includes(source: str) -> str:
    """The ``#include <...>`` lines that open ``source`` (after its first comments), one per line.

    These are what every program parses before its own code; `precompiled_prelude` builds them
    once into a precompiled header.
    """
    found = []
    for line in source.splitlines():
        text = line.strip()
        if text.startswith("#include <"):
            found.append(text)
        elif text and not text.startswith("//"):
            break
    return "\n".join(found)


def _is_gcc(compiler: str) -> bool:
    # The `-include x.h` -> x.h.gch lookup used below is GCC's; other compilers parse as before.
    ident = _compiler_identity(compiler)
    return "Free Software Foundation" in ident and "clang" not in ident.lower()


def precompiled_prelude(compiler: str, flags: Sequence[str], includes: str) -> Path | None:
    """A header of ``includes`` with its GCC precompiled form (``.gch``) beside it, built if missing.

    Compiling with ``-include <header>`` then loads the standard headers' parsed state (~30 MB)
    instead of parsing them (~0.35 s per translation unit). ``flags`` must be the compile flags of
    the units that use it: GCC refuses a precompiled header built with other code-generation
    options and then parses the header text instead, so a mismatch costs time, never correctness.
    The entry is keyed like a library (flags, includes, compiler, CPU). Returns None when disabled
    (``DISC_PCH=0``), not GCC, nothing to precompile, or the build failed.
    """
    if not includes or os.environ.get(PCH_ENV, "1") == "0" or not _is_gcc(compiler):
        return None
    key = _cache_key(compiler, "precompiled prelude\n" + includes, flags, (), ())
    entry = cache_dir() / f"pch-{key[:32]}"
    header, pch, size = entry / "prelude.h", entry / "prelude.h.gch", entry / "prelude.h.gch.size"
    try:  # the key covers the includes; only a .gch cut short (a crash while writing it) is checked
        if header.is_file() and pch.stat().st_size == int(size.read_text()):
            return header
    except (OSError, ValueError):
        pass  # missing or cut short (a crash while writing it): rebuilt below
    entry.mkdir(parents=True, exist_ok=True)
    _write_atomic(header, (includes + "\n").encode())
    fd, tmp = tempfile.mkstemp(dir=entry, prefix=".prelude.", suffix=".gch.tmp")
    os.close(fd)
    try:
        proc = subprocess.run([compiler, *flags, "-x", "c++-header", str(header), "-o", tmp], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            logger.debug("disc: precompiling the standard headers failed; parsing them instead:\n%s", proc.stderr[:MAX_STDERR_CHARS])
            return None
        _write_atomic(size, str(Path(tmp).stat().st_size).encode())
        os.replace(tmp, pch)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return header


def _code_flags(flags: Sequence[str]) -> list[str]:
    """The flags a translation unit is compiled with (the base flags but ``-shared``, then ``flags``)."""
    return [*(f for f in BASE_FLAGS if f != "-shared"), *flags]


def warm_prelude(source: str, flags: Sequence[str] = ()) -> Path | None:
    """Build now the precompiled header that `build` would use for ``source`` with ``flags``."""
    return precompiled_prelude(find_compiler(), _code_flags(flags), leading_system_includes(source))


def _drop_prelude(header: Path) -> None:
    """Withdraw a precompiled header a compile failed with (it is rebuilt on the next build)."""
    Path(str(header) + ".gch").unlink(missing_ok=True)


def _compile(cmds: list[list[str]], name: str, lines: int, report: Callable[[str], None]) -> list[subprocess.CompletedProcess]:
    """Run the compiler commands at once; announce them (and their time) if they are slow."""
    start = time.perf_counter()
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for cmd in cmds]
    results, announced = [], False
    for cmd, proc in zip(cmds, procs):
        try:
            left = SLOW_COMPILE_S - (time.perf_counter() - start)
            out, err = proc.communicate(timeout=max(left, 0.01)) if not announced else proc.communicate()
        except subprocess.TimeoutExpired:
            units = f", {len(cmds)} units in parallel" if len(cmds) > 1 else ""
            report(f"disc: compiling {name} ({lines} lines{units})...")
            announced = True
            out, err = proc.communicate()
        results.append(subprocess.CompletedProcess(cmd, proc.returncode, out, err))
    if announced:
        report(f"disc: compiled {name} in {time.perf_counter() - start:.1f} s")
    return results


def split_units(source: str, jobs: int) -> list[str]:
    """``source`` as at most ``jobs`` translation units of about equal size (see UNIT_MARKER).

    Each unit is the common part followed by its sections in source order; the largest sections
    are dealt out first, each to the unit with the least code so far. Without markers, or with
    one job, the source is its only unit.
    """
    common, *sections = source.split(f"\n{UNIT_MARKER}\n")
    if jobs <= 1 or len(sections) <= 1:
        return [source]
    jobs = min(jobs, len(sections))
    sizes = [0] * jobs
    members: list[list[int]] = [[] for _ in range(jobs)]
    for i in sorted(range(len(sections)), key=lambda i: -len(sections[i])):
        u = sizes.index(min(sizes))
        members[u].append(i)
        sizes[u] += len(sections[i])
    return ["\n".join([common, *(sections[i] for i in sorted(m))]) for m in members]


def _jobs() -> int:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(cpus, MAX_UNITS))


def _compile_error(name: str, compiler: str, proc: subprocess.CompletedProcess, src: Path) -> CompileError:
    err = (proc.stderr or proc.stdout).strip()
    if len(err) > MAX_STDERR_CHARS:
        err = err[:MAX_STDERR_CHARS] + "\n... (truncated)"
    return CompileError(f"disc: compiling {name} failed ({Path(compiler).name} exit {proc.returncode}); source: {src}\n{err}")


def build_key(source: str, *, flags: Sequence[str] = (), libs: Sequence[str] = (), include_dirs: Sequence[str | os.PathLike] = ()) -> str:
    """What ``build`` would key this library by here: the source, the flags, this compiler and this CPU.

    Equal keys mean a library built elsewhere (a saved artifact's) is the one ``build`` would make.
    """
    return _resolve(source, flags, libs, include_dirs)[2]


def _resolve(source: str, flags: Sequence[str], libs: Sequence[str], include_dirs: Sequence[str | os.PathLike]) -> tuple[str, list[str], str]:
    """(compiler, include folders, cache key) of a build."""
    compiler = find_compiler()
    incs = [str(RAL_INCLUDE_DIR), *(str(d) for d in include_dirs)]
    return compiler, incs, _cache_key(compiler, source, list(flags), list(libs), incs)


def host_digest() -> str:
    """A digest of this machine's architecture and CPU features (what ``-march=native`` code depends on)."""
    return hashlib.sha256(_host_identity().encode()).hexdigest()


# A build's temporary files (the library before its atomic rename, split units and their objects,
# a precompiled header in progress) left by a process killed mid-build. A build in progress
# touches its files within seconds; one this old was abandoned.
STALE_SECONDS = 3600
_STALE_PATTERNS = (".*.so.tmp", ".*.unit*.cc", ".*.unit*.o", ".prelude.*.gch.tmp")
_swept: set[Path] = set()
_sweep_lock = threading.Lock()


SWEEP_EVERY = 24 * 3600  # seconds between sweeps of one cache, over all processes


def sweep_if_due(root: Path) -> int:
    """`sweep_stale_files` once a day per cache (``.last-sweep`` in it records when), not in every
    process: listing a cache of thousands of entries costs a second cold, and a sweep on a
    background thread made the first seconds of calls after a compile 1.5x slower (it took the
    GIL back after each of its ~10^4 system calls)."""
    marker = root / ".last-sweep"
    try:
        if time.time() - marker.stat().st_mtime < SWEEP_EVERY:
            with _sweep_lock:
                _swept.add(root)
            return 0
    except OSError:  # never swept, or no cache yet
        pass
    removed = sweep_stale_files(root)
    try:
        marker.touch()
    except OSError:  # a read-only cache: swept again next time
        pass
    return removed


def sweep_stale_files(root: Path, older_than: float = STALE_SECONDS) -> int:
    """Delete abandoned build files under ``root``'s entries, once per process and root; returns how many."""
    with _sweep_lock:
        if root in _swept:
            return 0
        _swept.add(root)
    removed, now = 0, time.time()
    try:
        entries = [e for e in os.scandir(root) if e.is_dir(follow_symlinks=False)]
    except OSError:  # no cache yet
        return 0
    for entry in entries:
        try:
            # Only dot-files can be a build's temporaries: one listing per entry, matched by name.
            names = [f.name for f in os.scandir(entry.path) if f.name.startswith(".")]
        except OSError:
            continue
        for name in names:
            if not any(fnmatch.fnmatchcase(name, pattern) for pattern in _STALE_PATTERNS):
                continue
            path = Path(entry.path) / name
            try:
                if now - path.stat().st_mtime > older_than:
                    path.unlink()
                    removed += 1
            except OSError:  # gone already, or not ours to delete
                continue
    if removed:
        logger.info("disc: removed %d files of abandoned builds under %s", removed, root)
    return removed


def build(
    source: str,
    name: str,
    *,
    flags: Sequence[str] = (),
    libs: Sequence[str] = (),
    include_dirs: Sequence[str | os.PathLike] = (),
    progress: Callable[[str], None] | None = None,
) -> BuildResult:
    """Compile ``source`` into a shared library, or return the verified cached one.

    ``flags`` go after the base flags, ``libs`` (linker arguments such as ``-ldnnl``) after the
    source, ``include_dirs`` become ``-I`` (the RAL header's folder is always included). Slow
    compiles are announced through ``progress`` (default: the "disc" logger at INFO). Raises
    CompileError with the compiler's stderr and the saved source's path on failure.
    """
    compiler, incs, key = _resolve(source, flags, libs, include_dirs)
    root = cache_dir()
    if root not in _swept:
        sweep_if_due(root)
    stem = _safe_name(name)
    entry = root / key[:32]
    so, sidecar, src = entry / f"{stem}.so", entry / f"{stem}.so.json", entry / f"{stem}.cc"
    if _valid_entry(so, sidecar):
        return BuildResult(so, src, True, key)
    entry.mkdir(parents=True, exist_ok=True)
    if sidecar.exists():
        # Corrupt or stale: withdraw the sidecar first so no process trusts the old bytes; the
        # .so itself is replaced atomically below. (A .so without a sidecar is another build
        # in progress or an interrupted one: silently rebuilt.)
        logger.warning("disc: cache entry %s failed verification; rebuilding", so)
        sidecar.unlink(missing_ok=True)
    _write_atomic(src, source.encode())
    fd, tmp = tempfile.mkstemp(dir=entry, prefix=f".{stem}.", suffix=".so.tmp")
    os.close(fd)
    units = split_units(source, _jobs()) if len(source) >= MIN_SPLIT_CHARS else [source]
    unit_paths: list[Path] = []
    try:
        code_flags = _code_flags(flags)
        head = [compiler, *code_flags, "-shared", *(f"-I{d}" for d in incs)]
        report = progress or logger.info
        lines = source.count("\n") + 1
        if len(units) == 1:
            inputs, cmds = [src], [[*head, str(src), "-o", tmp, *libs]]
        else:  # compile the units side by side (one per core), then link them
            unit_paths = [Path(tmp.removesuffix(".so.tmp") + f".unit{i}.cc") for i in range(len(units))]  # unique like tmp
            for path, text in zip(unit_paths, units):
                path.write_text(text)
            inputs, cmds = unit_paths, [[*head, "-c", str(p), "-o", str(p.with_suffix(".o"))] for p in unit_paths]
        prelude = precompiled_prelude(compiler, code_flags, leading_system_includes(source))
        with_prelude = [[cmd[0], "-include", str(prelude), *cmd[1:]] for cmd in cmds] if prelude else cmds
        results = _compile(with_prelude, name, lines, report)
        if prelude is not None and any(proc.returncode != 0 for proc in results):
            # The precompiled header only saves parsing; a failure with it is retried without,
            # so a damaged .gch can cost time but never fail a build that would succeed.
            _drop_prelude(prelude)
            results = _compile(cmds, name, lines, report)
        for path, proc in zip(inputs, results):
            if proc.returncode != 0:
                raise _compile_error(name, compiler, proc, path)
        if unit_paths:
            link = [*head, *(str(p.with_suffix(".o")) for p in unit_paths), "-o", tmp, *libs]
            proc = subprocess.run(link, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise _compile_error(name, compiler, proc, src)
        data = Path(tmp).read_bytes()
        meta = {"format": CACHE_FORMAT, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data), "name": name}
        os.replace(tmp, so)
        _write_atomic(sidecar, json.dumps(meta).encode())
    finally:
        Path(tmp).unlink(missing_ok=True)
    for path in unit_paths:  # reached only on success: a failed unit stays for its error message
        path.unlink(missing_ok=True)
        path.with_suffix(".o").unlink(missing_ok=True)
    return BuildResult(so, src, False, key)

