"""The C++ toolchain: cache hits and misses, corrupt entries, compile errors, progress."""

import ctypes
import json
import subprocess
from pathlib import Path

import pytest

from disc.codegen.cpu import toolchain
from disc.errors import CompileError

SOURCE = 'extern "C" int disc_answer() { return %d; }\n'


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DISC_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def answer(path) -> int:
    return ctypes.CDLL(str(path)).disc_answer()


def test_miss_then_hit(cache, monkeypatch):
    first = toolchain.build(SOURCE % 1, "answer")
    assert not first.cached and first.path.is_file() and first.path.parent.parent == cache
    assert first.source_path.read_text() == SOURCE % 1  # readable source kept next to the library

    def no_compiler(*args, **kwargs):
        raise AssertionError("the compiler ran on a cache hit")

    monkeypatch.setattr(toolchain, "_compile", no_compiler)
    second = toolchain.build(SOURCE % 1, "answer")
    assert second.cached and second.path == first.path and second.key == first.key
    assert answer(second.path) == 1
    assert toolchain.build(SOURCE % 1, "answer").path == first.path


def test_key_covers_source_and_flags():
    base = toolchain.build(SOURCE % 2, "answer")
    assert toolchain.build(SOURCE % 3, "answer").key != base.key
    assert toolchain.build(SOURCE % 2, "answer", flags=["-DX=1"]).key != base.key
    assert toolchain.build(SOURCE % 2, "answer", libs=["-lm"]).key != base.key


@pytest.mark.parametrize("damage", ["garbage", "truncated", "sidecar", "no_sidecar"])
def test_corrupt_entry_is_rebuilt(damage):
    built = toolchain.build(SOURCE % 4, "answer")
    sidecar = built.path.with_name(built.path.name + ".json")
    if damage == "garbage":
        built.path.write_bytes(b"\x7fELF" + b"garbage" * 100)
    elif damage == "truncated":
        built.path.write_bytes(built.path.read_bytes()[:200])
    elif damage == "sidecar":
        meta = json.loads(sidecar.read_text())
        sidecar.write_text(json.dumps({**meta, "sha256": "0" * 64}))
    else:
        sidecar.unlink()
    again = toolchain.build(SOURCE % 4, "answer")
    assert not again.cached and again.path == built.path
    assert toolchain.build(SOURCE % 4, "answer").cached
    # Loaded only now, after the rebuild (dlopen would reuse an already-loaded path).
    assert answer(again.path) == 4


def test_elf_check_rejects_non_libraries():
    assert not toolchain._is_shared_elf(b"not an elf" * 10)
    good = toolchain.build(SOURCE % 5, "answer").path.read_bytes()
    assert toolchain._is_shared_elf(good)
    assert not toolchain._is_shared_elf(good[:16] + (2).to_bytes(2, "little") + good[18:])  # ET_EXEC


def test_compile_error_names_the_source():
    with pytest.raises(CompileError) as info:
        toolchain.build('extern "C" int broken( { return; }\n', "broken")
    message = str(info.value)
    assert "broken.cc" in message and "error" in message
    source = message.split("source: ", 1)[1].split("\n", 1)[0]
    assert "int broken(" in open(source).read()


def test_slow_compiles_report_progress(monkeypatch):
    monkeypatch.setattr(toolchain, "SLOW_COMPILE_S", 0.0)
    seen: list[str] = []
    toolchain.build(SOURCE % 6 + "\n// two more lines\n", "slow", progress=seen.append)
    assert seen[0].startswith("disc: compiling slow (") and seen[0].endswith(" lines)...")
    assert seen[1].startswith("disc: compiled slow in ")


def test_concurrent_builds_of_one_source(run_in_threads):
    results = []

    def worker(_: int) -> None:
        results.append(toolchain.build(SOURCE % 7, "shared"))

    run_in_threads(worker, 4)
    assert len({r.path for r in results}) == 1
    assert toolchain.build(SOURCE % 7, "shared").cached
    assert answer(results[0].path) == 7
    assert not [p for p in results[0].path.parent.iterdir() if p.name.endswith(".tmp")]


