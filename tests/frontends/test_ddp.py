"""Data-parallel training: ``torch.compile(backend="disc", dynamic=True)`` on a DistributedDataParallel model.

Two processes (gloo, over loopback) train a small transformer block with SGD
at a stream of batch and sequence sizes, each rank on data of its own, next to
an eager DDP copy of the same model. Dynamo's DDP optimizer (on by default)
splits the captured graph at gradient-bucket boundaries, so that a bucket's
all-reduce can start while the backward of earlier layers still runs: disc
compiles every piece, forward and backward, and DDP reduces the gradients
its backward programs produce. After every step each parameter must equal the
eager model's, and each piece must compile once for the whole stream (disc's
programs run at any size), natively.

The processes report to the test, which asserts; a hang or a crash in a rank
fails the test after a timeout instead of blocking the run.
"""

from __future__ import annotations

import copy
import os
import queue
import socket
import time
import traceback
from datetime import timedelta
from typing import Any
from unittest import mock

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

import disc

WORLD = 2
VOCAB, DIM, HEADS = 512, 128, 4
# DDPOptimizer refuses a cap below DDP's first bucket (1 MiB); the block's 1.3 MB of
# parameters then fill two buckets.
BUCKET_CAP_MB = 1
# (batch, sequence) per step. No 1s: disc relaxes dynamo's assumption that sizes are not 1 once
# it has compiled a piece, so the pieces traced after it guard on sizes > 1 and a size-1 call
# captures the frame again (without DDP's split, test_training covers 1s).
SHAPES = [(3, 7), (5, 4), (2, 13), (7, 3), (4, 9), (6, 5)]
LR = 0.1
TOL = 1e-5
TIMEOUT_S = 300.0


