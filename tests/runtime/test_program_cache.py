"""The program cache: a model compiled before loads its stored program instead of being captured again.

A hit must give eager's results at every shape and bind the model's own parameters; anything
that could change the program (weights, attributes, code, options) must miss; a damaged entry
is replaced, never used.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
import threading
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import disc
from disc.runtime import program_cache
from disc.runtime.artifact import ArtifactError

REPO = Path(__file__).resolve().parents[2]


class Encoder(nn.Module):
    """LayerNorms, GEMMs, GELU and a buffer; the two LayerNorms' weights start equal (CSE merges them)."""

    def __init__(self, eps: float = 1e-5) -> None:
        super().__init__()
        self.up = nn.Linear(12, 24)
        self.down = nn.Linear(24, 12)
        self.norm1 = nn.LayerNorm(12, eps=eps)
        self.norm2 = nn.LayerNorm(12, eps=eps)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 12))

    def forward(self, x):
        h = self.norm1(x + self.down(nn.functional.gelu(self.up(x))) * self.scale)
        return {"hidden": self.norm2(h), "pooled": h.mean(1)}


DYN = {"x": {0: "b", 1: "s"}}
SHAPES = [(2, 5), (1, 1), (3, 17), (1, 64)]


def _model(seed: int = 0, **kw) -> Encoder:
    torch.manual_seed(seed)
    return Encoder(**kw).eval()


def _example() -> tuple[torch.Tensor]:
    return (torch.randn(2, 5, 12),)


def _check(model: nn.Module, compiled: disc.CompiledModule) -> None:
    for b, s in SHAPES:
        x = torch.randn(b, s, 12)
        with torch.no_grad():
            want = model(x)
        got = compiled(x)
        for k in want:
            torch.testing.assert_close(got[k], want[k], rtol=1e-4, atol=1e-5)


@pytest.fixture
def programs(monkeypatch, tmp_path) -> Path:
    """The cache on, its entries in a folder of this test's own."""
    folder = tmp_path / "programs"
    monkeypatch.setenv("DISC_PROGRAM_CACHE", "1")
    monkeypatch.setattr(program_cache, "programs_dir", lambda: folder)
    return folder


def test_a_second_compile_loads_the_program_without_capturing(programs, monkeypatch):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # storing an entry is not the user's disc.save: it says nothing
        first = disc.compile(_model(), _example(), dynamic=DYN)
    assert first.report.cache.startswith("miss; stored as ")
    assert len(list(programs.iterdir())) == 1

    def no_capture(*a, **k):
        raise AssertionError("a hit must not run torch.export")

    monkeypatch.setattr("disc.frontends.torch.export.capture", no_capture)
    model = _model()  # another instance, the same weights
    hit = disc.compile(model, _example(), dynamic=DYN)
    assert hit.report.cache.startswith("hit: loaded ")
    assert hit.report.source == "disc.compile" and hit.report.hints == first.report.hints
    assert hit.report.backend.name == first.report.backend.name == "native-cpu"
    assert "program cache: hit" in disc.explain(hit)
    _check(model, hit)
    # The program reads the model's own parameters: none is copied into the cache or the program.
    ptrs = {t.data_ptr() for t in hit.graph.constants.values()}
    assert model.up.weight.data_ptr() in ptrs and model.scale.data_ptr() in ptrs
    (folder,) = programs.iterdir()
    assert hit.report.cache == f"hit: loaded {folder} (no torch.export, no passes)"
    entry = json.loads((folder / "manifest.json").read_text())
    assert {c["owner_name"] for c in entry["external"]} >= {"up.weight", "down.weight", "scale"}
    assert entry["files"]["constants.bin"]["bytes"] == 0


class Settings:
    """A configuration object that is not a dataclass (as many model libraries' are)."""

    def __init__(self, slope: float) -> None:
        self.slope = slope
        self.names = ("a", "b")