def test_compiler_selection(monkeypatch):
    monkeypatch.setenv("CXX", "no-such-compiler-disc")
    with pytest.raises(CompileError, match="CXX"):
        toolchain.find_compiler()
    monkeypatch.delenv("CXX")
    assert toolchain.find_compiler()


def test_dnnl_can_be_disabled(monkeypatch):
    monkeypatch.setenv("DISC_NO_DNNL", "1")
    assert toolchain.have_dnnl() is False
    monkeypatch.delenv("DISC_NO_DNNL")
    if not toolchain.DNNL_HEADER.is_file() and toolchain.dnnl_root() is None:
        assert toolchain.have_dnnl() is False
    else:  # headers present: True exactly when the link probe builds
        assert toolchain.have_dnnl() is toolchain._dnnl_links(str(toolchain.dnnl_root() or ""))


def _fake_dnnl(root, major: int) -> None:
    """An install whose headers say oneDNN ``major``.0 (no library: a probe can only compile)."""
    inc = root / "include" / "oneapi" / "dnnl"
    inc.mkdir(parents=True)
    (inc / "dnnl.h").write_text(f"#define DNNL_VERSION_MAJOR {major}\ntypedef struct {{ int major; }} dnnl_version_t;\nconst dnnl_version_t* dnnl_version();\n")


def test_dnnl_root_from_the_environment_and_v2_refused(monkeypatch, tmp_path):
    monkeypatch.delenv("DISC_NO_DNNL", raising=False)
    old = tmp_path / "v2"
    _fake_dnnl(old, 2)
    monkeypatch.setenv("DISC_DNNL_ROOT", str(old))
    assert toolchain.dnnl_root() == old
    flags, libs = toolchain.dnnl_build_args()
    assert f"-I{old / 'include'}" in flags and f"-L{old / 'lib'}" in libs
    # The RAL is written against the v3 API: a 2.x install must select the builtin fallbacks.
    assert toolchain.have_dnnl() is False
    # A root without the header is not taken; the search goes on (this environment, then none).
    monkeypatch.setenv("DISC_DNNL_ROOT", str(tmp_path / "missing"))
    assert toolchain.dnnl_root() != tmp_path / "missing"


def _sectioned(values: list[int]) -> str:
    """A source of one common part and a section per value (a function returning it), plus a sum."""
    common = "static int twice(int x) { return 2 * x; }\n" + "".join(f"int part{i}();\n" for i in range(len(values)))
    sections = [f"int part{i}() {{ return twice({v}); }}" for i, v in enumerate(values)]
    total = 'extern "C" int disc_answer() { return ' + " + ".join(f"part{i}()" for i in range(len(values))) + "; }"
    marker = f"\n{toolchain.UNIT_MARKER}\n"
    return common + marker + marker.join([*sections, total]) + "\n"


def test_split_units_balances_sections_and_keeps_their_order():
    source = _sectioned([1, 2, 3, 4, 5])
    assert toolchain.split_units(source, 1) == [source]
    assert toolchain.split_units("int x;\n", 4) == ["int x;\n"]  # no markers: one unit
    common = source.split(f"\n{toolchain.UNIT_MARKER}\n")[0]
    sections = source.split(f"\n{toolchain.UNIT_MARKER}\n")[1:]
    for jobs in (2, 3, 6, 20):
        units = toolchain.split_units(source, jobs)
        assert len(units) == min(jobs, len(sections))
        seen = []
        for unit in units:
            assert unit.startswith(common)
            mine = [s for s in sections if s in unit]
            assert [unit.index(s) for s in mine] == sorted(unit.index(s) for s in mine)  # source order
            seen += mine
        assert sorted(seen) == sorted(sections)  # every section in exactly one unit
    sizes = [len(u) - len(common) for u in toolchain.split_units(_sectioned([1] * 8), 2)]
    assert abs(sizes[0] - sizes[1]) <= max(len(s) for s in sections)


