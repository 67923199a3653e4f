"""Saved programs run without PyTorch: ``disc_runtime`` (numpy only) and ``disc-run``.

Programs are compiled and saved through the PyTorch frontend here; their outputs at several shapes
(size-1 dims first) are recorded from the compiled module. A second process, in which ``import
torch`` fails, loads the same folders with ``disc_runtime`` and must give those outputs. The C API's
own tests (and the C example) are in ``test_standalone_c.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.utils._pytree as pytree
from test_segments import DETECT_DYNAMIC, DetectLike, DetectWithFallback

import disc
import disc.models as zoo

REPO = Path(__file__).resolve().parents[2]
NO_TORCH = "import sys; sys.modules['torch'] = None\n"  # any `import torch` now raises ImportError

# (name, build, example inputs, dynamic, shapes to run): the zoo's BERT, GPT-2 decode steps and
# ResNet, and a detector whose kept-box count is data-dependent (its nonzero runs natively).
CASES = {
    "bert": ("bert", [{"batch": 1, "seq": 1}, {"batch": 2, "seq": 7}, {"batch": 3, "seq": 17}]),
    "gpt2": ("gpt2", [{"batch": 1, "seq": 1}, {"batch": 1, "seq": 2}, {"batch": 1, "seq": 9}]),
    "resnet": ("resnet", [{"batch": 1, "height": 1, "width": 1}, {"batch": 2, "height": 33, "width": 47}]),
}
DETECT_SHAPES = [(1, 3, 1, 1), (2, 3, 33, 47), (1, 3, 16, 9)]


def _leaves(out: object) -> list[np.ndarray]:
    return [t.detach().numpy() for t in pytree.tree_leaves(out)]


def _record(folder: Path, cm: disc.CompiledModule, names: list[str], cases: list[tuple]) -> None:
    """Save ``cm`` and, per case, its inputs and the outputs the compiled module gives (torch host)."""
    disc.save(cm, folder / "program")
    for k, args in enumerate(cases):
        for name, t in zip(names, args):
            np.save(folder / f"case{k}.in.{name}.npy", t.numpy())
        with torch.no_grad():
            for j, out in enumerate(_leaves(cm(*args))):
                np.save(folder / f"case{k}.out{j}.npy", out)
    (folder / "cases.json").write_text(json.dumps({"inputs": names, "cases": len(cases)}))


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("standalone")
    out = {}
    for name, (entry_name, shapes) in CASES.items():
        entry = zoo.get(entry_name)
        model = entry.build()
        cm = disc.compile(model, entry.inputs(entry.export_shape), dynamic=dict(entry.dynamic))
        assert cm.report.backend.name == "native-cpu", cm.report.backend.reason
        out[name] = root / name
        out[name].mkdir()
        _record(out[name], cm, list(entry.arg_names), [entry.inputs(s, seed=7) for s in shapes])
    torch.manual_seed(0)
    model = DetectLike().eval()
    cm = disc.compile(model, (torch.randn(2, 3, 24, 20),), dynamic=DETECT_DYNAMIC)
    assert cm.report.backend.name == "native-cpu" and cm.executor.native.signature.data_dependent
    out["detector"] = root / "detector"
    out["detector"].mkdir()
    g = torch.Generator().manual_seed(3)
    _record(out["detector"], cm, ["x"], [(torch.randn(*s, generator=g),) for s in DETECT_SHAPES])
    return out


def _run_without_torch(code: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", NO_TORCH + code, *args], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


REPLAY = """
import json, pathlib, numpy as np, disc_runtime
for folder in map(pathlib.Path, sys.argv[1:]):
    meta = json.loads((folder / "cases.json").read_text())
    m = disc_runtime.load(folder / "program")
    assert [t.name for t in m.inputs] == meta["inputs"], m.inputs
    for k in range(meta["cases"]):
        args = [np.load(folder / f"case{k}.in.{n}.npy") for n in meta["inputs"]]
        got = m.run(*args)
        assert len(got) == len(m.outputs)
        for j, g in enumerate(got):
            want = np.load(folder / f"case{k}.out{j}.npy")
            assert g.dtype == want.dtype and g.shape == want.shape, (folder.name, k, j, g.dtype, g.shape, want.dtype, want.shape)
            np.testing.assert_allclose(g, want, rtol=1e-6, atol=1e-6, err_msg=f"{folder.name} case {k} output {j}")
        # by name too
        named = m.run({n: a for n, a in zip(meta["inputs"], args)})
        assert all(np.array_equal(a, b) for a, b in zip(named, got))
    print(folder.name, "ok", len(m.outputs))
assert "torch" not in sys.modules or sys.modules["torch"] is None
"""


def test_saved_programs_run_without_torch_and_match(saved: dict[str, Path]) -> None:
    proc = _run_without_torch(REPLAY, *(str(p) for p in saved.values()))
    assert [line.split()[:2] for line in proc.stdout.split("\n") if line] == [[name, "ok"] for name in saved]


def test_inputs_are_described_and_bad_ones_named(saved: dict[str, Path]) -> None:
    code = """
import numpy as np, disc_runtime
m = disc_runtime.load(sys.argv[1])
print([tuple(t) for t in m.inputs])
ids, mask = np.zeros((2, 7), np.int64), np.ones((2, 8), np.int64)
for args in [(ids, mask), (ids.astype(np.float32), mask[:, :7]), (ids,), (ids[0], mask[0])]:
    try:
        m.run(*args)
    except (disc_runtime.ShapeError, disc_runtime.InputError) as e:
        print(type(e).__name__, e)
