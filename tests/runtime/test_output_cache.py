"""Large outputs of native programs reuse freed outputs' memory (the RAL's OutputCache).

What must hold: the values are eager's at every shape; a freed output's block serves the next
call of about its size; a block never returns while any view of its tensor lives; the cache keeps
at most its limit of blocks and gives them all back on `disc.release_memory()`.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import disc
from disc.runtime.ral import OutputCache, load_ral, open_ral

MB = 1 << 20


class ResidualNorm(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        return self.norm(x + r) * 2


HIDDEN = 1024  # a row is 4 KiB, so 256 rows make the 1 MiB at which outputs come from the cache


@pytest.fixture(scope="module")
def compiled():
    torch.manual_seed(0)
    model = ResidualNorm(HIDDEN).eval()
    with torch.no_grad():
        model.norm.weight.normal_()
        model.norm.bias.normal_()
    example = (torch.randn(300, HIDDEN), torch.randn(300, HIDDEN))
    cm = disc.compile(model, example, dynamic={"x": {0: "n"}, "r": {0: "n"}}, backend="native")
    return model, cm


@pytest.fixture
def cache() -> OutputCache:
    outputs = load_ral().outputs
    if outputs is None:
        pytest.skip("this RAL has no output cache")
    outputs.release()
    old = outputs.set_limit(4)
    yield outputs
    outputs.set_limit(old)
    outputs.release()


def _inputs(rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(rows, HIDDEN), torch.randn(rows, HIDDEN)


@pytest.mark.parametrize("rows", [1, 255, 256, 257, 300, 1031])
def test_outputs_equal_eager_below_and_above_the_cache_threshold(compiled, cache, rows):
    model, cm = compiled
    with torch.no_grad():
        for _ in range(3):  # the first call allocates, the later ones reuse the freed block
            args = _inputs(rows)
            got = cm(*args)
            torch.testing.assert_close(got, model(*args), rtol=1e-4, atol=1e-4)
            assert got.shape == (rows, HIDDEN) and got.is_contiguous()


def test_a_freed_output_serves_the_next_call_and_small_ones_bypass_the_cache(compiled, cache):
    _, cm = compiled
    before = cache.stats()
    with torch.no_grad():
        first = cm(*_inputs(512))  # 2 MiB
        address = first.data_ptr()
        del first
        assert cache.stats()["blocks"] == 1
        again = cm(*_inputs(400))  # 1.6 MiB: at least half the block, so it takes it
        assert again.data_ptr() == address
        small = cm(*_inputs(8))  # 32 KiB: torch.empty
        del small
    after = cache.stats()
    assert after["hits"] - before["hits"] == 1
    assert after["misses"] - before["misses"] == 1
    assert after["blocks"] == 0  # `again` holds the only block


def test_a_block_never_serves_a_request_under_half_its_size(compiled, cache):
    _, cm = compiled
    with torch.no_grad():
        big = cm(*_inputs(2048))  # 8 MiB
        address = big.data_ptr()
        del big
        small = cm(*_inputs(300))  # 1.2 MiB would waste over half of the 8 MiB block
    assert small.data_ptr() != address
    assert cache.stats()["blocks"] == 1


def test_a_larger_request_frees_the_cached_blocks_too_small_for_it(compiled, cache):
    _, cm = compiled
    with torch.no_grad():
        for rows in (1100, 300):
            cm(*_inputs(rows))  # returned to the cache at once: 4.4 and 1.2 MB blocks (too big for 1.2)
        assert cache.stats()["blocks"] == 2
        big = cm(*_inputs(2000))  # 8 MB: neither serves it, and neither is kept beside it
        assert cache.stats()["blocks"] == 0
        del big
    assert cache.stats()["blocks"] == 1


def test_a_live_view_keeps_its_block_out_of_the_cache(compiled, cache):
    model, cm = compiled
    with torch.no_grad():
        out = cm(*_inputs(512))
        row = out[7]
        kept = row.clone()
        address = out.data_ptr()
        del out  # the tensor is gone, its storage is not: `row` still reads it
        assert cache.stats()["blocks"] == 0
        args = _inputs(512)
        other = cm(*args)
        assert other.data_ptr() != address
        assert torch.equal(row, kept)  # the second call wrote elsewhere
        torch.testing.assert_close(other, model(*args), rtol=1e-4, atol=1e-4)
        del row
        assert cache.stats()["blocks"] == 1


def test_the_cache_keeps_at_most_its_limit_and_release_frees_everything(compiled, cache):
    _, cm = compiled
    cache.set_limit(2)
    with torch.no_grad():
        outs = [cm(*_inputs(rows)) for rows in (300, 700, 1500, 3100)]  # four sizes, none fits another
    while outs:
        outs.pop(0)  # freed smallest first
    assert cache.stats()["blocks"] == 2
    assert cache.stats()["bytes"] >= (1500 + 3100) * HIDDEN * 4  # the two returned last are kept
    freed = disc.release_memory()
    assert freed >= (1500 + 3100) * HIDDEN * 4
    assert cache.stats() | {"hits": 0, "misses": 0} == {"blocks": 0, "bytes": 0, "hits": 0, "misses": 0}
    cache.set_limit(0)
    with torch.no_grad():
        del_me = cm(*_inputs(300))
    del del_me
    assert cache.stats()["blocks"] == 0  # limit 0: every freed output goes back to the OS


def test_outputs_of_every_dtype_view_the_block_with_their_own_type(cache):
    for dtype in (torch.float32, torch.float64, torch.int64, torch.int32, torch.bool, torch.uint8):
        t = cache.empty((3, MB // 3 + 1), dtype)
        assert t.dtype == dtype and t.shape == (3, MB // 3 + 1) and t.is_contiguous()
        t.fill_(1)
        assert int(t.sum()) == t.numel()


def test_threads_calling_one_program_get_their_own_outputs(compiled, cache, run_in_threads):
    model, cm = compiled
    errors: list[str] = []

    def worker(k: int) -> None:
        gen = torch.Generator().manual_seed(k)
        for step in range(12):
            rows = 256 + 97 * ((k + step) % 5)
            args = (torch.randn(rows, HIDDEN, generator=gen), torch.randn(rows, HIDDEN, generator=gen))
            with torch.no_grad():
                got, want = cm(*args), model(*args)
            if not torch.allclose(got, want, rtol=1e-4, atol=1e-4):
                errors.append(f"thread {k} step {step} rows {rows}: max diff {(got - want).abs().max():.3g}")

    run_in_threads(worker, 4)
    assert not errors, errors
    assert cache.stats()["blocks"] <= 4


def test_the_limit_comes_from_the_environment_and_a_bad_one_is_named(monkeypatch, cache):
    path = load_ral().path
    monkeypatch.setenv("DISC_OUTPUT_CACHE_BLOCKS", "3")
    ral = open_ral(path)
    assert ral.outputs is not None and ral.outputs.set_limit(4) == 3
    monkeypatch.setenv("DISC_OUTPUT_CACHE_BLOCKS", "many")
    with pytest.raises(ValueError, match="DISC_OUTPUT_CACHE_BLOCKS must be a whole number"):
        open_ral(path)
