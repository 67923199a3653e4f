"""Importing this package registers every op in ``disc.ir.registry.OPS``."""

from disc.ir.ops import elementwise, host, indexing, linalg, movement, nn, random, reduction, shape_ops  # noqa: F401
