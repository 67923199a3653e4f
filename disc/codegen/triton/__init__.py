"""The GPU code generator: the shared fusion plan and lowering, printed as Triton kernels and a Python host flow."""
