"""The CUDA-graph cache's bookkeeping, which needs no GPU: what it remembers stays bounded."""

import torch

from disc.runtime import cuda_graphs
from disc.runtime.cuda_graphs import GraphCache, _RecentKeys


def test_recent_keys_forget_the_oldest_beyond_their_limit():
    keys = _RecentKeys(3)
    for k in range(5):
        keys.add((k,))
    assert len(keys) == 3 and (0,) not in keys and (1,) not in keys and (4,) in keys
    keys.add((2,))  # touched again: now the newest
    keys.add((5,))
    assert (2,) in keys and (3,) not in keys


def test_a_stream_of_new_shapes_does_not_grow_the_cache(monkeypatch):
    """Each shape is seen once (graphs are captured at a shape's second call), forever new."""
    monkeypatch.setattr(cuda_graphs, "REMEMBERED_SHAPES", 8)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)  # CPU builds lack it

    def never_captured(inputs):
        raise AssertionError("a shape seen once must not be captured")

    cache = GraphCache(never_captured, max_shapes=16, max_bytes=2**30)
    for n in range(1, 200):
        assert cache.run([torch.zeros(n, 3)]) is None
    assert len(cache._seen_once) == 8 and len(cache._uncaptured) == 0 and cache.shapes() == 0


def test_a_change_of_numerics_flags_is_a_new_key():
    # A graph replays the GEMM kernels chosen at its capture: after the user turns TF32 on or off
    # for GEMMs or convolutions, the same shape must not replay the old choice.
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    saved = matmul.allow_tf32, cudnn.allow_tf32
    x = [torch.zeros(2, 3)]
    try:
        matmul.allow_tf32 = cudnn.allow_tf32 = False
        keys = [GraphCache.key(x)]
        matmul.allow_tf32 = True
        keys.append(GraphCache.key(x))
        cudnn.allow_tf32 = True
        keys.append(GraphCache.key(x))
        assert len(set(keys)) == 3
        matmul.allow_tf32 = cudnn.allow_tf32 = False
        assert GraphCache.key(x) == keys[0]
    finally:
        matmul.allow_tf32, cudnn.allow_tf32 = saved
