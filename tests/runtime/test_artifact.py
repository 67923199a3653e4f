"""Saved programs: ``disc.save`` / ``disc.load`` run a compiled model again without compiling.

The loaded program must give eager's results at every shape, reuse the saved
library only where it was built for this machine, and refuse damaged files
with an error naming them.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import disc
from disc.runtime.artifact import ArtifactError

REPO = Path(__file__).resolve().parents[2]


class Block(nn.Module):
    """Attention-free encoder block with two outputs in a dict: GEMMs, LayerNorm, GELU, a reduction."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(12, 24)
        self.down = nn.Linear(24, 12)
        self.norm = nn.LayerNorm(12)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 12))

    def forward(self, x, mask):
        h = self.norm(x + self.down(torch.nn.functional.gelu(self.up(x))) * self.scale)
        pooled = (h * mask[..., None]).sum(1) / mask.sum(1, keepdim=True).clamp(min=1)
        return {"hidden": h, "pooled": pooled}


DYN = {"x": {0: "b", 1: "s"}, "mask": {0: "b", 1: "s"}}
SHAPES = [(2, 5), (1, 1), (3, 17), (1, 64)]


def _inputs(b: int, s: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(b, s, 12), (torch.rand(b, s) > 0.3).float()


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[nn.Module, Path]:
    torch.manual_seed(0)
    model = Block().eval()
    cm = disc.compile(model, _inputs(2, 5), dynamic=DYN)
    assert cm.report.backend.name == "native-cpu"
    folder = cm.save(tmp_path_factory.mktemp("art") / "block")
    return model, folder


def _check(model: nn.Module, loaded: disc.CompiledModule) -> None:
    for b, s in SHAPES:
        args = _inputs(b, s)
        with torch.no_grad():
            want = model(*args)
        got = loaded(*args)
        assert set(got) == {"hidden", "pooled"}
        for k in want:
            torch.testing.assert_close(got[k], want[k], rtol=1e-4, atol=1e-5)


def _copy(folder: Path, dest: Path) -> Path:
    dest.mkdir()
    for f in folder.iterdir():
        (dest / f.name).write_bytes(f.read_bytes())
    return dest


def test_a_loaded_program_matches_eager_and_reuses_the_saved_library(saved):
    model, folder = saved
    assert sorted(p.name for p in folder.iterdir()) == ["constants.bin", "interface.txt", "manifest.json", "program.cc", "program.disc", "program.so", "ral.so"]
    loaded = disc.load(folder)
    assert loaded.report.source == "disc.load"
    assert loaded.report.backend.native.build.path == folder / "program.so"
    _check(model, loaded)
    with pytest.raises(disc.ShapeError):  # the input checks come with the IR
        loaded(torch.randn(2, 5, 12), torch.ones(2, 6))
    with pytest.raises(disc.InputError, match="missing input 'mask'"):
        loaded(torch.randn(2, 5, 12))


def test_a_loaded_program_keeps_what_explain_says_of_its_capture(tmp_path):
    """An example with 1-sized dynamic dims is traced at grown sizes (trace hints): the saved
    program remembers them, and the program cache, which stores saved programs, shows them on a hit."""
    model = Block().eval()
    cm = disc.compile(model, _inputs(1, 1), dynamic=DYN)
    assert cm.report.hints
    loaded = disc.load(cm.save(tmp_path / "block"))
    assert loaded.report.hints == cm.report.hints
    assert "trace hints (dims grown off 0/1 so nothing specialises): " in disc.explain(loaded)
    _check(model, loaded)


def test_loading_in_a_fresh_process_without_a_compiler(saved):
    # A deployment machine may have no C++ compiler: the saved library is all the program needs.
    _, folder = saved
    code = (
        "import sys, torch, disc\n"
        "m = disc.load(sys.argv[1])\n"
        "assert m.report.backend.native.build.path.name == 'program.so', m.report.backend.native.build.path\n"
        "assert m.executor.ral.path.name == 'ral.so', m.executor.ral.path\n"
        "out = m(torch.randn(3, 7, 12), torch.ones(3, 7))\n"
        "print(tuple(out['hidden'].shape), tuple(out['pooled'].shape))\n"
    )
    env = {**os.environ, "CXX": "/nonexistent/c++", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[-2] == "(3, 7, 12) (3, 12)"


def test_a_library_built_elsewhere_is_rebuilt_here(saved, tmp_path):
    model, folder = saved
    other = _copy(folder, tmp_path / "other")
    text = (other / "interface.txt").read_text()
    host = next(line for line in text.split("\n") if line.startswith("host "))
    text = text.replace(host, "host " + "0" * 64).encode()  # as if another CPU had built it
    (other / "interface.txt").write_bytes(text)
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["files"]["interface.txt"] = {"sha256": hashlib.sha256(text).hexdigest(), "bytes": len(text)}
    (other / "manifest.json").write_text(json.dumps(manifest))
    loaded = disc.load(other)
    assert loaded.report.backend.native.build.path.parent != other
    _check(model, loaded)


def test_a_damaged_library_is_rebuilt_not_loaded(saved, tmp_path, caplog):
    model, folder = saved
    other = _copy(folder, tmp_path / "other")
    lib = bytearray((other / "program.so").read_bytes())
    lib[len(lib) // 2] ^= 0xFF
    (other / "program.so").write_bytes(bytes(lib))
    with caplog.at_level("WARNING", logger="disc"):
        loaded = disc.load(other)
    assert loaded.report.backend.native.build.path.parent != other
    assert "program.so differs from its size or SHA-256 in manifest.json" in caplog.text  # said, not silent
    _check(model, loaded)


@pytest.mark.parametrize("name", ["constants.bin", "program.disc"])
@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_damaged_files_are_refused_by_name(saved, tmp_path, name, damage):
    _, folder = saved
    other = _copy(folder, tmp_path / "other")
    data = bytearray((other / name).read_bytes())
    if damage == "flip":
        data[len(data) // 3] ^= 0x01
    else:
        del data[-5:]
    (other / name).write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=rf"{name} is damaged"):
        disc.load(other)


def test_not_a_saved_program_or_another_format(saved, tmp_path):
    _, folder = saved
    with pytest.raises(ArtifactError, match="is not a saved disc program"):
        disc.load(tmp_path)
    other = _copy(folder, tmp_path / "other")
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["format"] = "disc-artifact/0"
    (other / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="format 'disc-artifact/0'"):
        disc.load(other)
    stray = tmp_path / "stray"
    stray.mkdir()
    (stray / "notes.txt").write_text("mine")
    with pytest.raises(ArtifactError, match="is not a saved disc program; not replacing it"):
        disc.save(disc.load(folder), stray)
    assert (stray / "notes.txt").read_text() == "mine"


def test_saving_again_replaces_the_folder_and_the_reference_backend_round_trips(saved, tmp_path):
    model, folder = saved
    ref = disc.compile(model, _inputs(2, 5), dynamic=DYN, backend="reference")
    target = disc.save(ref, _copy(folder, tmp_path / "again"))
    assert not (target / "program.so").exists()
    loaded = disc.load(target)
    assert loaded.report.backend.name == "reference"
    _check(model, loaded)


class WithFallbacks(nn.Module):
    """Ops PyTorch runs between compiled segments: one disc cannot lower, the nonzero behind a
    data-dependent selection (its count becomes a dim of the ops after it) and a two-output sort."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x):
        h = torch.special.bessel_j0(self.fc(x)) + 1
        keep = h[:, 0] > 1.2
        picked = torch.relu(h[keep]) * 2
        values, order = torch.sort(h, dim=-1)
        return picked.sum(0), values * 3, order


@pytest.mark.parametrize("backend", ["auto", "reference"])
def test_a_program_with_fallbacks_round_trips(tmp_path, backend):
    torch.manual_seed(0)
    model = WithFallbacks().eval()
    cm = disc.compile(model, (torch.randn(5, 6),), dynamic={"x": {0: "n"}}, backend=backend)
    assert cm.report.fallbacks
    folder = cm.save(tmp_path / "f")
    manifest = json.loads((folder / "manifest.json").read_text())
    assert sorted(call["target"] for call in manifest["fallbacks"].values()) == ["aten::sort.default", "aten::sort.default", "aten::special_bessel_j0.default"]
    loaded = disc.load(folder)
    assert loaded.report.backend.name == cm.report.backend.name
    assert loaded.report.fallbacks == cm.report.fallbacks
    for n in (5, 1, 8, 3):
        x = torch.randn(n, 6)
        with torch.no_grad():
            want = model(x)
        got = loaded(x)
        for w, g in zip(want, got):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def test_a_fallback_that_cannot_be_written_is_refused_by_name(tmp_path):
    cm = disc.compile(WithFallbacks(), (torch.randn(5, 6),), dynamic={"x": {0: "n"}})
    key = next(k for k, call in cm.report.fallback_calls.items() if "sort" in str(call.target))
    call = cm.report.fallback_calls[key]
    cm.report.fallback_calls[key] = type(call)(call.target, (*call.args, object()), call.kwargs, call.output_index, call.op_name)
    with pytest.raises(ArtifactError, match="aten.sort.default .* argument of type object"):
        cm.save(tmp_path / "f")
    assert not (tmp_path / "f").exists()


def test_a_saved_fallback_this_torch_lacks_is_an_error(tmp_path):
    cm = disc.compile(WithFallbacks(), (torch.randn(5, 6),), dynamic={"x": {0: "n"}})
    folder = cm.save(tmp_path / "f")
    manifest = json.loads((folder / "manifest.json").read_text())
    for call in manifest["fallbacks"].values():
        call["target"] = call["target"].replace("special_bessel_j0", "no_such_op")
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="no operator aten::no_such_op.default"):
        disc.load(folder)


def test_a_profiling_build_loads_as_saved(tmp_path, monkeypatch):
    """A program built with DISC_PROFILE=1 is saved as one: loading it reuses its library (no
    build) and its per-step counters work."""
    monkeypatch.setenv("DISC_PROFILE", "1")
    monkeypatch.setenv("DISC_PROGRAM_CACHE", "0")
    torch.manual_seed(0)
    model = Block().eval()
    cm = disc.compile(model, _inputs(2, 5), dynamic=DYN)
    folder = cm.save(tmp_path / "profiled")
    assert json.loads((folder / "manifest.json").read_text())["native"]["profile"] is True
    loaded = disc.load(folder)
    assert loaded.executor.native.build.path == folder / "program.so"
    _check(model, loaded)
    assert sum(step["ns"] for step in loaded.executor.step_profile()) > 0


def _swap_same_shaped_names(m: dict) -> None:
    entries = m["constants"]
    i, j = next((i, j) for i in range(len(entries)) for j in range(i + 1, len(entries)) if entries[i]["shape"] == entries[j]["shape"])
    entries[i]["name"], entries[j]["name"] = entries[j]["name"], entries[i]["name"]


MANIFEST_EDITS = {
    # each used to load and answer wrong, or fail with a raw KeyError / AttributeError, or allocate the size it said
    "offset": (lambda m: m["constants"][1].update(offset=m["constants"][1]["offset"] + 4), "offset .* is not where constants.bin holds it"),
    "swapped-names": (_swap_same_shaped_names, "where the IR's order is"),
    "shorter-input-names": (lambda m: m.update(input_names=m["input_names"][:1]), "names 1 inputs; the IR has 2"),
    "huge-size": (lambda m: m["files"]["constants.bin"].update(bytes=10**13), "constants.bin is damaged"),
    "constant-bytes": (lambda m: m["constants"][0].update(bytes=m["constants"][0]["bytes"] * 2), "is not its shape's"),
    "dtype": (lambda m: m["constants"][0].update(dtype="f16"), "is not its shape's|the IR has"),
    "unknown-dtype": (lambda m: m["constants"][0].update(dtype="f99"), "unknown dtype 'f99'"),
    "no-constants": (lambda m: m.pop("constants"), "constants must be a list"),
    "input-names-type": (lambda m: m.update(input_names="x"), "input_names must be distinct strings"),
    "files-type": (lambda m: m.update(files=[]), "files must list program.disc, constants.bin and interface.txt"),
    "unknown-file": (lambda m: m["files"].update({"../../etc/passwd": {"bytes": 0, "sha256": "0" * 64}}), "lists an unknown file"),
}


@pytest.mark.parametrize("edit", sorted(MANIFEST_EDITS))
def test_an_edited_manifest_is_refused_by_name(saved, tmp_path, edit):
    _, folder = saved
    other = _copy(folder, tmp_path / "other")
    manifest = json.loads((other / "manifest.json").read_text())
    change, message = MANIFEST_EDITS[edit]
    change(manifest)
    (other / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match=message):
        disc.load(other)