"""
    lines = _run_without_torch(code, str(saved["bert"] / "program")).stdout.split("\n")
    assert lines[0] == "[('input_ids', 'i64', ('batch', 'seq')), ('attention_mask', 'i64', ('batch', 'seq'))]"
    assert lines[1] == "ShapeError input 'attention_mask' dim 1 is 8 but must equal input 'input_ids' dim 1 (7)"
    assert lines[2] == "InputError input 'input_ids' has dtype f32, compiled for i64"
    assert lines[3].startswith("InputError expected 2 input(s) ['input_ids', 'attention_mask'], got 1")
    assert lines[4].startswith("InputError input 'input_ids' has rank 1")


def test_disc_run_writes_each_output(saved: dict[str, Path], tmp_path: Path) -> None:
    folder = saved["bert"]
    code = "from disc_runtime.cli import main\nsys.exit(main())"
    args = [str(folder / "program"), "--input", f"input_ids={folder / 'case1.in.input_ids.npy'}"]
    args += ["--input", f"attention_mask={folder / 'case1.in.attention_mask.npy'}", "--output", str(tmp_path / "out"), "--bench", "3"]
    proc = _run_without_torch(code, *args)
    assert "3 calls on " in proc.stdout and "p50" in proc.stdout
    outputs = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert outputs == [f"output{j}.npy" for j in range(len(outputs))] and outputs
    for j in range(len(outputs)):
        np.testing.assert_allclose(np.load(tmp_path / "out" / f"output{j}.npy"), np.load(folder / f"case1.out{j}.npy"), rtol=1e-6, atol=1e-6)


def test_disc_run_reports_bad_input_with_status_2(saved: dict[str, Path], tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.zeros((1, 4, 8, 8), np.float32))  # 4 channels; the detector takes 3
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    code = NO_TORCH + "from disc_runtime.cli import main\nsys.exit(main())"
    proc = subprocess.run([sys.executable, "-c", code, str(saved["detector"] / "program"), str(tmp_path / "x.npy")], capture_output=True, text=True, env=env)
    assert proc.returncode == 2 and "input 'x' dim 1 is 4 but must be 3" in proc.stderr, proc.stderr


def test_a_program_that_needs_torch_says_so_at_save_and_at_load(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = DetectWithFallback().eval()
    cm = disc.compile(model, (torch.randn(2, 3, 24, 20),), dynamic=DETECT_DYNAMIC)
    assert cm.report.fallbacks
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        disc.save(cm, tmp_path / "p")
    said = [str(w.message) for w in caught if "cannot run without PyTorch" in str(w.message)]
    assert said and all(op in said[0] for op in cm.report.fallbacks), [str(w.message) for w in caught]
    code = """
import disc_runtime
try:
    disc_runtime.load(sys.argv[1])
except disc_runtime.LoadError as e:
    print(e)
"""
    out = _run_without_torch(code, str(tmp_path / "p")).stdout
    assert "cannot run standalone: it needs PyTorch for the ops it runs between compiled segments" in out, out
    assert all(op in out for op in cm.report.fallbacks)
    assert disc.load(tmp_path / "p")  # the PyTorch host still runs it


def test_the_pytorch_api_says_what_it_needs_without_torch() -> None:
    code = """
import disc, disc.runtime.ral_build
try:
    disc.compile
except ImportError as e:
    print(e)
"""
    out = _run_without_torch(code).stdout
    assert "disc.compile needs PyTorch, which is not installed here" in out and "disc_runtime" in out


def test_an_interface_that_does_not_describe_its_program_is_refused(saved: dict[str, Path], tmp_path: Path) -> None:
    """Hosts size what they pass the program from interface.txt; an edit that still parses (here: outputs
    said to be data-dependent, so a host would pass an array the program never fills) is caught by the
    signature the program states itself, by both hosts, before any call."""
    import hashlib
    import shutil

    folder = shutil.copytree(saved["bert"] / "program", tmp_path / "p")
    text = (folder / "interface.txt").read_text()
    assert "data_dependent 0\n" in text
    edited = text.replace("data_dependent 0\n", "data_dependent 1\n").encode()
    (folder / "interface.txt").write_bytes(edited)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"]["interface.txt"] = {"sha256": hashlib.sha256(edited).hexdigest(), "bytes": len(edited)}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(disc.ArtifactError, match="interface.txt does not describe program.so"):
        disc.load(folder)
    code = """
import disc_runtime
try:
    disc_runtime.load(sys.argv[1])
except disc_runtime.LoadError as e:
    print(e)
"""
    out = _run_without_torch(code, str(folder)).stdout
    assert "interface.txt does not describe program.so" in out and "data_dependent 0" in out, out


class _Scaled(torch.nn.Module):
    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return x * scale + 1


def test_a_0_d_input_is_taken_as_0_d(tmp_path: Path) -> None:
    # numpy.ascontiguousarray makes a 0-d array 1-d: the runtime once refused every scalar input that way.
    import disc_runtime

    cm = disc.compile(_Scaled(), (torch.randn(2, 3), torch.tensor(2.0)), dynamic={"x": {0: "n", 1: "m"}})
    m = disc_runtime.load(disc.save(cm, tmp_path / "scaled"))
    assert [t.dims for t in m.inputs] == [("n", "m"), ()]
    for shape in [(1, 1), (4, 5)]:
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        (got,) = m.run(x, np.float32(-3.0))
        np.testing.assert_allclose(got, x * -3 + 1, rtol=1e-6)
        (got,) = m.run(x, np.array(0.5, np.float32))
        np.testing.assert_allclose(got, x * 0.5 + 1, rtol=1e-6)
