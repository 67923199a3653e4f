"""``interface.txt``: what a saved native program takes and returns, for any host.

A saved program's folder is run by three hosts: ``disc.load`` (Python, PyTorch), the standalone
C runtime (``disc_runtime.h``) and the numpy-only ``disc_runtime`` package on top of it. All three
read this one file, so it is plain lines of space-separated tokens that C parses with no library:

    disc-program-interface 1
    name bert
    abi 5                                        the RAL ABI the program was generated for
    host <sha256>                                the CPU the library was built for (toolchain.host_digest)
    file program.so <bytes> <sha256>             every file the program needs, with its digest
    file constants.bin <bytes> <sha256>
    needs <reason ...>                           zero or more: why it cannot run standalone
    symbol batch 1 inf 1                         a dynamic dim: name, least, most (inf), divisor
    input ids i64 2 batch seq                    name, dtype, rank, dims (number | symbol | ?)
    constant p_w f32 0 3072 2 768 1              in constants.bin order: name, dtype, offset, bytes, rank, dims
    argument p_w                                 the program's constant table, in its order
    buffer f32 3                                 an output buffer the program writes: dtype, rank
    output buffer 0 f32 3 batch seq 768          per graph output: kind, where, dtype, rank, dims
    data_dependent 0                             1: disc_run reports the dims outputs ran at
    end

An output's kind is ``buffer`` (where: the buffer's index), ``input`` (an input passed through,
its index), ``constant`` (its name) or ``same`` (an earlier output's index). A dim ``?`` is an
expression of other dims that the program checks itself. Names are non-empty printable ASCII
without spaces. Nothing here imports torch: the standalone runtime's Python side uses it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

MAGIC = "disc-program-interface"
VERSION = 1
DTYPE_NAMES = ("f16", "bf16", "f32", "f64", "i8", "u8", "i16", "i32", "i64", "i1", "u16", "u32", "u64")  # DISC_F16.. in disc_runtime.h
DTYPE_SIZES = {"f16": 2, "bf16": 2, "f32": 4, "f64": 8, "i8": 1, "u8": 1, "i16": 2, "i32": 4, "i64": 8, "i1": 1, "u16": 2, "u32": 4, "u64": 8}
OUTPUT_KINDS = ("buffer", "input", "constant", "same")
# The same kinds as `LoweredProgram.outputs` names them (the lowering's "const" is "constant" here).
LOWERED_KIND = {"buffer": "buffer", "input": "input", "constant": "const", "same": "same"}
_NAME = re.compile(r"[!-~]+")  # printable ASCII, no space
_HEX64 = re.compile(r"[0-9a-f]{64}")

Dim = int | str  # a static size, a symbol's name, or "?"


class InterfaceError(ValueError):
    """interface.txt is not well formed (the message names the line and the rule)."""


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    dims: tuple[Dim, ...]

    @property
    def rank(self) -> int:
        return len(self.dims)


@dataclass(frozen=True)
class Symbol:
    name: str
    lo: int
    hi: int | None  # None: unbounded
    divisor: int


@dataclass(frozen=True)
class Constant:
    name: str
    dtype: str
    offset: int
    nbytes: int
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Output:
    kind: str  # one of OUTPUT_KINDS
    where: int | str  # buffer index, input index, constant name or earlier output index
    spec: TensorSpec


@dataclass
class ProgramInterface:
    name: str
    abi: int
    host: str
    files: dict[str, tuple[int, str]] = field(default_factory=dict)  # file -> (bytes, sha256)
    needs: list[str] = field(default_factory=list)
    symbols: list[Symbol] = field(default_factory=list)
    inputs: list[TensorSpec] = field(default_factory=list)
    constants: list[Constant] = field(default_factory=list)
    arguments: list[str] = field(default_factory=list)
    buffers: list[tuple[str, int]] = field(default_factory=list)  # (dtype, rank)
    outputs: list[Output] = field(default_factory=list)
    data_dependent: bool = False

    def to_text(self) -> str:
        """The file's text; raises InterfaceError where a name cannot be written as a token."""
        lines = [f"{MAGIC} {VERSION}", f"name {_token(self.name)}", f"abi {self.abi}", f"host {self.host}"]
        lines += [f"file {_token(f)} {n} {digest}" for f, (n, digest) in self.files.items()]
        lines += [f"needs {' '.join(reason.split())}" for reason in self.needs]
        lines += [f"symbol {_token(s.name)} {s.lo} {'inf' if s.hi is None else s.hi} {s.divisor}" for s in self.symbols]
        lines += [f"input {_token(t.name)} {t.dtype} {_dims(t.dims)}" for t in self.inputs]
        lines += [f"constant {_token(c.name)} {c.dtype} {c.offset} {c.nbytes} {_dims(c.shape)}" for c in self.constants]
        lines += [f"argument {_token(a)}" for a in self.arguments]
        lines += [f"buffer {dtype} {rank}" for dtype, rank in self.buffers]
        lines += [f"output {o.kind} {_token(str(o.where))} {o.spec.dtype} {_dims(o.spec.dims)}" for o in self.outputs]
        lines += [f"data_dependent {int(self.data_dependent)}", "end"]
        return "\n".join(lines) + "\n"

    def constant(self, name: str) -> Constant:
        for c in self.constants:
            if c.name == name:
                return c
        raise KeyError(name)