class Configured(nn.Module):
    def __init__(self, slope: float) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.settings = Settings(slope)
        self.act = self.leaky  # a bound method

    def leaky(self, x):
        return nn.functional.leaky_relu(x, self.settings.slope)

    def forward(self, x):
        return self.act(self.fc(x))


def test_a_hit_reports_the_capture_it_did_not_run(programs):
    """1-sized dynamic dims are traced at grown sizes: a hit still says so (trace hints), as the
    compilation that stored the program did."""
    first = disc.compile(_model(), (torch.randn(1, 1, 12),), dynamic=DYN)
    assert first.report.hints
    hit = disc.compile(_model(), (torch.randn(1, 1, 12),), dynamic=DYN)
    assert hit.report.cache.startswith("hit: ")
    assert hit.report.hints == first.report.hints
    assert "trace hints (dims grown off 0/1" in disc.explain(hit)


def test_a_configuration_object_is_keyed_by_its_attributes(programs):
    def compiled(slope: float) -> tuple[nn.Module, disc.CompiledModule]:
        torch.manual_seed(0)
        model = Configured(slope).eval()
        return model, disc.compile(model, (torch.randn(3, 8),), dynamic={"x": {0: "n"}})

    assert compiled(0.1)[1].report.cache.startswith("miss")
    assert compiled(0.1)[1].report.cache.startswith("hit")
    model, other = compiled(0.3)
    assert other.report.cache.startswith("miss")
    x = torch.randn(5, 8)
    torch.testing.assert_close(other(x), model(x).detach())


@pytest.mark.parametrize(
    "change",
    ["weight", "merged weight", "attribute", "training", "dynamic", "example shape", "backend"],
)
def test_what_could_change_the_program_misses(programs, change):
    disc.compile(_model(), _example(), dynamic=DYN)
    model, example, kw = _model(), _example(), {"dynamic": DYN}
    with torch.no_grad():
        if change == "weight":
            model.up.bias[3] += 0.5
        elif change == "merged weight":  # equal to norm1's at compile time (CSE shared them), not now
            model.norm2.weight[0] = 2.0
    if change == "attribute":
        model = _model(eps=1e-3)
    elif change == "training":
        model.train()
    elif change == "dynamic":
        kw["dynamic"] = {"x": {1: "s"}}
    elif change == "example shape":
        example = (torch.randn(2, 6, 12),)
    elif change == "backend":
        kw["backend"] = "reference"
    compiled = disc.compile(model, example, **kw)
    assert compiled.report.cache.startswith("miss; stored as "), compiled.report.cache
    assert len(list(programs.iterdir())) == 2
    model.eval()  # dropout-free either way; eager reference in inference mode
    if change != "dynamic":
        _check(model, compiled)


def test_editing_the_models_source_misses(programs, tmp_path, monkeypatch):
    src = tmp_path / "src"
    src.mkdir()
    module = src / "cached_model.py"
    body = """
        import torch
        from torch import nn

        class Scaled(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(8, 8)

            def forward(self, x):
                return torch.tanh(self.fc(x)) * {factor}
    """
    module.write_text(textwrap.dedent(body.format(factor=2.0)))
    monkeypatch.syspath_prepend(str(src))
    mod = importlib.import_module("cached_model")
    try:
        torch.manual_seed(0)
        assert disc.compile(mod.Scaled().eval(), (torch.randn(3, 8),), dynamic={"x": {0: "n"}}).report.cache.startswith("miss")
        module.write_text(textwrap.dedent(body.format(factor=3.0)))
        os.utime(module, None)
        mod = importlib.reload(mod)
        torch.manual_seed(0)
        model = mod.Scaled().eval()
        compiled = disc.compile(model, (torch.randn(3, 8),), dynamic={"x": {0: "n"}})
        assert compiled.report.cache.startswith("miss"), compiled.report.cache
        x = torch.randn(5, 8)
        torch.testing.assert_close(compiled(x), model(x).detach(), rtol=1e-4, atol=1e-5)
    finally:
        sys.modules.pop("cached_model", None)


def _class_from_text(text: str, filename: str | None) -> type:
    """The class ``M`` of ``text``, defined as ``python -c`` or ``exec`` define one (no file holds it)
    or, given a filename, as a notebook cell does (the text in linecache, the file not on disk)."""
    namespace = {"torch": torch, "nn": nn, "__name__": "__main__"}
    if filename is None:
        exec(text, namespace)
    else:
        import linecache

        linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
        exec(compile(text, filename, "exec"), namespace)
    return namespace["M"]


CELL = """
class M(nn.Module):
    def forward(self, x):
        return x * {factor}
"""


def test_two_classes_of_one_name_without_a_file_never_share_a_program(programs, tmp_path):
    # Both are __main__.M: keyed by their name alone, the second loaded the first's program.
    for factor in (2.0, 3.0):
        model = _class_from_text(CELL.format(factor=factor), None)()
        compiled = disc.compile(model, (torch.ones(3, 4),), dynamic={"x": {0: "n"}})
        assert compiled.report.cache == "not used: __main__.M has no source file or text to key its code by"
        torch.testing.assert_close(compiled(torch.ones(1, 4)), torch.full((1, 4), factor))
    # A notebook cell's class is keyed by its text: the same text hits, another misses.
    for k, (factor, outcome) in enumerate([(2.0, "miss"), (2.0, "hit"), (5.0, "miss")]):
        model = _class_from_text(CELL.format(factor=factor), str(tmp_path / f"cell{k}.py"))()
        compiled = disc.compile(model, (torch.ones(3, 4),), dynamic={"x": {0: "n"}})
        assert compiled.report.cache.startswith(outcome), (k, compiled.report.cache)
        torch.testing.assert_close(compiled(torch.ones(1, 4)), torch.full((1, 4), factor))


def test_a_damaged_entry_is_replaced_not_used(programs):
    disc.compile(_model(), _example(), dynamic=DYN)
    (entry,) = programs.iterdir()
    ir = entry / "program.disc"
    ir.write_text(ir.read_text() + "garbage")
    model = _model()
    compiled = disc.compile(model, _example(), dynamic=DYN)
    assert compiled.report.cache.startswith("miss: the entry could not be loaded"), compiled.report.cache
    assert "program.disc is damaged" in compiled.report.cache
    _check(model, compiled)
    again = disc.compile(model, _example(), dynamic=DYN)
    assert again.report.cache.startswith("hit"), again.report.cache
    _check(model, again)


def test_an_entry_is_not_a_saved_program(programs):
    disc.compile(_model(), _example(), dynamic=DYN)
    (entry,) = programs.iterdir()
    with pytest.raises(ArtifactError, match="program-cache entry.*parameters stay in the model"):
        disc.load(entry)


class Hooked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.lock = threading.Lock()

    def forward(self, x):
        return self.fc(x).relu()


@pytest.mark.parametrize("what", ["hook", "attribute"])
def test_a_model_the_key_cannot_describe_is_compiled_and_says_why(programs, what):
    torch.manual_seed(0)
    model = Hooked().eval()
    if what == "hook":
        del model.lock
        model.fc.register_forward_hook(lambda m, i, o: o * 2)
        reason = "not used: submodule 'fc' has forward hooks"
    else:
        reason = "not used: (root).lock is a _thread.lock, which the key cannot describe"
    compiled = disc.compile(model, (torch.randn(3, 4),), dynamic={"x": {0: "n"}})
    assert compiled.report.cache == reason
    assert not programs.exists()
    x = torch.randn(5, 4)
    torch.testing.assert_close(compiled(x), model(x).detach())


