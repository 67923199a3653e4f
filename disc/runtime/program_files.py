"""Writing a saved program's files, without PyTorch.

One writer for every frontend: ``disc.save`` (``runtime/artifact.py``, which adds what only the
PyTorch host reads: the output structure, fallbacks, external weights) and the ONNX frontend where
PyTorch is not installed. The folder's layout and the reading side are described in
``runtime/artifact.py``; ``interface.txt`` in ``runtime/interface.py``. Constants arrive as raw
host buffers (``RawConstant``), so nothing here knows which framework held them.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from disc.errors import DiscError
from disc.ir.graph import Graph
from disc.ir.types import dtype_of_numpy
from disc.runtime.interface import LOWERED_KIND, Constant, Output, ProgramInterface, Symbol, TensorSpec, dim_text

FORMAT = "disc-artifact/4"  # 4: host_call (was torch_fallback); 3: interface.txt; 2: constants.bin in the IR's order
ALIGN = 64


class RawConstant(NamedTuple):
    """A constant as bytes: its IR dtype, its shape and a C-contiguous array holding its bytes
    (any numpy dtype of the same bytes: bf16 travels as uint16)."""

    dtype: str
    shape: tuple[int, ...]
    data: np.ndarray


def raw_constant(a: np.ndarray) -> RawConstant:
    """A numpy array (ml_dtypes' bfloat16 included) as a ``RawConstant``."""
    return RawConstant(dtype_of_numpy(a.dtype), tuple(a.shape), np.ascontiguousarray(a))


def digest(data: bytes) -> dict:
    return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def constant_order(graph: Graph) -> list[str]:
    """The graph's constants in the order its IR first refers to them: the order constants.bin
    holds them in, so the table in manifest.json is checked against the IR, not trusted."""
    order = dict.fromkeys(n.constant_ref for n in graph.nodes if n.constant_ref is not None)
    return [*order, *(k for k in graph.constants if k not in order)]


def packed_offsets(entries: Sequence[dict]) -> list[int]:
    """Where ``write_constants`` puts each entry, in order."""
    offsets, at = [], 0
    for c in entries:
        at += -at % ALIGN
        offsets.append(at)
        at += c["bytes"]
    return offsets


def write_constants(path: Path, constants: Mapping[str, RawConstant]) -> tuple[list[dict], dict]:
    """constants.bin: each constant's bytes at a 64-byte aligned offset; returns the table and the file's digest."""
    table, offset = [], 0
    h = hashlib.sha256()
    with open(path, "wb") as f:
        for name, c in constants.items():
            data = memoryview(np.ascontiguousarray(c.data).reshape(-1).view(np.uint8))  # (by bytes: numpy's bfloat16 has no buffer format)
            pad = b"\0" * (-offset % ALIGN)
            f.write(pad)
            h.update(pad)
            offset += len(pad)
            table.append({"name": name, "dtype": c.dtype, "shape": list(c.shape), "offset": offset, "bytes": len(data)})
            f.write(data)
            h.update(data)
            offset += len(data)
    return table, {"sha256": h.hexdigest(), "bytes": offset}


def program_interface(name: str, graph: Graph, input_names: Sequence[str], constants: list[dict], files: dict, needs: list[str], native: Any) -> ProgramInterface:
    """``interface.txt`` of a program: everything a host needs to call it (``native``: its ``NativeBuild``, or None)."""
    from disc.codegen.cpu.toolchain import host_digest
    from disc.runtime.ral_build import ABI_VERSION

    iface = ProgramInterface(name=name, abi=ABI_VERSION, host=host_digest(), needs=needs)
    iface.files = {f: (files[f]["bytes"], files[f]["sha256"]) for f in ("program.so", "constants.bin") if f in files}
    c = graph.constraints
    symbols: dict[str, Symbol] = {}
    for input_name, node in zip(input_names, graph.inputs):
        dims = []
        for d in node.tensor_type.shape:
            sym = d.as_symbol() if not isinstance(d, int) else None
            root = c.find(sym) if sym is not None else None
            definition = c.definitions.get(root) if root is not None else None
            if isinstance(d, int) or root is None or (definition is not None and definition.as_symbol() is None):
                dims.append(d if isinstance(d, int) else "?")
                continue
            facts = c.facts.get(root)
            lo = int(facts.lo) if facts is not None and math.isfinite(facts.lo) and facts.lo > 0 else 0
            hi = facts.hi if facts is not None else None
            symbols[root] = Symbol(root, lo, hi, facts.divisor if facts is not None else 1)
            dims.append(root)
        iface.inputs.append(TensorSpec(input_name, node.tensor_type.dtype, tuple(dims)))
    iface.symbols = list(symbols.values())
    iface.constants = [Constant(e["name"], e["dtype"], e["offset"], e["bytes"], tuple(e["shape"])) for e in constants]
    if native is not None:
        sig = native.signature
        kinds = {lowered: kind for kind, lowered in LOWERED_KIND.items()}
        iface.arguments = list(sig.arguments)
        iface.buffers = list(sig.buffers)
        iface.data_dependent = sig.data_dependent
        for (kind, where), node in zip(sig.outputs, graph.outputs):
            ty = node.tensor_type
            spec = TensorSpec(f"output{len(iface.outputs)}", ty.dtype, tuple(dim_text(c.normalize(d)) if not isinstance(d, int) else d for d in ty.shape))
            iface.outputs.append(Output(kinds[kind], where, spec))
    return iface


class ArtifactError(DiscError):
    """A saved program cannot be written or read (the message names the file and the reason)."""


def write_program(
    folder: str | os.PathLike,
    *,
    name: str,
    graph: Graph,
    input_names: Sequence[str],
    constants: Mapping[str, RawConstant],
    backend: str,
    native: Any = None,
    ral_library: Path | None = None,
    needs: Sequence[str] = (),
    manifest_extra: Mapping[str, Any] | None = None,
) -> Path:
    """Write a program to ``folder``, replacing a saved program there (all files appear at once).

    ``constants``: the ones the folder holds, in ``constant_order``; ``native``: the program's
    ``NativeBuild`` (with ``ral_library``, the RAL it was built against, kept for machines that
    cannot build their own), or None for a program that has no library; ``needs``: why it cannot
    run without PyTorch (empty: it can); ``manifest_extra``: further manifest fields of the host.
    """
    from disc.ir.printer import print_graph

    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}."))
    try:
        ir = print_graph(graph).encode()
        (tmp / "program.disc").write_bytes(ir)
        table, blob = write_constants(tmp / "constants.bin", constants)
        manifest: dict[str, Any] = {
            "format": FORMAT,
            "name": name,
            "input_names": list(input_names),
            "backend": backend,
            "files": {"program.disc": digest(ir), "constants.bin": blob},
            "constants": table,
            **(manifest_extra or {}),
        }
        if native is not None:
            from disc.codegen.cpu.toolchain import host_digest

            library = native.build.path.read_bytes()
            source_text = native.source_text()
            if ral_library is None:
                raise ValueError("write_program: a native program needs ral_library, the RAL it was built against")
            ral = Path(ral_library).read_bytes()
            for fname, data in (("program.cc", source_text.encode()), ("program.so", library), ("ral.so", ral)):
                (tmp / fname).write_bytes(data)
                manifest["files"][fname] = digest(data)
            manifest["native"] = {"key": native.build.key, "host": host_digest(), "profile": native.profile}
        text = program_interface(name, graph, input_names, table, manifest["files"], list(needs), native).to_text().encode()
        (tmp / "interface.txt").write_bytes(text)
        manifest["files"]["interface.txt"] = digest(text)
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1))
        if folder.exists():
            if not (folder / "manifest.json").is_file():
                raise ArtifactError(f"{folder} exists and is not a saved disc program; not replacing it")
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder
