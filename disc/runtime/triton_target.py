"""Compile generated Triton programs for a GPU that is not here: the CPU-side check of the GPU path.

Triton's interpreter (``TRITON_INTERPRET=1``, how the tests run kernels without a GPU) executes
a kernel as Python over numpy and accepts code the real compiler refuses: a scalar pointer
under a block mask, a pointer of another shape than its mask, 16-bit math a libdevice call
does not take. Triton's compiler needs no GPU to build for one, only the target's name, so
every kernel form a test generated is compiled down to machine code for an H100/H200
(``cuda:90``), the way ``precompile`` does on a GPU before a program's first call.

The interpreter rebinds ``@triton.jit`` (Triton's own library too) for the whole process, so
the compile runs in another process: the tests log each program's forms
(``DISC_TRITON_FORMS_LOG``, ``log_forms``) and ``tests/conftest.py`` runs
``python -m disc.runtime.triton_target LOG`` once at the end of the session.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from types import ModuleType

# Triton's signature spelling of each IR dtype (a pointer to it is "*" + this).
SIGNATURE_TYPES = {"f16": "fp16", "bf16": "bf16", "f32": "fp32", "f64": "fp64", "i8": "i8", "u8": "u8", "i16": "i16", "i32": "i32", "i64": "i64", "i1": "i1", "u16": "u16", "u32": "u32", "u64": "u64"}
DEFAULT_TARGET = "cuda:90"


def kernel_forms(source) -> list[dict]:
    """Every compiled form a Triton program (``TritonSource``) can launch: function, signature, constexprs, warps."""
    forms: dict[str, dict] = {}
    for call in source.calls:
        kernel = getattr(call, "kernel", None)
        if kernel is None:
            continue
        ptrs = [f"*{SIGNATURE_TYPES[n.dtype]}" for n in kernel.params]
        for version in kernel.versions:
            for choice in version.choices:
                form = {"function": version.function, "pointers": ptrs, "dims": len(kernel.dims), "constexprs": dict(choice), "num_warps": version.num_warps}
                forms.setdefault(json.dumps(form, sort_keys=True), form)
    return list(forms.values())


def log_forms(log: str, path: str, source) -> None:
    """Append one program's forms to ``log`` (one JSON line; appends from several processes interleave whole lines)."""
    line = json.dumps({"path": path, "forms": kernel_forms(source)}) + "\n"
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


# The compiler's stages run: Triton's front end (the Python kernel to TTIR, where type and shape
# errors are raised) and its GPU lowering to TTGIR. LLVM and ptxas (llir, ptx, cubin) would take
# ten times as long and have not failed on code that reached them.
STAGES = ("ttir", "ttgir")


def compile_forms(path: str, forms: list[dict], target: str = DEFAULT_TARGET, stages: tuple[str, ...] = STAGES) -> None:
    """Compile each form of the program at ``path`` for ``target`` ("cuda:90") through ``stages``; raises Triton's error."""
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler.compiler import make_backend

    kind, _, arch = target.partition(":")
    gpu = GPUTarget(kind, int(arch), 32 if kind == "cuda" else 64)
    backend = make_backend(gpu)
    module = _load(path)
    for form in forms:
        fn = getattr(module, form["function"])
        types = form["pointers"] + ["i64"] * form["dims"] + ["constexpr"] * len(form["constexprs"])
        src = ASTSource(fn, dict(zip(fn.arg_names, types)), constexprs=form["constexprs"])
        options = backend.parse_options({"num_warps": form["num_warps"]})
        context = ir.context()
        ir.load_dialects(context)
        backend.load_dialects(context)
        steps: dict = {}
        backend.add_stages(steps, options, src.language)
        metadata: dict = {"target": gpu, **options.__dict__}
        ttir = src.make_ir(gpu, options, backend.get_codegen_implementation(options), backend.get_module_map(), context)
        for stage in stages:
            ttir = steps[stage](ttir, metadata)


def _load(path: str) -> ModuleType:
    name = "disc_target_" + "".join(ch if ch.isalnum() else "_" for ch in path)[-80:]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m disc.runtime.triton_target", description=__doc__.splitlines()[0])
    parser.add_argument("log", help="a forms log written by the tests (DISC_TRITON_FORMS_LOG)")
    parser.add_argument("--target", default=DEFAULT_TARGET)
    opts = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("run without TRITON_INTERPRET: the interpreter's kernels cannot be compiled", file=sys.stderr)
        return 2
    programs: dict[str, dict[str, dict]] = {}
    with open(opts.log) as f:
        for line in f:
            entry = json.loads(line)
            forms = programs.setdefault(entry["path"], {})
            for form in entry["forms"]:
                forms.setdefault(json.dumps(form, sort_keys=True), form)
    start, failures, count = time.perf_counter(), 0, 0
    for path, forms in sorted(programs.items()):
        for form in forms.values():
            count += 1
            try:
                compile_forms(path, [form], opts.target)
            except Exception as e:  # report every failing form, not only the first
                failures += 1
                print(f"FAILED {path} {form['function']} {form['pointers']} {form['constexprs']}:\n{e}\n", file=sys.stderr)
    print(f"{count} kernel forms of {len(programs)} programs compiled for {opts.target}: {failures} failed ({time.perf_counter() - start:.0f} s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
