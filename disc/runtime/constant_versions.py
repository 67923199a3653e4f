"""Noticing that a model's weights changed in place after it was compiled.

A compiled program reads the model's parameters and buffers as constants, and
more than reads them: passes merge them (q/k/v weights concatenated into one),
share equal ones (LayerNorm weights that are all ones at initialisation), and
the RAL packs GEMM and convolution weights into the library's layout. A weight
updated in place afterwards (``load_state_dict``, an optimizer step under
``no_grad``, a hand edit) leaves those copies stale, and the program would
compute with the old values. PyTorch bumps a tensor's version counter on every
in-place write, so comparing the counters with their values at compile time
says, at each call, whether the program still matches its model.

Writes through ``p.data`` (a separate alias with its own counter) are not seen;
for packed weights the RAL's check of sampled values is then the only guard.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import torch

logger = logging.getLogger("disc")


class ConstantVersions:
    """The version counters of the tensors a program read as constants when it was compiled.

    Checking costs ~80 ns a tensor a call (BERT-small's 70 tensors: ~5 us). Tensors made
    under ``torch.inference_mode`` have no counter, but nothing outside that mode can write
    them either; they are not watched.
    """

    def __init__(self, tensors: Mapping[str, torch.Tensor]) -> None:
        self.names: list[str] = []
        self.tensors: list[torch.Tensor] = []
        for name, t in tensors.items():
            if isinstance(t, torch.Tensor) and not t.is_inference():
                self.names.append(name)
                self.tensors.append(t)
        self.versions = [t._version for t in self.tensors]

    def changed(self) -> list[str]:
        """Names of the tensors written since compilation (usually empty)."""
        now = [t._version for t in self.tensors]
        if now == self.versions:
            return []
        return [name for name, a, b in zip(self.names, now, self.versions) if a != b]

    def changed_tensors(self) -> list[torch.Tensor]:
        return [t for t, v in zip(self.tensors, self.versions) if t._version != v]


def warn_recompiling(what: str, names: list[str]) -> None:
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    logger.warning("disc: %s: %s changed in place since compilation; compiling again, so that no stale copy is read", what, shown)
