"""Errors a user of disc can catch. Each message names the input, the dim and the rule."""

from __future__ import annotations


class DiscError(Exception):
    """Base class of disc's errors."""


class ShapeError(DiscError, ValueError):
    """An input (or a value computed from inputs) breaks a compiled shape constraint."""


class InputError(DiscError, TypeError):
    """Wrong number of inputs, dtype, rank or device."""


class CompileError(DiscError):
    """The model could not be captured or compiled."""


class CaptureError(CompileError):
    """The framework's tracer (``torch.export``) could not capture the model as one program for
    every shape, e.g. because the model's code branches on a size."""


class RuntimeFailure(DiscError, RuntimeError):
    """A runtime library routine (the RAL) or a compiled program reported failure at run time."""
