"""``disc.tf``: compile TensorFlow functions and Keras models once for all their shapes (``disc/frontends/tf``)."""

from disc.frontends.tf import TfProgram, compile, function, supported_ops, trace

__all__ = ["TfProgram", "compile", "function", "supported_ops", "trace"]
