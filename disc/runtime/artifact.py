"""Saved programs: ``disc.save(compiled, folder)`` and ``disc.load(folder)``.

A compiled program is stored as what it is, so loading it repeats none of the
compilation (no torch.export, no passes, no C++ compiler):

    manifest.json   what the files are, with their sizes and SHA-256 digests
    program.disc    the optimised IR, as text (``print_graph``)
    constants.bin   every parameter, raw little-endian bytes, 64-byte aligned
    interface.txt   what the program takes and returns, for every host (``runtime/interface.py``)
    program.cc      the generated C++ (native CPU programs)
    program.so      the library built from it
    ral.so          the RAL and standalone runtime it was built with

A program is its files: loading checks digests and versions and opens the
library; it neither lowers the IR again nor generates code (``verify=True``
does, and refuses a folder whose C++ is not what this disc generates from its
IR). The library is used where it was built for this CPU and RAL ABI and its
bytes match the digest; otherwise it is built again from the saved C++. Any
other mismatch (a truncated or altered file, another format) is an error
naming the file: nothing is loaded half-way. Nothing in ``program.so`` links
against torch: the standalone runtime (``disc_runtime.h``, the ``disc_runtime``
package, ``disc-run``) runs the same folder. A saved program is native code:
load only programs you trust.

A graph with fallbacks (ops PyTorch runs between compiled segments) is saved
too: the manifest lists each fallback as its ATen operator and arguments. Its
segments are not stored as libraries; loading builds them again (from the
compile cache where this machine built them before), and it needs PyTorch.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
import warnings
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree

from disc.errors import CompileError, DiscError
from disc.ir.parser import IRParseError, parse_graph
from disc.ir.types import DTYPES, dtype_of_torch
from disc.runtime.interface import LOWERED_KIND, InterfaceError, ProgramInterface, parse_interface
from disc.runtime.program_files import FORMAT, ArtifactError, RawConstant, constant_order, digest, packed_offsets, write_program

logger = logging.getLogger("disc")


def save(compiled: Any, folder: str | os.PathLike, *, external: Mapping[str, str] | None = None, external_digests: Mapping[str, str] | None = None) -> Path:
    """Write ``compiled`` (a ``disc.CompiledModule``) to ``folder``, replacing what is there.

    ``external`` maps constants the folder does not hold to the name their owner knows them by
    (the program cache leaves a model's parameters in the model); ``load`` must then be given
    them. ``external_digests`` (owner name -> SHA-256 of the owner's tensor) binds each to its
    bytes: a cache entry whose names were edited is refused, not run on the wrong weights.
    """
    report = compiled.report
    graph = report.graph
    external = dict(external or {})
    extra: dict[str, Any] = {}
    try:
        extra["out_spec"] = pytree.treespec_dumps(compiled.out_spec)
    except Exception as e:  # a custom output container pytree cannot serialise
        raise ArtifactError(f"cannot save {report.name}: its output structure does not serialise ({e})") from e
    if external:
        extra["external"] = [
            {"name": k, "owner_name": external[k], "dtype": dtype_of_torch(graph.constants[k].dtype), "shape": list(graph.constants[k].shape)}
            | ({"sha256": external_digests[external[k]]} if external_digests and external[k] in external_digests else {})
            for k in external
        ]
    capture = {"hints": report.hints, "decomposed_because": report.decomposed_because}
    if any(capture.values()):  # what explain says of the capture, kept with the program it made
        extra["capture"] = capture
    fallbacks = _encoded_fallbacks(report)
    if fallbacks:
        extra["fallbacks"] = fallbacks
        extra["fallback_counts"] = dict(report.fallbacks)
    needs = _standalone_needs(report, external)
    if needs and not external:  # a program-cache entry is not the user's save: nothing to say
        warnings.warn(f"disc.save: {report.name} cannot run without PyTorch (disc_runtime, disc-run, the C API): it needs {'; '.join(needs)}", stacklevel=2)
    native = report.backend.native if report.backend is not None else None
    return write_program(
        folder,
        name=report.name,
        graph=graph,
        input_names=compiled.input_names,
        constants={k: _raw(graph.constants[k]) for k in constant_order(graph) if k not in external},
        backend=report.backend.name if report.backend is not None else "reference",
        native=native,
        ral_library=compiled.executor.ral.path if native is not None else None,
        needs=needs,
        manifest_extra=extra,
    )


def _raw(t: torch.Tensor) -> RawConstant:
    t = t.detach().contiguous().cpu()
    return RawConstant(dtype_of_torch(t.dtype), tuple(t.shape), t.reshape(-1).view(torch.uint8).numpy())


@dataclass
class SavedProgram:
    """What ``read`` found in a folder. ``executor`` is the saved native program, opened; None
    where the graph must be built again (segments, the GPU, another backend asked for): the
    caller hands ``graph`` to the compile driver then."""

    name: str
    graph: Any
    executor: Any
    choice: Any  # BackendChoice of the opened native program, or None
    backend: str  # what to build otherwise
    device: str
    fallbacks: dict[str, Any]
    fallback_counts: dict[str, int]
    input_names: list[str]
    out_spec: Any
    capture: dict[str, Any]


def read(
    folder: str | os.PathLike,
    *,
    host_op: Callable[[dict], Any],
    backend: str | None = None,
    external: Mapping[str, torch.Tensor] | None = None,
    external_digests: Mapping[str, str] | None = None,
    verify: bool = False,
) -> SavedProgram:
    """The program saved in ``folder`` (``disc.load`` makes it a ``CompiledModule``).

    ``backend`` as for ``disc.compile``; by default the backend it was saved with
    (a native CPU program opens its saved library where it is valid here).
    ``external``: the constants saved as external, by the owner's names (``save``), and
    ``external_digests`` their SHA-256 by the same names, checked against the ones saved.
    ``verify``: lower the IR again and refuse the folder unless that gives its saved C++.
    ``host_op``: the frontend's decoder of a host op saved as JSON (``Fallback.from_json`` for
    PyTorch's), so that reading a folder needs no frontend.
    """
    folder = Path(folder)
    try:
        return _read(folder, host_op, backend, external, external_digests, verify)
    except (DiscError, IRParseError):
        raise
    except InterfaceError as e:
        raise ArtifactError(f"saved program {folder}: {e}") from e
    except (KeyError, TypeError, AttributeError, IndexError, ValueError) as e:
        # Every field is checked in _check_manifest; this net turns a check that was missed into an error that
        # names the folder rather than a raw exception from deep inside.
        raise ArtifactError(f"saved program {folder} cannot be read: {type(e).__name__}: {e}") from e


def _read(
    folder: Path,
    host_op: Callable[[dict], Any],
    backend: str | None,
    external: Mapping[str, torch.Tensor] | None,
    external_digests: Mapping[str, str] | None,
    verify: bool,
) -> SavedProgram:
    from disc.report import BackendChoice

    manifest = _read_manifest(folder)
    _check_manifest(folder, manifest)
    files = manifest["files"]
    # The parameters are the bulk of the bytes: they are read and hashed while the IR is parsed
    # (against placeholders of their shapes) and the library opened.
    placeholders = {c["name"]: torch.empty(c["shape"], dtype=DTYPES[c["dtype"]], device="meta") for c in manifest["constants"] + manifest.get("external", [])}
    bound = _external_constants(folder, manifest, external, external_digests)
    saved = manifest["backend"]
    # A program cut at fallbacks is rebuilt segment by segment, as compiled ("auto" moves the
    # ops the code generator refuses to PyTorch, as it did then).
    chosen = backend or ("native" if saved == "native-cpu" else "auto" if saved.endswith(" segments") else saved)
    device = "cuda" if saved.startswith("triton") and torch.cuda.is_available() else "cpu"
    fallbacks = _decoded_fallbacks(folder, manifest, host_op)
    native = None
    with ThreadPoolExecutor(max_workers=1) as pool:
        constants = pool.submit(_constants, folder / "constants.bin", manifest)
        graph = parse_graph(_checked_bytes(folder / "program.disc", files["program.disc"]).decode(), constants=placeholders)
        _check_against_ir(folder, manifest, graph)
        if chosen in ("native", "auto") and "native" in manifest:
            native = _native_build(folder, manifest, graph, verify)
        graph.constants.update(constants.result())
    graph.constants.update(bound)
    executor = choice = None
    if native is not None:
        from disc.runtime.native import NativeExecutor, NativeRunError

        try:
            executor, choice = NativeExecutor(graph, native, _ral(folder, manifest)), BackendChoice("native-cpu", native=native)
        except NativeRunError as e:
            raise ArtifactError(f"saved program {folder}: interface.txt does not describe program.so ({e})") from e
    return SavedProgram(
        name=manifest["name"],
        graph=graph,
        executor=executor,
        choice=choice,
        backend=chosen,
        device=device,
        fallbacks=fallbacks,
        fallback_counts=dict(manifest.get("fallback_counts", {})),
        input_names=manifest["input_names"],
        # A program written without PyTorch (the ONNX frontend's) has no output structure: a list.
        out_spec=pytree.treespec_loads(manifest["out_spec"]) if "out_spec" in manifest else pytree.tree_flatten([0] * len(graph.outputs))[1],
        capture=manifest.get("capture", {}),  # absent in programs saved before it was written
    )


def _external_constants(folder: Path, manifest: dict, given: Mapping[str, torch.Tensor] | None, digests: Mapping[str, str] | None) -> dict[str, torch.Tensor]:
    """The graph's constants that ``folder`` does not hold, taken from ``given`` and checked: dtype,
    shape and, where both sides have it, the SHA-256 of the bytes the program was compiled with
    (two same-shaped weights whose names were swapped in the entry would otherwise run silently wrong)."""
    wanted = manifest.get("external", [])
    if wanted and given is None:
        raise ArtifactError(f"{folder} is a program-cache entry, not a saved program: its parameters stay in the model it was compiled from")
    out = {}
    for c in wanted:
        t = (given or {}).get(c["owner_name"])
        if t is None:
            raise ArtifactError(f"{folder}: constant {c['name']!r} needs the model's {c['owner_name']!r}, which was not given")
        if t.dtype != DTYPES[c["dtype"]] or list(t.shape) != c["shape"]:
            raise ArtifactError(
                f"{folder}: the model's {c['owner_name']!r} is {dtype_of_torch(t.dtype)}{list(t.shape)}, the program was compiled for {c['dtype']}{c['shape']}"
            )
        if "sha256" in c and digests is not None and digests.get(c["owner_name"]) != c["sha256"]:
            raise ArtifactError(f"{folder}: constant {c['name']!r} is bound to the model's {c['owner_name']!r}, whose bytes are not the ones it was compiled with")
        out[c["name"]] = t.detach().contiguous()
    return out


def _encoded_fallbacks(report: Any) -> dict[str, dict]:
    """The PyTorch calls of the graph's ``host_call`` ops as JSON, by call key."""
    keys = [n.attrs["call"] for n in report.graph.nodes if n.op == "host_call"]
    try:
        return {key: report.fallback_calls[key].to_json() for key in keys}
    except KeyError as e:
        raise ArtifactError(f"cannot save {report.name}: the PyTorch call of fallback {e} is not known (compiled before disc kept it)") from e
    except ValueError as e:
        raise ArtifactError(f"cannot save {report.name}: {e}") from e


def _decoded_fallbacks(folder: Path, manifest: dict, host_op: Callable[[dict], Any]) -> dict[str, Any]:
    if not manifest.get("fallbacks"):
        return {}
    try:
        return {key: host_op(call) for key, call in manifest["fallbacks"].items()}
    except (ValueError, KeyError, TypeError) as e:
        raise ArtifactError(f"saved program {folder}: a fallback in manifest.json cannot be read ({e})") from e


def _native_build(folder: Path, manifest: dict, graph: Any, verify: bool) -> Any:
    """The native program saved in ``folder``: its library where it was built for this CPU and RAL,
    else built again from the saved C++. Reads ``interface.txt`` for how to call it; lowers the
    IR only under ``verify``."""
    from disc.codegen.cpu.build import NativeBuild, NativeSignature, build_options, native_source
    from disc.codegen.cpu.toolchain import BuildResult, build, host_digest
    from disc.runtime.ral import ABI_VERSION

    start = time.perf_counter()
    files = manifest["files"]
    iface = parse_interface(_checked_bytes(folder / "interface.txt", files["interface.txt"]).decode(), str(folder / "interface.txt"))
    _check_interface(folder, iface, graph)
    saved_source = _checked_bytes(folder / "program.cc", files["program.cc"]).decode()
    profile = manifest["native"]["profile"]
    if verify:
        lowered, source = native_source(graph)
        if source.text != saved_source:
            raise ArtifactError(f"saved program {folder}: program.cc is not the C++ this disc generates from program.disc (saved by another version, or edited)")
    library = folder / "program.so"
    fits = iface.host == host_digest() and iface.abi == ABI_VERSION
    if fits and _matches(library, files["program.so"]):
        result = BuildResult(library, folder / "program.cc", True, manifest["native"]["key"])
    else:
        # Built for another CPU or RAL: the saved C++ is built here. A library that should fit but
        # differs from its digest is damaged (or replaced): that is said, and it is never loaded.
        if fits:
            logger.warning("disc.load: %s differs from its size or SHA-256 in manifest.json (damaged or replaced); building it again from program.cc", library)
        else:
            logger.info("disc.load: the saved library of %s was built for another CPU or RAL; building it here from program.cc", folder)
        try:
            result = build(saved_source, f"disc_{graph.name}", **build_options(profile))
        except CompileError as e:
            if fits:
                raise ArtifactError(f"{_damaged(library)}, and it cannot be built again here: {e}") from e
            raise ArtifactError(f"saved program {folder}: program.so was built for another CPU or RAL, and it cannot be built here: {e}") from e
    outputs = tuple((LOWERED_KIND[o.kind], o.where) for o in iface.outputs)
    signature = NativeSignature(tuple(iface.arguments), tuple(iface.buffers), outputs, iface.data_dependent)
    if verify:
        return NativeBuild(result, time.perf_counter() - start, profile, signature, graph, lowered, source)
    return NativeBuild(result, time.perf_counter() - start, profile, signature, graph)


def _check_interface(folder: Path, iface: ProgramInterface, graph: Any) -> None:
    """interface.txt describes the IR beside it: its inputs' and outputs' dtypes and ranks."""
    got = [(t.dtype, t.rank) for t in iface.inputs]
    want = [(n.tensor_type.dtype, n.tensor_type.rank) for n in graph.inputs]
    if got != want:
        raise ArtifactError(f"saved program {folder}: interface.txt gives inputs {got}; program.disc has {want}")
    got = [(o.spec.dtype, o.spec.rank) for o in iface.outputs]
    want = [(n.tensor_type.dtype, n.tensor_type.rank) for n in graph.outputs]
    if got != want:
        raise ArtifactError(f"saved program {folder}: interface.txt gives outputs {got}; program.disc has {want}")


def _standalone_needs(report: Any, external: Mapping[str, str]) -> list[str]:
    """Why the program cannot run without PyTorch, in words (none: it can)."""
    backend = report.backend.name if report.backend is not None else "reference"
    needs = []
    if report.fallbacks:
        needs.append(f"PyTorch for the ops it runs between compiled segments: {', '.join(sorted(report.fallbacks))}")
    elif backend.startswith("triton"):
        needs.append("a GPU: its kernels are Triton's")
    elif report.backend is None or report.backend.native is None:
        needs.append(f"PyTorch: it runs on the {backend} executor, not a native program")
    if external:
        needs.append("the model's parameters: it is a program-cache entry")
    return needs


def _ral(folder: Path, manifest: dict) -> Any:
    """This machine's RAL, or the saved one where none can be built here (no C++ compiler)."""
    from disc.codegen.cpu.toolchain import host_digest
    from disc.runtime.ral import load_ral, open_ral, preload_dnnl

    try:
        return load_ral()
    except CompileError as e:
        if host_digest() != manifest["native"]["host"]:
            raise ArtifactError(f"saved program {folder}: no RAL can be built here ({e}) and the saved one is for another CPU") from e
        _checked_bytes(folder / "ral.so", manifest["files"]["ral.so"])
        preload_dnnl()  # its rpath names the Python environment it was built in, maybe not this one
        return open_ral(folder / "ral.so")


# -- files ----------------------------------------------------------------------------------------
def _matches(path: Path, expected: dict) -> bool:
    try:
        return digest(path.read_bytes()) == expected
    except OSError:
        return False


def _checked_bytes(path: Path, expected: dict) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise _unreadable(path, e) from e
    if digest(data) != expected:
        raise _damaged(path)
    return data


def _unreadable(path: Path, e: OSError) -> ArtifactError:
    return ArtifactError(f"saved program {path.parent}: cannot read {path.name}: {e.strerror}")


def _damaged(path: Path) -> ArtifactError:
    return ArtifactError(f"saved program {path.parent}: {path.name} is damaged (its size or SHA-256 differs from the manifest)")


def _read_manifest(folder: Path) -> dict:
    path = folder / "manifest.json"
    try:
        manifest = json.loads(path.read_text())
    except OSError as e:
        raise ArtifactError(f"{folder} is not a saved disc program: cannot read manifest.json ({e.strerror})") from e
    except json.JSONDecodeError as e:
        raise ArtifactError(f"saved program {folder}: manifest.json is damaged ({e})") from e
    if manifest.get("format") != FORMAT:
        raise ArtifactError(f"saved program {folder}: format {manifest.get('format')!r}, this disc reads {FORMAT!r}")
    return manifest


def _bad(folder: Path, what: str) -> ArtifactError:
    return ArtifactError(f"saved program {folder}: manifest.json {what}")


def _check_manifest(folder: Path, manifest: dict) -> None:
    """manifest.json against its schema and the files beside it, before anything is read by it.

    Nothing in it is trusted: each field has its type, each listed file its size on disk (an
    edited size must not make disc allocate it), and the constants table must be exactly the
    packed layout of its own entries (an edited offset or size is refused)."""

    def need(cond: bool, what: str) -> None:
        if not cond:
            raise _bad(folder, what)

    need(isinstance(manifest.get("name"), str), "has no program name")
    names = manifest.get("input_names")
    need(isinstance(names, list) and all(isinstance(n, str) for n in names) and len(set(names)) == len(names), "input_names must be distinct strings")
    need(isinstance(manifest.get("out_spec", ""), str) and isinstance(manifest.get("backend"), str), "out_spec and backend must be strings")
    files = manifest.get("files")
    need(isinstance(files, dict) and all(f in files for f in ("program.disc", "constants.bin", "interface.txt")), "files must list program.disc, constants.bin and interface.txt")
    for fname, meta in files.items():
        need(fname in ("program.disc", "constants.bin", "interface.txt", "program.so", "ral.so", "program.cc"), f"lists an unknown file {fname!r}")
        ok = isinstance(meta, dict) and isinstance(meta.get("bytes"), int) and meta["bytes"] >= 0
        need(ok and isinstance(meta.get("sha256"), str) and len(meta["sha256"]) == 64, f"entry for {fname} needs bytes and a sha256")
        path = folder / fname
        # The files read into memory are sized first; the libraries are checked by digest where
        # used (a damaged one is built again from the IR).
        if fname in ("program.disc", "constants.bin", "interface.txt") and path.exists() and path.stat().st_size != meta["bytes"]:
            raise ArtifactError(f"{_damaged(path)}: {path.stat().st_size} bytes, the manifest says {meta['bytes']}")
    entries = manifest.get("constants")
    need(isinstance(entries, list), "constants must be a list")
    external = manifest.get("external", [])
    need(isinstance(external, list), "external must be a list")
    seen: set[str] = set()
    for c in [*entries, *external]:
        need(isinstance(c, dict) and isinstance(c.get("name"), str) and c["name"] not in seen, f"constant entry {c!r} needs a distinct name")
        seen.add(c["name"])
        need(isinstance(c.get("dtype"), str) and c["dtype"] in DTYPES, f"constant {c['name']!r} has unknown dtype {c.get('dtype')!r}")
        shape = c.get("shape")
        need(isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape), f"constant {c['name']!r} has a bad shape {shape!r}")
    for c in external:
        need(isinstance(c.get("owner_name"), str), f"external constant {c['name']!r} needs its owner's name")
        need("sha256" not in c or (isinstance(c["sha256"], str) and len(c["sha256"]) == 64), f"external constant {c['name']!r} has a bad sha256")
    native = manifest.get("native")
    if native is not None:
        ok = isinstance(native, dict) and isinstance(native.get("key"), str) and isinstance(native.get("host"), str)
        need(ok and isinstance(native.get("profile"), bool), "native must hold the build's key, host and profile flag")
        need(all(f in files for f in ("program.so", "ral.so", "program.cc")), "native needs program.so, ral.so and program.cc in files")
    for field, kind in (("capture", dict), ("fallbacks", dict), ("fallback_counts", dict)):
        need(field not in manifest or isinstance(manifest[field], kind), f"{field} must be a {kind.__name__}")
    counts = manifest.get("fallback_counts", {})
    need(all(isinstance(v, int) for v in counts.values()), "fallback_counts must count with integers")
    capture = manifest.get("capture", {})
    need(isinstance(capture.get("hints", {}), dict), "capture.hints must be an object")
    for c in entries:
        numel = 1
        for d in c["shape"]:
            numel *= d
        need(c.get("bytes") == numel * DTYPES[c["dtype"]].itemsize, f"constant {c['name']!r}: bytes {c.get('bytes')!r} is not its shape's")
    offsets = packed_offsets(entries)
    for c, at in zip(entries, offsets):
        need(c.get("offset") == at, f"constant {c['name']!r}: offset {c.get('offset')!r} is not where constants.bin holds it ({at})")
    end = offsets[-1] + entries[-1]["bytes"] if entries else 0
    need(end == files["constants.bin"]["bytes"], f"constants end at byte {end}; constants.bin has {files['constants.bin']['bytes']}")


def _check_against_ir(folder: Path, manifest: dict, graph: Any) -> None:
    """The manifest's constants and inputs are the IR's: same names in the IR's order, dtypes and shapes."""
    held = [c["name"] for c in manifest["constants"]]
    external = {c["name"] for c in manifest.get("external", [])}
    order = [k for k in constant_order(graph) if k not in external]
    if held != order:
        raise _bad(folder, f"lists constants {held[:8]} where the IR's order is {order[:8]}")
    types = {n.constant_ref: n.tensor_type for n in graph.nodes if n.constant_ref is not None}
    for c in [*manifest["constants"], *manifest.get("external", [])]:
        ty = types.get(c["name"])
        if ty is not None and (ty.dtype != c["dtype"] or list(ty.shape) != c["shape"]):
            raise _bad(folder, f"says constant {c['name']!r} is {c['dtype']}{c['shape']}; the IR has {ty}")
    if len(manifest["input_names"]) != len(graph.inputs):
        raise _bad(folder, f"names {len(manifest['input_names'])} inputs; the IR has {len(graph.inputs)}")


READ_CHUNK = 32 << 20


def _read_hashing(path: Path, into: memoryview) -> tuple[int, bytes, str]:
    """Read ``path`` into ``into`` and hash it on the way: a second thread hashes each chunk while
    the next is read (both release the GIL), so loading pays for the slower of the two, not their
    sum (BERT-base: 347 MB, SHA-256 at ~0.9 GB/s on a 2-core Xeon). Returns the bytes read, one byte
    past ``into`` if the file is longer, and the SHA-256."""
    h = hashlib.sha256()
    at = 0
    with ThreadPoolExecutor(max_workers=1) as hasher, open(path, "rb") as f:
        pending = []
        while at < len(into):
            n = f.readinto(into[at : at + READ_CHUNK])
            if not n:
                break
            pending.append(hasher.submit(h.update, into[at : at + n]))  # one worker: in order
            at += n
        extra = f.read(1)
        for done in pending:
            done.result()
    return at, extra, h.hexdigest()


def _constants(path: Path, manifest: dict) -> dict[str, torch.Tensor]:
    expected = manifest["files"]["constants.bin"]
    blob = torch.empty(expected["bytes"], dtype=torch.uint8)  # torch's allocator aligns to 64 bytes
    try:
        got, extra, sha256 = _read_hashing(path, memoryview(blob.numpy()))
    except OSError as e:
        raise _unreadable(path, e) from e
    if got != expected["bytes"] or extra or sha256 != expected["sha256"]:
        raise _damaged(path)
    out = {}
    for c in manifest["constants"]:
        dtype = DTYPES[c["dtype"]]
        raw = blob[c["offset"] : c["offset"] + c["bytes"]]
        out[c["name"]] = raw.view(dtype).reshape(c["shape"]) if c["bytes"] else torch.empty(c["shape"], dtype=dtype)
    return out
