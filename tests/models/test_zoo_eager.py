"""The model zoo in eager PyTorch: every entry builds, runs at every listed shape,
is deterministic, is per-sample correct under batching, and exports with dynamic dims."""

from __future__ import annotations

import pytest
import torch

from disc.models import MODELS, ModelEntry, get, names

ALL = sorted(MODELS)


def _as_tuple(out) -> tuple[torch.Tensor, ...]:
    return out if isinstance(out, tuple) else (out,)


def _run(model: torch.nn.Module, args: tuple) -> tuple[torch.Tensor, ...]:
    with torch.no_grad():
        return _as_tuple(model(*args))


def _batch_axes(entry: ModelEntry) -> dict[str, int]:
    return {arg: axis for arg, axes in entry.dynamic.items() for axis, dim in axes.items() if dim == "batch"}


@pytest.fixture(scope="module", params=ALL)
def entry_and_model(request):
    entry = MODELS[request.param]
    return entry, entry.factory()


# --------------------------------------------------------------------------- registry


def test_registry_lookup():
    assert names() == ALL
    assert {"bert", "gpt2", "t5", "t5_encoder", "llama", "vit", "resnet"} <= set(ALL)
    assert get("bert") is MODELS["bert"]
    with pytest.raises(KeyError):
        get("no-such-model")


@pytest.mark.parametrize("name", ALL)
def test_entry_is_consistent(name):
    entry = MODELS[name]
    assert entry.name == name
    assert entry.variants["tiny"] is entry.factory
    assert set(entry.dynamic) <= set(entry.arg_names)
    assert {dim for axes in entry.dynamic.values() for dim in axes.values()} == set(entry.dims)

    assert len(entry.shapes) >= 10
    assert len({tuple(sorted(s.items())) for s in entry.shapes}) == len(entry.shapes), "duplicate shapes"
    for shape in entry.shapes:
        assert set(shape) == set(entry.dims)
        assert entry.accepts(shape), shape
    # every dim that may be 1 is 1 in some listed shape
    for dim in entry.dims:
        if entry.dim_range(dim)[0] == 1:
            assert any(s[dim] == 1 for s in entry.shapes), dim
    assert entry.accepts(entry.export_shape)
    assert all(size > 1 for size in entry.export_shape.values())


@pytest.mark.parametrize("name", ALL)
def test_example_inputs_follow_the_dynamic_spec(name):
    entry = MODELS[name]
    for shape in entry.shapes:
        args = entry.inputs(shape)
        assert len(args) == len(entry.arg_names)
        by_name = dict(zip(entry.arg_names, args))
        for arg, axes in entry.dynamic.items():
            for axis, dim in axes.items():
                assert by_name[arg].shape[axis] == shape[dim], (arg, axis, dim, shape)
        # seeded: the same call gives the same tensors, another seed different ones
        for a, b in zip(args, entry.inputs(shape)):
            assert torch.equal(a, b)


@pytest.mark.parametrize("name", [n for n in ALL if "attention_mask" in MODELS[n].arg_names])
def test_masks_are_padded_at_the_end(name):
    entry = MODELS[name]
    mask_pos = entry.arg_names.index("attention_mask")
    vocab = entry.factory().config.vocab_size
    for shape in entry.shapes:
        args = entry.inputs(shape)
        ids, mask = args[0], args[mask_pos]
        assert ids.dtype == torch.long and int(ids.min()) >= 0 and int(ids.max()) < vocab
        assert mask.dtype == torch.long and set(mask.unique().tolist()) <= {0, 1}
        assert bool(mask[:, 0].all()), "every sample attends to its first token"
        # ones then zeros: non-increasing along the sequence
        assert bool((mask[:, 1:] <= mask[:, :-1]).all())
        if shape["seq"] > 1:
            assert not bool(mask.all()), f"no padding at {shape}"


# --------------------------------------------------------------------------- eager


def test_models_are_in_eval_mode(entry_and_model):
    _, model = entry_and_model
    assert not model.training
    assert all(not m.training for m in model.modules())


