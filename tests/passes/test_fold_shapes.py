"""Golden tests of fold_shapes: static index values fold, equal index values are shared."""

from __future__ import annotations

from golden import check_golden

from disc.passes.fold_shapes import fold_shapes


def test_folds_static_values_and_shares_equal_ones():
    check_golden(
        fold_shapes,
        """
        func @main(%x: f32[b, s, 64], %y: f32[b, s, 64]) {
          sym b in [1, inf]  (input 'x' dim 0)
          sym s in [1, inf]  (input 'x' dim 1)
          %0 = dim(%x) {axis=0} : index(b)
          %1 = dim(%x) {axis=1} : index(s)
          %2 = dim(%x) {axis=2} : index(64)
          %3 = dim(%y) {axis=0} : index(b)
          %4 = imul(%0, %1) : index(b*s)
          %5 = imul(%1, %3) : index(b*s)
          %6 = isub(%4, %5) : index(0)
          %7 = index_const() {value=2} : index(2)
          %8 = imul(%7, %2) : index(128)
          %9 = ifloordiv(%8, %7) : index(64)
          %10 = iadd(%6, %9) : index(64)
          %11 = reshape(%x, %4, %2) : f32[b*s, 64]
          %12 = reshape(%y, %5, %10) : f32[b*s, 64]
          %13 = add(%11, %12) : f32[b*s, 64]
          return %13, %6
        }
        """,
        # dim of a static dim and arithmetic on constants become index_const;
        # %3 (dim of %y) is b like %0, %5 is b*s like %4 and %9, %10 are 64
        # like %2: later uses point at the first value. Dead %8 stays (dce's job).
        """
        func @main(%x: f32[b, s, 64], %y: f32[b, s, 64]) {
          sym b in [1, inf]  (input 'x' dim 0)
          sym s in [1, inf]  (input 'x' dim 1)
          %0 = dim(%x) {axis=0} : index(b)
          %1 = dim(%x) {axis=1} : index(s)
          %2 = index_const() {value=64} : index(64)
          %4 = imul(%0, %1) : index(b*s)
          %6 = index_const() {value=0} : index(0)
          %7 = index_const() {value=2} : index(2)
          %8 = index_const() {value=128} : index(128)
          %11 = reshape(%x, %4, %2) : f32[b*s, 64]
          %12 = reshape(%y, %4, %2) : f32[b*s, 64]
          %13 = add(%11, %12) : f32[b*s, 64]
          return %13, %6
        }
        """,
    )


def test_values_equal_through_a_product_equality_are_shared():
    check_golden(
        fold_shapes,
        """
        func @main(%x: f32[a, b], %y: f32[c, d]) {
          sym a in [1, inf]  (input 'x' dim 0)
          sym b in [1, inf]  (input 'x' dim 1)
          sym c in [1, inf]  (input 'y' dim 0)
          sym d in [1, inf]  (input 'y' dim 1)
          prod a*b == c*d
          %0 = dim(%x) {axis=0} : index(a)
          %1 = dim(%x) {axis=1} : index(b)
          %2 = dim(%y) {axis=0} : index(c)
          %3 = dim(%y) {axis=1} : index(d)
          %4 = imul(%0, %1) : index(a*b)
          %5 = imul(%3, %2) : index(c*d)
          %6 = reshape(%x, %5) : f32[c*d]
          %7 = reshape(%y, %4) : f32[a*b]
          return %6, %7
        }
        """,
        """
        func @main(%x: f32[a, b], %y: f32[c, d]) {
          sym a in [1, inf]  (input 'x' dim 0)
          sym b in [1, inf]  (input 'x' dim 1)
          sym c in [1, inf]  (input 'y' dim 0)
          sym d in [1, inf]  (input 'y' dim 1)
          prod a*b == c*d
          %0 = dim(%x) {axis=0} : index(a)
          %1 = dim(%x) {axis=1} : index(b)
          %2 = dim(%y) {axis=0} : index(c)
          %3 = dim(%y) {axis=1} : index(d)
          %4 = imul(%0, %1) : index(a*b)
          %6 = reshape(%x, %4) : f32[a*b]
          %7 = reshape(%y, %4) : f32[a*b]
          return %6, %7
        }
        """,
    )


def test_distinct_values_stay_apart():
    src = """
    func @main(%x: f32[a, b]) {
      sym a in [1, inf]  (input 'x' dim 0)
      sym b in [1, inf]  (input 'x' dim 1)
      %0 = dim(%x) {axis=0} : index(a)
      %1 = dim(%x) {axis=1} : index(b)
      %2 = iadd(%0, %1) : index(a + b)
      %3 = imul(%0, %1) : index(a*b)
      %4 = index_const() {value=1} : index(1)
      %5 = iadd(%0, %4) : index(a + 1)
      %6 = reshape(%x, %3) : f32[a*b]
      %7 = iota(%2) {dtype="i64"} : i64[a + b]
      %8 = iota(%5) {dtype="i64"} : i64[a + 1]
      return %6, %7, %8
    }
    """
    check_golden(fold_shapes, src, src)


def test_index_outputs_are_replaced_too():
    check_golden(
        fold_shapes,
        """
        func @main(%x: f32[a, 8]) {
          sym a in [1, inf]  (input 'x' dim 0)
          %0 = dim(%x) {axis=1} : index(8)
          %1 = dim(%x) {axis=0} : index(a)
          %2 = dim(%x) {axis=0} : index(a)
          return %0, %2, %1
        }
        """,
        """
        func @main(%x: f32[a, 8]) {
          sym a in [1, inf]  (input 'x' dim 0)
          %0 = index_const() {value=8} : index(8)
          %1 = dim(%x) {axis=0} : index(a)
          return %0, %1, %1
        }
        """,
    )
