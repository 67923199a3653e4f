"""Golden tests of remove_noops: identity movement goes, movement chains compose."""

from __future__ import annotations

from golden import check_golden

from disc.passes.remove_noops import remove_noops


def test_removes_identity_ops_and_composes_chains():
    check_golden(
        remove_noops,
        """
        func @main(%x: f32[a, b], %y: f32[a, 1]) {
          sym a in [1, inf]  (input 'x' dim 0)
          sym b in [1, inf]  (input 'x' dim 1)
          %0 = dim(%x) {axis=0} : index(a)
          %1 = dim(%x) {axis=1} : index(b)
          %2 = broadcast_in_dim(%x, %0, %1) {dims=[0, 1]} : f32[a, b]
          %3 = broadcast_in_dim(%y, %0, %1) {dims=[0, 1]} : f32[a, b]
          %4 = transpose(%2) {perm=[0, 1]} : f32[a, b]
          %5 = transpose(%3) {perm=[1, 0]} : f32[b, a]
          %6 = transpose(%5) {perm=[1, 0]} : f32[a, b]
          %7 = convert(%6) {dtype="f32"} : f32[a, b]
          %8 = convert(%7) {dtype="f16"} : f16[a, b]
          %9 = imul(%0, %1) : index(a*b)
          %10 = reshape(%4, %9) : f32[a*b]
          %11 = reshape(%10, %0, %1) : f32[a, b]
          %12 = reshape(%10, %1, %0) : f32[b, a]
          %13 = reduce(%11) {dims=[], keepdim=false, kind="sum"} : f32[a, b]
          %14 = add(%13, %7) : f32[a, b]
          return %14, %8, %12
        }
        """,
        # %2, %4 (identity broadcast, identity perm), %11 (reshape back to x's
        # shape) and %13 (reduce over nothing) are %x; %6 (transpose twice) and
        # %7 (f32 -> f32) are %3; %12 reshapes %x directly. %3 is a real
        # broadcast (1 -> b) and stays, as does the f16 convert.
        """
        func @main(%x: f32[a, b], %y: f32[a, 1]) {
          sym a in [1, inf]  (input 'x' dim 0)
          sym b in [1, inf]  (input 'x' dim 1)
          %0 = dim(%x) {axis=0} : index(a)
          %1 = dim(%x) {axis=1} : index(b)
          %3 = broadcast_in_dim(%y, %0, %1) {dims=[0, 1]} : f32[a, b]
          %5 = transpose(%3) {perm=[1, 0]} : f32[b, a]
          %8 = convert(%3) {dtype="f16"} : f16[a, b]
          %9 = imul(%0, %1) : index(a*b)
          %10 = reshape(%x, %9) : f32[a*b]
          %12 = reshape(%x, %1, %0) : f32[b, a]
          %14 = add(%x, %3) : f32[a, b]
          return %14, %8, %12
        }
        """,
    )


def test_transpose_chains_compose():
    check_golden(
        remove_noops,
        """
        func @main(%x: f32[p, q, r]) {
          sym p in [1, inf]  (input 'x' dim 0)
          sym q in [1, inf]  (input 'x' dim 1)
          sym r in [1, inf]  (input 'x' dim 2)
          %0 = transpose(%x) {perm=[1, 2, 0]} : f32[q, r, p]
          %1 = transpose(%0) {perm=[1, 2, 0]} : f32[r, p, q]
          %2 = transpose(%1) {perm=[1, 2, 0]} : f32[p, q, r]
          %3 = exp(%2) : f32[p, q, r]
          return %1, %3
        }
        """,
        # %1 becomes one transpose of %x; %2 composes to the identity: it is %x.
        """
        func @main(%x: f32[p, q, r]) {
          sym p in [1, inf]  (input 'x' dim 0)
          sym q in [1, inf]  (input 'x' dim 1)
          sym r in [1, inf]  (input 'x' dim 2)
          %0 = transpose(%x) {perm=[1, 2, 0]} : f32[q, r, p]
          %1 = transpose(%x) {perm=[2, 0, 1]} : f32[r, p, q]
          %3 = exp(%x) : f32[p, q, r]
          return %1, %3
        }
        """,
    )


