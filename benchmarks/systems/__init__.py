"""The registered systems. Importing this package registers every adapter.

Adapters register in this order, which is the order of every table: eager
first (the baseline), disc second, then the peers.
"""

import importlib

from benchmarks.systems.base import SYSTEMS, Context, Runner, System, register

for _adapter in ("eager", "disc_system", "inductor", "ort", "ov", "disc_onnx"):
    importlib.import_module(f"benchmarks.systems.{_adapter}")

__all__ = ["SYSTEMS", "Context", "Runner", "System", "register"]
