"""Training through ``torch.compile(backend="disc", dynamic=True)``: forward and backward graphs.

Each family trains at a stream of shapes (1-sized dims included) against eager
PyTorch: the loss, the gradient of every parameter and (ResNet) the BatchNorm
running statistics must match. The four transformer families compile one
forward and one backward for the whole stream, both native. ViT and ResNet
are native too but retrace once: ViT's backward trace adds a guard that its
patch grid is not 1 wide, and training BatchNorm keeps dynamo's size-1
guards. ResNet's convolutions and their gradients are library calls, its
max-pool keeps its indices (a windowed argmax) and its backward scatters
through them.
"""

from __future__ import annotations

import copy

import pytest
import torch

import disc
from disc.models import MODELS

FAMILIES = ["bert", "gpt2", "t5", "llama", "vit", "resnet"]
NATIVE = {"bert", "gpt2", "t5", "llama"}
RTOL = 1e-4


def _no_dropout(model: torch.nn.Module) -> torch.nn.Module:
    # Dropout draws different random numbers in eager and in the compiled graph; the
    # comparison is about gradients (dropout itself: test_dropout_* below).
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    return model.train()


def _loss(out, seed: int = 5) -> torch.Tensor:
    o = out[0] if isinstance(out, (tuple, list)) else out
    w = torch.randn(o.shape, generator=torch.Generator().manual_seed(seed))  # a fixed random projection
    return (o.float() * w).sum()


def _grad_errors(model: torch.nn.Module, ref: torch.nn.Module) -> dict[str, float]:
    """Per parameter: max |grad - eager grad|, relative to that parameter's largest eager gradient.

    A parameter whose true gradient is 0 (a key bias: softmax ignores a per-row constant)
    has only rounding noise in eager too; its scale is floored at 1% of the largest gradient.
    """
    pairs = [(n, p.grad, q.grad) for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()) if q.grad is not None]
    top = max(r.abs().max().item() for _, _, r in pairs)
    errors = {}
    for name, g, r in pairs:
        assert g is not None, f"{name}: eager has a gradient, the compiled model none"
        scale = max(r.abs().max().item(), 1e-2 * top)
        errors[name] = (g - r).abs().max().item() / scale
    return errors


def _float64_grads(model: torch.nn.Module, args: tuple) -> dict[str, torch.Tensor]:
    exact = copy.deepcopy(model).double()
    exact.zero_grad(set_to_none=True)
    _loss(exact(*[a.double() if a.is_floating_point() else a for a in args])).backward()
    return {n: p.grad for n, p in exact.named_parameters() if p.grad is not None}


def _distance(model: torch.nn.Module, truth: dict[str, torch.Tensor]) -> dict[str, float]:
    return {n: ((p.grad.double() - truth[n]).abs().max() / truth[n].abs().max().clamp_min(1e-30)).item() for n, p in model.named_parameters() if n in truth}


def _training_reports(before: int) -> list:
    return disc.reports()[before:]


