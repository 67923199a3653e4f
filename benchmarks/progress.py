"""A dependency-free progress bar on stderr (a redrawn line on a terminal, a line per 5% in logs)."""

from __future__ import annotations

import sys
import time


def _mmss(seconds: float) -> str:
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


class Progress:
    def __init__(self, total: int, stream=None) -> None:
        self.total = max(total, 1)
        self.done = 0
        self.start = time.perf_counter()
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self._last_logged = -1

    def add(self, steps: int) -> None:
        """Grow the total (a phase whose size is only known once it starts)."""
        self.total += steps

    def step(self, label: str, n: int = 1) -> None:
        self.done = min(self.done + n, self.total)
        self.show(label)

    def show(self, label: str) -> None:
        frac = self.done / self.total
        elapsed = time.perf_counter() - self.start
        eta = elapsed / frac - elapsed if frac > 0.02 else float("nan")
        eta_text = "?" if eta != eta else _mmss(eta)
        width = 28
        bar = "#" * int(frac * width) + "." * (width - int(frac * width))
        line = f"[{bar}] {frac * 100:5.1f}%  {_mmss(elapsed)} elapsed, ~{eta_text} left  {label}"
        if self.tty:
            self.stream.write("\r" + line[:160].ljust(160))
            self.stream.flush()
            return
        bucket = int(frac * 20)
        if bucket != self._last_logged:
            self._last_logged = bucket
            self.stream.write(line + "\n")
            self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