def test_an_error_while_keying_is_reported_and_the_model_compiled(programs, monkeypatch):
    def broken(tensors):
        raise RuntimeError("unreadable storage")

    monkeypatch.setattr(program_cache, "_tensor_digests", broken)
    model = _model()
    compiled = disc.compile(model, _example(), dynamic=DYN)
    assert compiled.report.cache == "not used: RuntimeError while computing the key: unreadable storage"
    _check(model, compiled)


def test_off_by_argument(programs):
    compiled = disc.compile(_model(), _example(), dynamic=DYN, cache=False)
    assert compiled.report.cache == "off" and not programs.exists()


class WithFallbacks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x):
        h = torch.special.bessel_j0(self.fc(x)) + 1
        picked = torch.relu(h[h[:, 0] > 1.2]) * 2
        values, order = torch.sort(h, dim=-1)
        return picked.sum(0), values * 3, order


def test_a_program_with_fallbacks_and_segments_hits(programs):
    torch.manual_seed(0)
    disc.compile(WithFallbacks().eval(), (torch.randn(5, 6),), dynamic={"x": {0: "n"}})
    torch.manual_seed(0)
    model = WithFallbacks().eval()
    hit = disc.compile(model, (torch.randn(5, 6),), dynamic={"x": {0: "n"}})
    assert hit.report.cache.startswith("hit"), hit.report.cache
    assert hit.report.fallbacks
    for n in (5, 1, 8, 3):
        x = torch.randn(n, 6)
        with torch.no_grad():
            want = model(x)
        for w, g in zip(want, hit(x)):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


SCRIPT = """
import sys, torch
sys.path.insert(0, {tests!r})
import disc
from runtime.test_program_cache import _model, _example, DYN
model = _model()
compiled = disc.compile(model, _example(), dynamic=DYN)
x = torch.randn(3, 7, 12)
with torch.no_grad():
    err = (compiled(x)["hidden"] - model(x)["hidden"]).abs().max().item()
print(compiled.report.cache.split(":")[0].split(";")[0], err)
"""


def test_a_fresh_process_compiling_the_same_model_hits(tmp_path):
    env = {**os.environ, "DISC_CACHE_DIR": str(tmp_path / "cache"), "DISC_PROGRAM_CACHE": "1", "PYTHONPATH": str(REPO)}
    script = SCRIPT.format(tests=str(REPO / "tests"))
    runs = [subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300) for _ in range(2)]
    outcomes = []
    for r in runs:
        assert r.returncode == 0, r.stderr[-2000:]
        what, err = r.stdout.split()[-2:]
        outcomes.append(what)
        assert float(err) < 1e-4
    assert outcomes == ["miss", "hit"]


def test_an_entry_whose_weight_names_were_swapped_is_not_run(programs):
    """Issue 48: swapping the owner names of two same-shaped weights in an entry's manifest made every later
    process run the program on the wrong weights, as a cache hit. Each external weight is bound to the SHA-256
    of the bytes it was compiled with (the key computes it anyway): the edited entry is refused and compiled again."""
    first = disc.compile(_model(), _example(), dynamic=DYN)
    assert first.report.cache.startswith("miss; stored as ")
    (folder,) = programs.iterdir()
    path = folder / "manifest.json"
    manifest = json.loads(path.read_text())
    entries = {c["owner_name"]: c for c in manifest["external"]}
    assert all("sha256" in c for c in entries.values())
    a, b = entries["scale"], entries["down.bias"]  # both f32[12]
    assert (a["dtype"], a["shape"]) == (b["dtype"], b["shape"])
    a["owner_name"], b["owner_name"] = b["owner_name"], a["owner_name"]
    path.write_text(json.dumps(manifest))
    model = _model()
    again = disc.compile(model, _example(), dynamic=DYN)
    assert again.report.cache.startswith("miss: the entry could not be loaded"), again.report.cache
    assert "whose bytes are not the ones it was compiled with" in again.report.cache
    _check(model, again)
