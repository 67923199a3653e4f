"""``disc.onnx``: compile ONNX models once for all their shapes (``disc/frontends/onnx``)."""

from disc.frontends.onnx import OnnxProgram, ValueSpecializedProgram, compile, import_model, supported_ops

__all__ = ["OnnxProgram", "ValueSpecializedProgram", "compile", "import_model", "supported_ops"]