@pytest.mark.parametrize("family", FAMILIES)
def test_training_gradients_match_eager(family: str) -> None:
    entry = MODELS[family]
    model = _no_dropout(entry.factory())
    ref = copy.deepcopy(model)
    torch._dynamo.reset()  # another test may have compiled this model class: count from zero
    before = len(disc.reports())
    compiled = torch.compile(model, backend="disc", dynamic=True)
    # The first shape has no 1s (dynamo specialises a first call's 1s); later ones do.
    shapes = [entry.export_shape, *entry.shapes[:4]]
    for k, shape in enumerate(shapes):
        args = entry.inputs(shape, seed=k + 1)
        model.zero_grad(set_to_none=True)
        ref.zero_grad(set_to_none=True)
        try:
            want = _loss(ref(*args))
        except ValueError as e:  # BatchNorm cannot train on one value per channel: neither may disc
            # (raised while dynamo retraces the frame, wrapped in its TorchRuntimeError)
            with pytest.raises(Exception, match="more than 1 value per channel"):
                compiled(*args)
            assert "more than 1 value per channel" in str(e)
            continue
        want.backward()
        loss = _loss(compiled(*args))
        loss.backward()
        assert abs(loss.item() - want.item()) <= RTOL * max(abs(want.item()), 1.0), (dict(shape), loss.item(), want.item())
        errors = _grad_errors(model, ref)
        worst = max(errors, key=errors.get)
        if errors[worst] > RTOL:
            # Over 1e-4 only where float32 itself is that noisy (BatchNorm's backward amplifies
            # rounding): then disc must be as close to a float64 run as eager is.
            truth = _float64_grads(ref, args)
            ours, eagers = _distance(model, truth)[worst], _distance(ref, truth)[worst]
            assert ours <= 2 * eagers, f"{family} at {dict(shape)}: {worst} gradient off by {errors[worst]:.2e} (float64: disc {ours:.2e}, eager {eagers:.2e})"
        for (name, b), (_, rb) in zip(model.named_buffers(), ref.named_buffers()):
            if b.is_floating_point():  # BatchNorm running statistics, updated by the compiled forward
                torch.testing.assert_close(b, rb, rtol=RTOL, atol=1e-6, msg=f"buffer {name} at {dict(shape)}")
    reports = _training_reports(before)
    kinds = [r.name.endswith("(backward)") for r in reports]
    if family in NATIVE:
        assert kinds == [False, True], [r.name for r in reports]
    else:
        # ViT: a 1-patch-wide grid retraces once; ResNet: training BatchNorm keeps dynamo's
        # size-1 guards (see dynamo._trains_batch_norm), so 1x1 feature maps retrace once.
        assert kinds == [False, True] * (len(kinds) // 2) and len(kinds) <= (6 if family == "vit" else 8), [r.name for r in reports]
    for r in reports:
        assert r.backend is not None and r.backend.name == "native-cpu", (r.name, r.backend and r.backend.reason)
        assert not r.fallbacks, (r.name, r.fallbacks)


def test_fifty_training_steps_follow_eager_loss_curve_without_recompiling() -> None:
    """A small BERT, Adam, sequence length changing every step (batch 1 included)."""
    entry = MODELS["bert"]
    model = _no_dropout(entry.factory())
    ref = copy.deepcopy(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-3)
    torch._dynamo.reset()  # another test may have compiled this model class: count from zero
    before = len(disc.reports())
    compiled = torch.compile(model, backend="disc", dynamic=True)
    gen = torch.Generator().manual_seed(0)
    losses, ref_losses = [], []
    for step in range(50):
        batch = 2 + step % 3 if step < 2 else int(torch.randint(1, 5, (1,), generator=gen))
        seq = int(torch.randint(2, 40, (1,), generator=gen))
        args = entry.inputs({"batch": batch, "seq": seq}, seed=step)
        for m, o, out in ((compiled, opt, losses), (ref, ref_opt, ref_losses)):
            o.zero_grad(set_to_none=True)
            loss = _loss(m(*args), seed=step)
            loss.backward()
            o.step()
            out.append(loss.item())
    scale = max(abs(x) for x in ref_losses)
    drift = max(abs(a - b) for a, b in zip(losses, ref_losses)) / scale
    assert drift <= 1e-4, f"loss curves drift apart by {drift:.2e} (relative to the largest loss)"
    assert losses[0] != losses[-1]  # the model trained
    reports = _training_reports(before)
    assert len(reports) == 2, [r.name for r in reports]  # one forward, one backward, for all 50 steps
    assert all(r.backend.name == "native-cpu" for r in reports)


def test_dropout_in_training_is_statistically_dropout_and_reproducible() -> None:
    """Dropout compiles (a counter-based generator seeded from torch's): forward and backward run natively."""
    from disc.api import clear_reports, reports

    clear_reports()

    class Drop(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(64, 64)
            self.drop = torch.nn.Dropout(0.25)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.drop(torch.relu(self.linear(x)) + 1.0)  # every value > 0 before dropout

    model = Drop().train()
    compiled = torch.compile(model, backend="disc", dynamic=True)
    x = torch.randn(64, 33, 64)
    torch.manual_seed(1)
    a = compiled(x)
    torch.manual_seed(1)
    b = compiled(x)
    torch.testing.assert_close(a, b)  # same seed, same mask
    c = compiled(x)
    assert ((a == 0) != (c == 0)).float().mean() > 0.2  # the next call draws a new mask
    dropped = (a == 0).float().mean().item()
    n = a.numel()
    assert abs(dropped - 0.25) < 5 * (0.25 * 0.75 / n) ** 0.5, dropped  # within 5 sigma of p
    kept = a != 0
    with torch.no_grad():
        want = (torch.relu(model.linear(x)) + 1.0) / 0.75
    torch.testing.assert_close(a[kept], want[kept])  # survivors scaled by 1 / (1 - p)
    a.sum().backward()  # the backward uses the forward's mask
    with torch.no_grad():
        want_grad = (kept.float() / 0.75 * (model.linear(x) > 0)).sum((0, 1))
    torch.testing.assert_close(model.linear.bias.grad, want_grad, rtol=1e-4, atol=1e-3)
    graphs = [r for r in reports() if r.source == "torch.compile"]
    assert [r.backend.name for r in graphs] == ["native-cpu", "native-cpu"], [(r.name, r.backend.reason) for r in graphs]
    assert not any(r.fallbacks for r in graphs)


@pytest.mark.parametrize("partitioner", ["min_cut", "default"])
def test_both_partitioners_give_eager_gradients(partitioner: str) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4))
    twin = copy.deepcopy(model)
    compiled = torch.compile(model, backend="disc", dynamic=True, options={"partitioner": partitioner})
    for rows in (5, 1, 12):
        x = torch.randn(rows, 16)
        compiled(x).pow(2).sum().backward()
        twin(x).pow(2).sum().backward()
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)