@pytest.mark.parametrize("jobs", [1, 2, 3])
def test_sectioned_source_builds_at_any_unit_count(monkeypatch, jobs):
    monkeypatch.setattr(toolchain, "_jobs", lambda: jobs)
    monkeypatch.setattr(toolchain, "MIN_SPLIT_CHARS", 0)
    compiles, real = [], toolchain._compile
    monkeypatch.setattr(toolchain, "_compile", lambda cmds, *a: compiles.append(len(cmds)) or real(cmds, *a))
    built = toolchain.build(_sectioned([10, 20, 30, 40 + jobs]), "units")
    assert compiles == [jobs]  # one compiler process per unit, run together
    assert answer(built.path) == 2 * (100 + jobs)
    monkeypatch.setattr(toolchain, "MIN_SPLIT_CHARS", 10**6)
    compiles.clear()
    toolchain.build(_sectioned([1, 2, 3, jobs]), "small")
    assert compiles == [1]  # a small source is one unit
    assert sorted(p.name for p in built.path.parent.iterdir()) == ["units.cc", "units.so", "units.so.json"]  # units cleaned up


def test_an_error_in_one_unit_names_that_unit(monkeypatch):
    monkeypatch.setattr(toolchain, "_jobs", lambda: 2)
    monkeypatch.setattr(toolchain, "MIN_SPLIT_CHARS", 0)
    source = _sectioned([1, 2, 3]).replace("return twice(2);", "return twice(2) +;")
    with pytest.raises(CompileError) as info:
        toolchain.build(source, "broken_unit")
    unit = str(info.value).split("source: ", 1)[1].split("\n", 1)[0]
    assert ".unit" in unit and "twice(2) +;" in open(unit).read() and "error" in str(info.value)


# -- the precompiled standard headers ---------------------------------------------------
PRELUDE_SOURCE = """// a generated program
#include <vector>
#include <cmath>
#include "ral.h"
#include <cstdio>
extern "C" int disc_answer() { std::vector<int> v(%d, 1); return (int)std::sqrt((double)v.size() * v.size()); }
"""
needs_gcc = pytest.mark.skipif(not toolchain._is_gcc(toolchain.find_compiler()), reason="precompiled headers are used with GCC only")


def test_leading_system_includes_stop_at_the_first_other_line():
    assert toolchain.leading_system_includes(PRELUDE_SOURCE) == "#include <vector>\n#include <cmath>"
    assert toolchain.leading_system_includes('#include "ral.h"\n#include <vector>\n') == ""


def record_commands(monkeypatch) -> list:
    seen = []
    real = toolchain._compile

    def recording(cmds, *args):
        seen.append(cmds)
        return real(cmds, *args)

    monkeypatch.setattr(toolchain, "_compile", recording)
    return seen


@needs_gcc
def test_programs_load_the_precompiled_prelude(monkeypatch):
    seen = record_commands(monkeypatch)
    built = toolchain.build(PRELUDE_SOURCE % 6, "answer")
    assert answer(built.path) == 6
    (cmd,) = seen[-1]
    assert cmd[1] == "-include"
    header = cmd[2]
    assert open(header).read() == "#include <vector>\n#include <cmath>\n"
    # GCC marks a precompiled header it loaded with "!" in its -H listing (and parses the text otherwise).
    flags = cmd[: next(i for i, arg in enumerate(cmd) if arg.endswith(".cc"))]  # the command up to its source
    probe = subprocess.run([*flags, "-H", "-fsyntax-only", "-x", "c++", "-"], input="int x;\n", capture_output=True, text=True)
    assert f"! {header}.gch" in probe.stderr, probe.stderr[:300]
    # The next program with the same includes and flags reuses it without building it again.
    before = open(header + ".gch", "rb").read(64), Path(header + ".gch").stat().st_mtime_ns
    assert answer(toolchain.build(PRELUDE_SOURCE % 7, "answer").path) == 7
    assert seen[-1][0][2] == header
    assert (open(header + ".gch", "rb").read(64), Path(header + ".gch").stat().st_mtime_ns) == before


