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
import threading
from collections.abc import Callable, Mapping

import torch

logger = logging.getLogger("disc")


class ConstantVersions:
    """The version counters of the tensors a program read as constants when it was compiled.

    Checking costs 60-130 ns a tensor a call (measured: GPT-2's 52 tensors 4.3 us, BERT-base's
    200 12.6 us). Tensors made under ``torch.inference_mode`` have no counter, but nothing
    outside that mode can write them either; they are not watched.
    """

    def __init__(self, tensors: Mapping[str, torch.Tensor]) -> None:
        self.names: list[str] = []
        self.tensors: list[torch.Tensor] = []
        for name, t in tensors.items():
            if isinstance(t, torch.Tensor) and not t.is_inference():
                self.names.append(name)
                self.tensors.append(t)
        self.versions = [t._version for t in self.tensors]
        self._recompiling = threading.Lock()

    def changed(self) -> list[str]:
        """Names of the tensors written since compilation (usually empty)."""
        now = [t._version for t in self.tensors]
        if now == self.versions:
            return []
        return [name for name, a, b in zip(self.names, now, self.versions) if a != b]

    def recompile_if_changed(self, what: str, compile_again: Callable[[], None]) -> None:
        """If a watched tensor was written: warn, drop the RAL's packed copies of the written
        ones, ``compile_again()`` and watch from the versions it compiled. One thread compiles;
        the others wait and find nothing left to do."""
        from disc.runtime.ral import forget_packed_copies

        with self._recompiling:
            changed = self.changed()
            if not changed:
                return
            shown = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
            logger.warning("disc: %s: %s changed in place since compilation; compiling again, so that no stale copy is read", what, shown)
            now = [t._version for t in self.tensors]  # before compiling: a write during it shows next call
            forget_packed_copies([t for t, a, b in zip(self.tensors, now, self.versions) if a != b])
            compile_again()
            self.versions = now