def test_an_unknown_option_or_partitioner_is_a_clear_error() -> None:
    model = torch.nn.Linear(4, 4)
    with pytest.raises(Exception, match="unknown option.*'partitoner'"):
        torch.compile(model, backend="disc", options={"partitoner": "default"})(torch.randn(2, 4, requires_grad=True))
    torch._dynamo.reset()
    with pytest.raises(Exception, match="partitioner 'greedy' is not one of"):
        torch.compile(model, backend="disc", options={"partitioner": "greedy"})(torch.randn(2, 4, requires_grad=True))
    torch._dynamo.reset()


def test_training_batch_norm_sums_its_statistics_in_float64_on_the_cpu_as_eager_does() -> None:
    # Few values per channel far from zero: float32 sums of them lose the variance. Eager's CPU
    # kernels sum in double; torch's decomposition (what disc compiled before) summed in float32
    # and its gradients were 4e-3 off eager. Now its forward is at the float64 result (eager's
    # x*alpha + beta in float32 is 1e-3 off at 2 values per channel), and each gradient is as
    # close to float64 as eager's (both backwards read the mean saved in float32).
    def bn(x, w, b):
        return torch.nn.functional.batch_norm(x, None, None, w, b, training=True)

    def distance(a: torch.Tensor, exact: torch.Tensor) -> float:
        return ((a.double() - exact).abs().max() / exact.abs().max()).item()

    torch._dynamo.reset()
    compiled = torch.compile(bn, backend="disc", dynamic=True)
    for n in (3, 1, 6):
        torch.manual_seed(n)
        x = (300 + 0.01 * torch.randn(2, 4, n, 1)).requires_grad_()
        w, b = torch.randn(4, requires_grad=True), torch.randn(4, requires_grad=True)
        dy = torch.randn(2, 4, n, 1)
        out = compiled(x, w, b)
        mine = [out, *torch.autograd.grad(out, (x, w, b), dy)]
        ref = bn(x, w, b)
        eager = [ref, *torch.autograd.grad(ref, (x, w, b), dy)]
        x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, b))
        ref64 = bn(x64, w64, b64)
        exact = [ref64.detach(), *torch.autograd.grad(ref64, (x64, w64, b64), dy.double())]
        for name, m, e, t in zip(["output", "grad x", "grad w", "grad b"], mine, eager, exact):
            ours, theirs = distance(m, t), distance(e, t)
            assert ours <= max(1e-6, 1.5 * theirs), f"{name} at length {n}: {ours:.1e} from float64, eager {theirs:.1e}"


@pytest.mark.parametrize("user_backends", ["default", "cudnn only"])
def test_attention_is_traced_without_cudnns_kernel_which_refuses_one_token_sequences(monkeypatch, user_backends: str) -> None:
    # A traced graph replays the fused attention kernel chosen at trace time at every later
    # shape; cuDNN's refuses s_q = s_kv = 1 (nine HF models under bf16 autocast crashed on an
    # H200 at a one-token stream point), so disc traces with the caller's other choices.
    import torch._functorch.aot_autograd as aot
    from torch.nn.attention import SDPBackend, sdpa_kernel

    cuda = torch.backends.cuda
    seen = []
    real = aot.aot_module_simplified

    def recording(*args, **kwargs):
        seen.append((cuda.cudnn_sdp_enabled(), cuda.flash_sdp_enabled(), cuda.mem_efficient_sdp_enabled(), cuda.math_sdp_enabled()))
        return real(*args, **kwargs)

    monkeypatch.setattr(aot, "aot_module_simplified", recording)
    chosen = [SDPBackend.CUDNN_ATTENTION] if user_backends == "cudnn only" else [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    torch._dynamo.reset()
    m = torch.nn.Linear(4, 4)
    x = torch.randn(3, 4)
    with sdpa_kernel(chosen):
        before = (cuda.cudnn_sdp_enabled(), cuda.flash_sdp_enabled(), cuda.mem_efficient_sdp_enabled(), cuda.math_sdp_enabled())
        f = torch.compile(m, backend="disc", dynamic=True)
        torch.testing.assert_close(f(x), m(x))
        after = (cuda.cudnn_sdp_enabled(), cuda.flash_sdp_enabled(), cuda.mem_efficient_sdp_enabled(), cuda.math_sdp_enabled())
    assert seen, "disc's backend did not trace through AOTAutograd"
    want = (False, False, False, True) if user_backends == "cudnn only" else (False, True, True, True)
    assert seen[0] == want
    assert after == before  # the caller's choice is restored