def test_maybe_broadcasts_and_real_reshapes_stay():
    # b may be 1 or not: the broadcast of %y is decided at run time, not a no-op.
    src = """
    func @main(%x: f32[a, b], %y: f32[a, c]) {
      sym a in [1, inf]  (input 'x' dim 0)
      sym b in [1, inf]  (input 'x' dim 1)
      sym c in [1, inf]  (input 'y' dim 1)
      %0 = dim(%x) {axis=0} : index(a)
      %1 = dim(%x) {axis=1} : index(b)
      %2 = broadcast_in_dim(%y, %0, %1) {dims=[0, 1]} : f32[a, b]
      %3 = index_const() {value=1} : index(1)
      %4 = reshape(%x, %0, %1, %3) : f32[a, b, 1]
      %5 = reshape(%4, %1, %0) : f32[b, a]
      return %2, %5
    }
    """
    check_golden(
        remove_noops,
        src,
        """
        func @main(%x: f32[a, b], %y: f32[a, c]) {
          sym a in [1, inf]  (input 'x' dim 0)
          sym b in [1, inf]  (input 'x' dim 1)
          sym c in [1, inf]  (input 'y' dim 1)
          %0 = dim(%x) {axis=0} : index(a)
          %1 = dim(%x) {axis=1} : index(b)
          %2 = broadcast_in_dim(%y, %0, %1) {dims=[0, 1]} : f32[a, b]
          %3 = index_const() {value=1} : index(1)
          %4 = reshape(%x, %0, %1, %3) : f32[a, b, 1]
          %5 = reshape(%x, %1, %0) : f32[b, a]
          return %2, %5
        }
        """,
    )


def test_broadcast_reads_through_a_unit_dim_reshape():
    # x.sum(1).unsqueeze(1) broadcast back over the row: the broadcast reads the sum directly
    # (%5), which is what lets the planner keep sum and use in one kernel. A reshape that moves
    # elements (%7, [a, b] -> [b, a]) or drops a unit dim (%9) is not skipped.
    check_golden(
        remove_noops,
        """
        func @main(%x: f32[a, b], %y: f32[a, 1]) {
          sym a in [1, inf]  (input 'x' dim 0)
          sym b in [1, inf]  (input 'x' dim 1)
          %0 = dim(%x) {axis=0} : index(a)
          %1 = dim(%x) {axis=1} : index(b)
          %2 = index_const() {value=1} : index(1)
          %3 = reduce(%x) {dims=[1], keepdim=false, kind="sum"} : f32[a]
          %4 = reshape(%3, %0, %2) : f32[a, 1]
          %5 = broadcast_in_dim(%4, %0, %1) {dims=[0, 1]} : f32[a, b]
          %6 = reshape(%4, %2, %0, %2) : f32[1, a, 1]
          %7 = reshape(%x, %1, %0) : f32[b, a]
          %8 = broadcast_in_dim(%7, %2, %1, %0) {dims=[1, 2]} : f32[1, b, a]
          %9 = reshape(%y, %0) : f32[a]
          %10 = broadcast_in_dim(%9, %0, %1) {dims=[0]} : f32[a, b]
          %11 = broadcast_in_dim(%6, %1, %0, %1) {dims=[0, 1, 2]} : f32[b, a, b]
          return %5, %8, %10, %11
        }
        """,
        # %11 reads %3 through two reshapes ([a] -> [a, 1] -> [1, a, 1], composed first); the
        # reshapes no longer read, %4 and the composed %6, are left for dce.
        """
        func @main(%x: f32[a, b], %y: f32[a, 1]) {
          sym a in [1, inf]  (input 'x' dim 0)
          sym b in [1, inf]  (input 'x' dim 1)
          %0 = dim(%x) {axis=0} : index(a)
          %1 = dim(%x) {axis=1} : index(b)
          %2 = index_const() {value=1} : index(1)
          %3 = reduce(%x) {dims=[1], keepdim=false, kind="sum"} : f32[a]
          %4 = reshape(%3, %0, %2) : f32[a, 1]
          %5 = broadcast_in_dim(%3, %0, %1) {dims=[0]} : f32[a, b]
          %6 = reshape(%3, %2, %0, %2) : f32[1, a, 1]
          %7 = reshape(%x, %1, %0) : f32[b, a]
          %8 = broadcast_in_dim(%7, %2, %1, %0) {dims=[1, 2]} : f32[1, b, a]
          %9 = reshape(%y, %0) : f32[a]
          %10 = broadcast_in_dim(%9, %0, %1) {dims=[0]} : f32[a, b]
          %11 = broadcast_in_dim(%3, %1, %0, %1) {dims=[1]} : f32[b, a, b]
          return %5, %8, %10, %11
        }
        """,
    )
