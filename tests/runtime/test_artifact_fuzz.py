"""Saved folders with random damage: every load ends in a named error or a right answer.

Byte flips and truncations of each file, and edits of manifest.json's fields to random JSON
values (hypothesis draws them; a failing case is shrunk and printed). Never a raw exception
(KeyError, TypeError, ...), a hang or an answer that differs from the model's.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import disc
from disc.errors import DiscError
from disc.ir.parser import IRParseError


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(6, 6), nn.Linear(6, 6)  # two same-shaped weights and biases

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x))).softmax(-1)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[nn.Module, Path, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = Tiny().eval()
    cm = disc.compile(model, (torch.randn(3, 6),), dynamic={"x": {0: "n"}}, backend="reference")
    folder = cm.save(tmp_path_factory.mktemp("fuzz") / "tiny")
    x = torch.randn(5, 6)
    with torch.no_grad():
        want = model(x)
    return model, folder, x, want


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


def _paths(value, prefix=()):
    """Every (path, value) inside a JSON document."""
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*prefix, i))


def _load_and_check(folder: Path, x: torch.Tensor, want: torch.Tensor) -> None:
    try:
        loaded = disc.load(folder)
    except (DiscError, IRParseError):
        return  # a named error: what damage must give
    got = loaded(x)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6), "a damaged folder loaded and answered wrong"


SETTINGS = settings(max_examples=75, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture], derandomize=True)


@SETTINGS
@given(name=st.sampled_from(["manifest.json", "program.disc", "constants.bin"]), where=st.floats(0, 1), how=st.sampled_from(["flip", "truncate", "append"]))
def test_damaged_bytes(saved, tmp_path_factory, name, where, how):
    _, folder, x, want = saved
    other = Path(shutil.copytree(folder, tmp_path_factory.mktemp("d") / "tiny"))
    data = bytearray((other / name).read_bytes())
    at = min(int(where * len(data)), len(data) - 1)
    if how == "flip":
        data[at] ^= 0x55
    elif how == "truncate":
        data = data[:at]
    else:
        data += b"\0" * (at % 7 + 1)
    (other / name).write_bytes(bytes(data))
    _load_and_check(other, x, want)


@SETTINGS
@given(pick=st.floats(0, 1), value=JSON_VALUES)
def test_edited_manifest_fields(saved, tmp_path_factory, pick, value):
    _, folder, x, want = saved
    other = Path(shutil.copytree(folder, tmp_path_factory.mktemp("m") / "tiny"))
    manifest = json.loads((other / "manifest.json").read_text())
    paths = [p for p in _paths(manifest) if p]
    path = paths[min(int(pick * len(paths)), len(paths) - 1)]
    target = manifest
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    (other / "manifest.json").write_text(json.dumps(manifest))
    _load_and_check(other, x, want)
