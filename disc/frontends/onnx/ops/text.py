"""Text features over integer token ids: TfIdfVectorizer's n-gram counts."""

from __future__ import annotations

from typing import Any

import numpy as np

from disc.frontends.onnx.importer import OnnxImporter
from disc.frontends.onnx.ops import onnx_op
from disc.ir.builder import LoweringError, batched_matmul, convert, elementwise, positions, reduce, reshape, select
from disc.ir.graph import Node
from disc.shape.expr import as_expr


def _pool_grams(pool: np.ndarray, ngram_counts: list[int], shortest: int, longest: int) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """The pool's n-grams of each length in [shortest, longest]: (length, grams [k, length], their
    ids: their positions among all the pool's n-grams, which ngram_indexes maps to outputs)."""
    out = []
    first_id = 0
    for level, start in enumerate(ngram_counts):
        length = level + 1
        end = ngram_counts[level + 1] if level + 1 < len(ngram_counts) else len(pool)
        count = max(end - start, 0) // length
        if count and shortest <= length <= longest:
            out.append((length, pool[start : start + count * length].reshape(count, length), np.arange(first_id, first_id + count)))
        first_id += count
    return out


@onnx_op("TfIdfVectorizer")
def _tfidf_vectorizer(
    imp: OnnxImporter, node: Any, x: Any, max_gram_length: int, max_skip_count: int, min_gram_length: int, mode: str, ngram_counts: Any, ngram_indexes: Any,
    pool_int64s: Any = None, pool_strings: Any = None, weights: Any = None,
) -> Node:
    """Counts of the pool's n-grams in each row: an n-gram of length m with skip s reads tokens
    i, i + s + 1, ... (m of them, inside the row); 1-grams count once, longer ones for every skip
    up to max_skip_count. Per (length, skip) the rows' windows [rows, C, m] are compared with all
    the pool's grams of that length at once, so the graph's size does not grow with the pool.
    TF gives the counts, IDF the gram's weight where its count is positive, TFIDF count times weight."""
    if pool_int64s is None:
        raise LoweringError("TfIdfVectorizer over strings (pool_strings): disc's tensors hold numbers")
    if mode not in ("TF", "IDF", "TFIDF"):
        raise LoweringError(f"TfIdfVectorizer: mode {mode!r}; ONNX takes TF, IDF or TFIDF")
    data = imp.tensor(x)
    if data.tensor_type.rank not in (1, 2) or data.dtype not in ("i32", "i64"):
        raise LoweringError(f"TfIdfVectorizer takes [C] or [N, C] integer token ids, got {data.dtype}{list(data.shape)}")
    one_row = data.tensor_type.rank == 1
    tokens = convert(imp, reshape(imp, data, [1, data.shape[0]]) if one_row else data, "i64")
    rows, length = tokens.shape
    targets = [int(i) for i in np.asarray(ngram_indexes).reshape(-1)]
    outputs = max(targets) + 1 if targets else 0
    found, ids = [], []
    for m, grams, gram_ids in _pool_grams(np.asarray(pool_int64s, np.int64).reshape(-1), [int(c) for c in np.asarray(ngram_counts).reshape(-1)], min_gram_length, max_gram_length):
        total = None
        for stride in range(1, (max_skip_count + 1 if m > 1 else 1) + 1):
            span = (m - 1) * stride
            padded = imp.graph.add("pad", (tokens,), {"low": (0, 0), "high": (0, span), "value": 0})
            parts = [reshape(imp, imp.graph.add("slice", (padded, imp.index(j * stride), imp.index(as_expr(length) + j * stride)), {"axis": 1, "step": 1}), [rows, length, 1]) for j in range(m)]
            windows = parts[0] if m == 1 else imp.graph.add("concat", tuple(parts), {"axis": 2})
            shape = [rows, length, len(grams), m]
            wide = imp.graph.add("broadcast_in_dim", (windows, *imp.sizes(shape)), {"dims": (0, 1, 3)})
            pool = imp.graph.add("broadcast_in_dim", (imp.graph.add_constant(grams), *imp.sizes(shape)), {"dims": (2, 3)})
            match = reduce(imp, elementwise(imp, "eq", [wide, pool], "i64"), [3], "all", False)  # [rows, C, k]
            fits = elementwise(imp, "lt", [positions(imp, [rows, length, len(grams)], 1), imp.shape_tensor([as_expr(length) - span])], "i64")  # the window ends inside the row
            hits = reduce(imp, convert(imp, elementwise(imp, "logical_and", [match, fits], "i1"), "f32"), [1], "sum", False)
            total = hits if total is None else elementwise(imp, "add", [total, hits], "f32")
        found.append(total)
        ids.extend(int(i) for i in gram_ids)
    if not found or not outputs:
        zero = imp.graph.add_constant(np.array(0.0, np.float32))
        counts = imp.graph.add("broadcast_in_dim", (zero, *imp.sizes([rows, outputs])), {"dims": ()})
        return reshape(imp, counts, [outputs]) if one_row else counts
    every = found[0] if len(found) == 1 else imp.graph.add("concat", tuple(found), {"axis": 1})  # [rows, grams]
    if mode != "TF":  # weights belong to the pool's grams (the spec and ONNX Runtime; ONNX's reference indexes them by output)
        given = np.asarray(weights, np.float32).reshape(-1) if weights is not None and len(weights) else None
        scale = np.array([given[i] if given is not None and i < len(given) else 1.0 for i in ids], np.float32)
        scale_node = imp.graph.add("broadcast_in_dim", (imp.graph.add_constant(scale), *imp.sizes([rows, len(ids)])), {"dims": (1,)})
        seen = select(imp, elementwise(imp, "gt", [every, 0.0], "f32"), 1.0, 0.0, "f32") if mode == "IDF" else every
        every = elementwise(imp, "mul", [seen, scale_node], "f32")
    place = np.zeros((len(ids), outputs), np.float32)  # pool gram -> its output column
    for row, gram_id in enumerate(ids):
        if gram_id < len(targets):
            place[row, targets[gram_id]] = 1.0
    counts = batched_matmul(imp, every, imp.graph.add_constant(place))
    return reshape(imp, counts, [outputs]) if one_row else counts