class Block(torch.nn.Module):
    """Embedding, causal self-attention and a GELU MLP with LayerNorms, projected back to the vocabulary."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.qkv = torch.nn.Linear(DIM, 3 * DIM)
        self.proj = torch.nn.Linear(DIM, DIM)
        self.norm1 = torch.nn.LayerNorm(DIM)
        self.up = torch.nn.Linear(DIM, 4 * DIM)
        self.norm2 = torch.nn.LayerNorm(4 * DIM)
        self.down = torch.nn.Linear(4 * DIM, DIM)
        self.norm3 = torch.nn.LayerNorm(DIM)
        self.head = torch.nn.Linear(DIM, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4).unbind(0)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = self.norm1(x + self.proj(a.transpose(1, 2).reshape(b, s, DIM)))
        h = F.gelu(self.norm2(self.up(x)))
        x = self.norm3(x + F.gelu(self.down(h)))
        return self.head(x)


def _batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    batch, seq = SHAPES[step]
    gen = torch.Generator().manual_seed(1000 * rank + step)
    tokens = torch.randint(0, VOCAB, (batch, seq), generator=gen)
    targets = torch.randint(0, VOCAB, (batch, seq), generator=gen)
    return tokens, targets


def _train(rank: int) -> dict[str, Any]:
    """Both models through the shape stream on this rank: what the parent asserts on."""
    from torch._dynamo.backends.distributed import DDPOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)  # the same initial weights on every rank
    model = Block()
    ref = copy.deepcopy(model)
    ddp = DDP(model, bucket_cap_mb=BUCKET_CAP_MB)
    ref_ddp = DDP(ref, bucket_cap_mb=BUCKET_CAP_MB)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=LR)
    compiled = torch.compile(ddp, backend="disc", dynamic=True)

    splits: list[int] = []  # per graph dynamo captured: into how many pieces DDPOptimizer split it
    split = DDPOptimizer.compile_fn

    def recording_split(self: DDPOptimizer, gm: torch.fx.GraphModule, example_inputs: list[Any], **configs: Any) -> Any:
        compiled_gm = split(self, gm, example_inputs, **configs)
        splits.append(len(self.buckets))
        return compiled_gm

    losses: list[tuple[float, float]] = []
    captures: list[int] = []  # per step: how many graphs dynamo has captured so far
    mismatches: list[list[str]] = []  # per step: one message per parameter off eager's
    with mock.patch.object(DDPOptimizer, "compile_fn", recording_split):
        for step in range(len(SHAPES)):
            tokens, targets = _batch(rank, step)
            pair = []
            for m, o in ((compiled, opt), (ref_ddp, ref_opt)):
                o.zero_grad(set_to_none=True)
                logits = m(tokens)
                # DDPOptimizer runs each compiled piece once on fake tensors while compiling: what
                # that run returns must not come back from a real call.
                assert type(logits) is torch.Tensor, f"step {step}: the model returned a {type(logits).__name__}, not a tensor"
                loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
                loss.backward()
                o.step()
                pair.append(loss.item())
            losses.append((pair[0], pair[1]))
            captures.append(len(splits))
            wrong = []
            for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
                try:
                    torch.testing.assert_close(p, q, rtol=TOL, atol=TOL)
                except AssertionError as e:
                    wrong.append(f"{name}: {e}")
            mismatches.append(wrong)
    reports = [(r.name, r.graph.name, dict(r.fallbacks), r.backend.name if r.backend is not None else None) for r in disc.reports()]
    return {"splits": splits, "captures": captures, "losses": losses, "mismatches": mismatches, "reports": reports}


def _loopback_interface() -> str | None:
    return next((name for _, name in socket.if_nameindex() if name.startswith("lo")), None)


def _worker(rank: int, port: int, results: Any) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    loopback = _loopback_interface()
    if loopback is not None:  # gloo's own connections too, not only the rendezvous
        os.environ.setdefault("GLOO_SOCKET_IFNAME", loopback)
    torch.set_num_threads(1)  # two ranks share the machine
    # A rank that fails leaves its peer waiting in an all-reduce: bounded by this, not gloo's 30 minutes.
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timedelta(seconds=TIMEOUT_S / 2))
    try:
        results.put((rank, _train(rank)))
    except BaseException:  # noqa: BLE001 (the parent reports it)
        results.put((rank, traceback.format_exc()))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_ranks() -> dict[int, dict[str, Any]]:
    """Each rank's results, or the test fails with a rank's traceback, exit code or a timeout."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(rank, port, results), daemon=True) for rank in range(WORLD)]
    for p in procs:
        p.start()
    got: dict[int, Any] = {}
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while len(got) < WORLD:
            try:
                rank, result = results.get(timeout=1.0)
                got[rank] = result
                continue
            except queue.Empty:
                pass
            # The queue is read first: a rank that exited after reporting is not a crash.
            crashed = [(r, p.exitcode) for r, p in enumerate(procs) if r not in got and p.exitcode not in (None, 0)]
            if crashed:
                pytest.fail(f"rank(s) died without a report (rank, exit code): {crashed}")
            if time.monotonic() > deadline:
                pytest.fail(f"no report from rank(s) {sorted(set(range(WORLD)) - set(got))} within {TIMEOUT_S:.0f} s")
        for p in procs:
            p.join(timeout=max(deadline - time.monotonic(), 10.0))
        assert [p.exitcode for p in procs] == [0] * WORLD, [p.exitcode for p in procs]
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        results.close()
    failed = {r: res for r, res in got.items() if isinstance(res, str)}
    if failed:
        pytest.fail("\n".join(f"rank {r} raised:\n{tb}" for r, tb in sorted(failed.items())))
    return got


@pytest.mark.slow
def test_ddp_training_matches_eager_and_compiles_each_split_graph_once() -> None:
    ranks = _run_ranks()
    for rank, res in sorted(ranks.items()):
        for step, ((loss, want), wrong) in enumerate(zip(res["losses"], res["mismatches"])):
            where = f"rank {rank}, step {step}, shape {SHAPES[step]}"
            assert loss == pytest.approx(want, rel=TOL, abs=TOL), f"{where}: loss {loss} vs eager {want}"
            assert not wrong, f"{where}: parameters off eager's after the update:\n" + "\n".join(wrong)
        # One capture for the whole stream, split at the bucket boundaries...
        assert res["captures"] == [1] * len(SHAPES), f"rank {rank}: graphs captured by each step {res['captures']}"
        splits = res["splits"]
        assert splits[0] >= 2, f"rank {rank}: DDPOptimizer did not split the graph ({splits[0]} piece)"
        # ...and one disc forward and one backward program per piece: no recompilation, no fallback.
        reports = res["reports"]
        names = [name for name, *_ in reports]
        backward = [name.endswith("(backward)") for name in names]
        assert backward.count(False) == splits[0] and backward.count(True) == splits[0], f"rank {rank}: {names}"
        for name, graph, fallbacks, backend in reports:
            assert graph != "not_compiled", f"rank {rank}: {name}"
            assert not fallbacks and backend == "native-cpu", f"rank {rank}: {name} ran {fallbacks} in PyTorch, backend {backend}"
    assert ranks[0]["losses"] != ranks[1]["losses"]  # each rank trained on data of its own
