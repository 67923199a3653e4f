"""disc's benchmark suite: dynamic-shape workloads, peers side by side, tables and plots.

    python -m benchmarks run --suite cpu        # the CPU suite (< 30 min on 2 cores)
    python -m benchmarks run --suite smoke      # one model, two shapes, every installed system

See docs/benchmarks.md for what is measured and how.
"""