def _token(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise InterfaceError(f"name {name!r} cannot be written to interface.txt (names are printable ASCII without spaces)")
    return name


def _dims(dims: tuple[Dim, ...]) -> str:
    return " ".join([str(len(dims)), *[_token(str(d)) for d in dims]]).rstrip()


def dim_text(d: object) -> Dim:
    """A dim as the interface writes it: an int, a symbol's name, or "?" for an expression."""
    if isinstance(d, int):
        return d
    sym = d.as_symbol() if hasattr(d, "as_symbol") else None
    return sym if sym is not None else "?"


def parse_interface(text: str, where: str = "interface.txt") -> ProgramInterface:
    """Parse and check ``text``: every line's grammar, names, dtypes, counts and cross-references.
    Errors name ``where``, the line and the rule."""
    lines = text.split("\n")
    if not lines or lines[0] != f"{MAGIC} {VERSION}":
        raise InterfaceError(f"{where}: line 1 must be '{MAGIC} {VERSION}'")
    iface = ProgramInterface(name="", abi=0, host="")
    ended = False
    for number, line in enumerate(lines[1:], start=2):
        if ended:
            if line:
                raise InterfaceError(f"{where} line {number}: text after 'end'")
            continue
        words = line.split(" ")
        try:
            ended = _parse_line(iface, words)
        except (IndexError, ValueError) as e:
            raise InterfaceError(f"{where} line {number}: {e if str(e) else 'malformed'}: {line[:120]!r}") from None
    if not ended:
        raise InterfaceError(f"{where}: no 'end' line (the file is cut short)")
    _check(iface, where)
    return iface


def _int(word: str, lo: int = 0) -> int:
    if not re.fullmatch(r"-?[0-9]{1,19}", word) or int(word) < lo:
        raise ValueError(f"{word!r} is not an integer >= {lo}")
    return int(word)


def _name(word: str) -> str:
    if not _NAME.fullmatch(word):
        raise ValueError(f"{word!r} is not a name")
    return word


def _dtype(word: str) -> str:
    if word not in DTYPE_NAMES:
        raise ValueError(f"unknown dtype {word!r}")
    return word


def _spec(name: str, words: list[str]) -> TensorSpec:
    dtype, rank = _dtype(words[0]), _int(words[1])
    if rank > 16 or len(words) != 2 + rank:
        raise ValueError(f"rank {rank} needs {rank} dims")
    dims: list[Dim] = [int(w) if w.isdigit() else _name(w) for w in words[2:]]
    return TensorSpec(name, dtype, tuple(dims))


def _parse_line(iface: ProgramInterface, w: list[str]) -> bool:
    head = w[0]
    if head == "end" and len(w) == 1:
        return True
    if head == "name" and len(w) == 2:
        iface.name = _name(w[1])
    elif head == "abi" and len(w) == 2:
        iface.abi = _int(w[1])
    elif head == "host" and len(w) == 2 and _HEX64.fullmatch(w[1]):
        iface.host = w[1]
    elif head == "file" and len(w) == 4 and _HEX64.fullmatch(w[3]):
        iface.files[_name(w[1])] = (_int(w[2]), w[3])
    elif head == "needs" and len(w) >= 2:
        iface.needs.append(" ".join(w[1:]))
    elif head == "symbol" and len(w) == 5:
        iface.symbols.append(Symbol(_name(w[1]), _int(w[2]), None if w[3] == "inf" else _int(w[3]), _int(w[4], 1)))
    elif head == "input" and len(w) >= 4:
        iface.inputs.append(_spec(_name(w[1]), w[2:]))
    elif head == "constant" and len(w) >= 6:
        spec = _spec(_name(w[1]), [w[2], *w[5:]])
        if any(not isinstance(d, int) for d in spec.dims):
            raise ValueError("a constant's dims are numbers")
        iface.constants.append(Constant(spec.name, spec.dtype, _int(w[3]), _int(w[4]), tuple(int(d) for d in spec.dims)))
    elif head == "argument" and len(w) == 2:
        iface.arguments.append(_name(w[1]))
    elif head == "buffer" and len(w) == 3:
        iface.buffers.append((_dtype(w[1]), _int(w[2])))
    elif head == "output" and len(w) >= 5 and w[1] in OUTPUT_KINDS:
        where: int | str = _name(w[2]) if w[1] == "constant" else _int(w[2])
        iface.outputs.append(Output(w[1], where, _spec(f"output{len(iface.outputs)}", w[3:])))
    elif head == "data_dependent" and len(w) == 2 and w[1] in ("0", "1"):
        iface.data_dependent = w[1] == "1"
    else:
        raise ValueError("not a line of the interface's grammar")
    return False


def _check(iface: ProgramInterface, where: str) -> None:
    def need(cond: bool, what: str) -> None:
        if not cond:
            raise InterfaceError(f"{where}: {what}")

    need(bool(iface.name) and iface.abi > 0 and bool(iface.host), "name, abi and host are required")
    names = [t.name for t in iface.inputs]
    need(len(set(names)) == len(names), f"input names repeat: {names}")
    symbols = {s.name for s in iface.symbols}
    for t in iface.inputs:
        for d in t.dims:
            need(isinstance(d, int) or d == "?" or d in symbols, f"input {t.name!r} has dim {d!r}, which is no symbol")
    at = 0
    consts = {}
    for c in iface.constants:
        need(c.name not in consts, f"constant {c.name!r} is listed twice")
        need(c.nbytes == math.prod(c.shape) * DTYPE_SIZES[c.dtype], f"constant {c.name!r}: {c.nbytes} bytes is not its shape's")
        at += -at % 64
        need(c.offset == at, f"constant {c.name!r} is at offset {c.offset}, where constants.bin holds it at {at}")
        at += c.nbytes
        consts[c.name] = c
    if iface.constants:
        need("constants.bin" in iface.files and iface.files["constants.bin"][0] == at, f"the constants end at byte {at}, not at constants.bin's size")
    # A program-cache entry's parameters stay in the model (it says so in a `needs` line).
    need(bool(iface.needs) or all(a in consts for a in iface.arguments), "an argument names no constant")
    for k, o in enumerate(iface.outputs):
        if o.kind == "buffer":
            need(isinstance(o.where, int) and o.where < len(iface.buffers), f"output {k} names buffer {o.where}, which does not exist")
            need(iface.buffers[o.where] == (o.spec.dtype, o.spec.rank), f"output {k} is not its buffer's dtype and rank")
        elif o.kind == "input":
            need(isinstance(o.where, int) and o.where < len(iface.inputs), f"output {k} passes input {o.where} through, which does not exist")
        elif o.kind == "constant":
            need(bool(iface.needs) or o.where in consts, f"output {k} names constant {o.where!r}, which is not listed")
        else:
            need(isinstance(o.where, int) and o.where < k, f"output {k} repeats output {o.where}, which does not come before it")
    # Every copy a host makes is sized from this file alone.
    need(len(symbols) == len(iface.symbols), "a symbol is listed twice")
    for k, o in enumerate(iface.outputs):
        if o.kind == "input":
            src = iface.inputs[o.where]
        elif o.kind == "same":
            src = iface.outputs[o.where].spec
        elif o.kind == "constant" and o.where in consts:
            src = TensorSpec(o.where, consts[o.where].dtype, consts[o.where].shape)
        else:
            continue
        need(src.dtype == o.spec.dtype and src.rank == o.spec.rank, f"output {k} is not the dtype and rank of what it passes on")
    for b, (_, rank) in enumerate(iface.buffers):
        need(rank <= 16, f"buffer {b} has rank {rank}, more than 16")
