"""The call signature a generated CPU program states about itself (``disc_signature()``).

A host sizes the arrays it passes to ``disc_shapes`` and ``disc_run`` from a description it
reads elsewhere (the compiler's own lowering, or a saved folder's ``interface.txt``). A
description that disagrees with the program (an edited file) would make the program read or
write past those arrays, so every program exports this text and every host compares it first.
Torch-free: the standalone runtime's hosts use it.
"""

from __future__ import annotations

from collections.abc import Sequence


def signature_text(input_ranks: Sequence[int], buffers: Sequence[tuple[str, int]], constants: int, data_dependent: bool) -> str:
    """``inputs 2 2; buffers f32:3 f32:2; constants 42; data_dependent 0``: input ranks, output
    buffers (dtype:rank), how many constants the program's table holds, whether ``disc_run``
    reports the dims it ran at."""
    return (
        f"inputs {' '.join(map(str, input_ranks))}; buffers {' '.join(f'{d}:{r}' for d, r in buffers)}; "
        f"constants {constants}; data_dependent {int(data_dependent)}"
    )
