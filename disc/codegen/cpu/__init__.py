"""The native CPU backend: the C++ toolchain (and, later, the C++ code generator)."""
