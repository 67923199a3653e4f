"""The IR: types, nodes and graphs, the op registry, printer, parser and verifier."""