@needs_gcc
@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_damaged_precompiled_prelude_costs_time_not_the_build(monkeypatch, damage):
    seen = record_commands(monkeypatch)
    toolchain.build(PRELUDE_SOURCE % 8, "answer")
    gch = Path(seen[-1][0][2] + ".gch")
    data = gch.read_bytes()
    # Truncated keeps GCC's header and passes the size check only because the size file is cut too:
    # GCC then fails to read it, and the build is retried without it.
    if damage == "truncated":
        gch.write_bytes(data[:200_000])
        gch.with_name(gch.name + ".size").write_text("200000")
    else:
        gch.write_bytes(b"not a precompiled header")
    built = toolchain.build(PRELUDE_SOURCE % 9, "answer")
    assert answer(built.path) == 9
    if damage == "truncated":
        assert [len(c) for c in seen[-2:]] == [1, 1] and seen[-1][0][1] != "-include"  # retried plainly
        assert not gch.exists()  # withdrawn; the next build makes it again
    assert answer(toolchain.build(PRELUDE_SOURCE % 10, "answer").path) == 10
    # Made again, whole (GCC's output differs by a few bytes from build to build).
    assert abs(gch.stat().st_size - len(data)) < 10_000
    assert gch.with_name(gch.name + ".size").read_text() == str(gch.stat().st_size)


def test_prelude_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("DISC_PCH", "0")
    seen = record_commands(monkeypatch)
    assert answer(toolchain.build(PRELUDE_SOURCE % 11, "answer").path) == 11
    assert "-include" not in seen[-1][0]


def test_files_of_abandoned_builds_are_swept(cache, monkeypatch):
    # A process killed mid-build left its temporary library and split units in the cache forever.
    import os
    import threading
    import time

    entry = cache / "0123abcd"
    entry.mkdir(parents=True)
    old = [entry / ".program.k3j2.so.tmp", entry / ".program.k3j2.unit0.cc", entry / ".program.k3j2.unit0.o", entry / ".prelude.x1.gch.tmp"]
    fresh = entry / ".program.zz9.so.tmp"  # a build in progress in another process
    kept = entry / "program.so"
    for path in [*old, fresh, kept]:
        path.write_bytes(b"x")
    hour_ago = time.time() - toolchain.STALE_SECONDS - 60
    for path in [*old, kept]:
        os.utime(path, (hour_ago, hour_ago))
    monkeypatch.setattr(toolchain, "_swept", set())
    toolchain.build(SOURCE % 3, "answer")
    assert not any(p.exists() for p in old)
    assert fresh.exists() and kept.exists()
    assert toolchain.sweep_stale_files(cache) == 0  # once per process and cache
    # ... and once a day over all processes: the next process within the day lists nothing.
    assert (cache / ".last-sweep").is_file()
    later = entry / ".program.k4.so.tmp"
    later.write_bytes(b"x")
    os.utime(later, (hour_ago, hour_ago))
    monkeypatch.setattr(toolchain, "_swept", set())
    toolchain.build(SOURCE % 3, "answer")
    assert later.exists() and not [t for t in threading.enumerate() if "sweep" in t.name]
    os.utime(cache / ".last-sweep", (time.time() - toolchain.SWEEP_EVERY - 60,) * 2)
    monkeypatch.setattr(toolchain, "_swept", set())
    toolchain.build(SOURCE % 3, "answer")
    assert not later.exists()


def test_a_cache_others_can_write_is_refused(cache, monkeypatch):
    # A world-writable cache served a planted library to another user's process.
    import os

    cache.mkdir(parents=True)
    monkeypatch.setattr(toolchain, "_private", set())
    os.chmod(cache, 0o777)
    with pytest.raises(CompileError, match="writable by every user: a library planted there"):
        toolchain.build(SOURCE % 4, "answer")
    os.chmod(cache, 0o775)  # group-writable (a user-private group's umask) is fine
    assert answer(toolchain.build(SOURCE % 4, "answer").path) == 4