def test_runs_at_every_shape(entry_and_model):
    entry, model = entry_and_model
    for shape in entry.shapes:
        outs = _run(model, entry.inputs(shape))
        for out in outs:
            assert out.shape[0] == shape["batch"], (shape, out.shape)
            assert out.dtype == torch.float32
            assert torch.isfinite(out).all(), shape
        if "seq" in shape and entry.name != "t5":
            assert outs[0].shape[1] == shape["seq"]
        if "dec_seq" in shape:
            assert outs[0].shape[1] == shape["dec_seq"]


def test_deterministic_across_builds(entry_and_model):
    entry, model = entry_and_model
    other = entry.factory()
    args = entry.inputs(entry.export_shape)
    for a, b in zip(_run(model, args), _run(other, args)):
        assert torch.equal(a, b)
    # a different seed gives different weights
    reseeded = entry.factory(seed=1)
    assert not all(torch.equal(a, b) for a, b in zip(_run(model, args), _run(reseeded, args)))


def test_factory_does_not_disturb_global_rng():
    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    for entry in MODELS.values():
        entry.factory()
    assert torch.equal(torch.rand(4), expected)


def test_batch_equals_stacked_single_samples(entry_and_model):
    """Batched output equals the per-sample outputs: masks and broadcasts are per sample."""
    entry, model = entry_and_model
    batch_axes = _batch_axes(entry)
    candidates = [s for s in entry.shapes if s["batch"] > 1 and all(v > 1 for v in s.values())]
    for shape in candidates[:2]:
        args = entry.inputs(shape)
        batched = _run(model, args)
        for i in range(shape["batch"]):
            single_args = tuple(a.narrow(batch_axes[n], i, 1) if n in batch_axes else a for n, a in zip(entry.arg_names, args))
            for full, single in zip(batched, _run(model, single_args)):
                torch.testing.assert_close(full[i : i + 1], single, rtol=1e-4, atol=1e-5)


def test_padding_does_not_leak_into_bert():
    """Changing the tokens under padding leaves BERT's unpadded outputs unchanged."""
    entry = MODELS["bert"]
    model = entry.factory()
    ids, mask = entry.inputs({"batch": 3, "seq": 20})
    noisy = torch.where(mask.bool(), ids, (ids + 7) % model.config.vocab_size)
    hidden, _ = _run(model, (ids, mask))
    hidden_noisy, _ = _run(model, (noisy, mask))
    keep = mask.bool()
    torch.testing.assert_close(hidden[keep], hidden_noisy[keep], rtol=1e-4, atol=1e-5)


def test_decoders_are_causal():
    """A token's logits depend only on the tokens up to it."""
    for name in ("gpt2", "llama"):
        entry = MODELS[name]
        model = entry.factory()
        (ids,) = entry.inputs({"batch": 2, "seq": 12})
        changed = ids.clone()
        changed[:, 8:] = (changed[:, 8:] + 1) % model.config.vocab_size
        a, b = _run(model, (ids,))[0], _run(model, (changed,))[0]
        torch.testing.assert_close(a[:, :8], b[:, :8], rtol=1e-4, atol=1e-5)
        assert not torch.allclose(a[:, 8:], b[:, 8:])


# --------------------------------------------------------------------------- torch.export


@pytest.mark.parametrize("name", ALL)
def test_exports_with_dynamic_dims(name):
    """Traced once at a non-1 shape, the exported program matches eager at every listed shape."""
    entry = MODELS[name]
    model = entry.factory()
    program = entry.export(model)

    # every declared dim stays symbolic in the exported graph
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    user_inputs = program.graph_signature.user_inputs
    assert len(user_inputs) == len(entry.arg_names)
    for arg_name, node_name in zip(entry.arg_names, user_inputs):
        val = placeholders[node_name].meta["val"]
        for axis in entry.dynamic.get(arg_name, {}):
            assert isinstance(val.shape[axis], torch.SymInt), (arg_name, axis)

    exported = program.module()
    for shape in entry.shapes:
        args = entry.inputs(shape)
        for want, got in zip(_run(model, args), _as_tuple(exported(*args))):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
