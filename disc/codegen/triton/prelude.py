"""Triton helpers the generated kernels call, for ops Triton has no single primitive for.

Written with ``triton.language`` primitives only, so the same code runs on a
GPU and in Triton's interpreter (``TRITON_INTERPRET=1``, which is how CI tests
the GPU path on a CPU): the interpreter does not implement ``libdevice``.
Each follows torch's semantics: NaN propagates, integer division truncates
(``div``) or floors (``floor_div``), ``round`` is half to even.
"""

import triton
import triton.language as tl


@triton.jit
def disc_sign(x):
    return tl.where(x > 0, 1, tl.where(x < 0, -1, 0)).to(x.dtype)  # NaN gives 0, as torch.sign


@triton.jit
def disc_relu(x):
    return tl.where(x > 0, x, tl.where(x != x, x, 0).to(x.dtype))


@triton.jit
def disc_max(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def disc_min(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def disc_expm1(x):
    # Kahan's form: (u - 1) * x / log(u) cancels the rounding of u = exp(x), so small x keep full precision.
    u = tl.exp(x)
    um1 = u - 1.0
    exact = (um1 == 0.0) | (um1 == -1.0)  # x tiny (the result is x) or very negative (-1)
    precise = um1 * x / tl.log(tl.where(exact, 2.0, u))
    out = tl.where(um1 == 0.0, x, tl.where(um1 == -1.0, -1.0, precise))
    return tl.where(u == float("inf"), u, out)


@triton.jit
def disc_log1p(x):
    u = 1.0 + x
    d = u - 1.0
    precise = tl.log(u) * x / tl.where(d == 0.0, 1.0, d)
    return tl.where(d == 0.0, x, tl.where(u == float("inf"), u, precise))


@triton.jit
def disc_tanh(x):
    # tanh(|x|) = -expm1(-2|x|) / (2 + expm1(-2|x|)): no cancellation near 0, no overflow for large |x|.
    e = disc_expm1(-2.0 * tl.abs(x))
    t = -e / (2.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def disc_round(x):
    # Half to even, as torch.round: floor(x + 0.5), minus one where that rounded a tie up to an odd value.
    r = tl.floor(x + 0.5)
    odd = (r - 2.0 * tl.floor(r * 0.5)) != 0.0
    return tl.where((r - x == 0.5) & odd, r - 1.0, r)


@triton.jit
def disc_gelu(x):
    return 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))


@triton.jit
def disc_gelu_tanh(x):
    return 0.5 * x * (1.0 + disc_tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))


@triton.jit
def disc_silu(x):
    return x * tl.sigmoid(x)


@triton.jit
def disc_pow(x, y):
    # exp(y log|x|), with the sign of an integer power of a negative base; 0 ** negative is inf.
    a = tl.exp(y * tl.log(tl.abs(x)))
    y_int = tl.floor(y) == y
    y_odd = y_int & ((y - 2.0 * tl.floor(y * 0.5)) != 0.0)
    neg = tl.where(y_int, tl.where(y_odd, -a, a), float("nan"))
    out = tl.where(x < 0, neg, a)
    return tl.where(y == 0.0, 1.0, tl.where(x == 1.0, 1.0, out))


@triton.jit
def disc_floor_div(a, b):
    # Integer // truncates in Triton (C semantics): step down where the remainder's sign differs from b's.
    q = a // b
    r = a - q * b
    return tl.where((r != 0) & ((r < 0) != (b < 0)), q - 1, q)


@triton.jit
def disc_shift_left(a, b):
    # Outside [0, bits) a shift gives the sign fill alone, as in the C++ prelude (the hardware
    # shift takes the amount modulo the width).
    outside = (b < 0) | (b >= a.dtype.primitive_bitwidth)
    return tl.where(outside, 0, a << tl.where(outside, 0, b))


@triton.jit
def disc_shift_right(a, b):
    outside = (b < 0) | (b >= a.dtype.primitive_bitwidth)
    return tl.where(outside, tl.where(a < 0, -1, 0), a >> tl.where(outside, 0, b))


@triton.jit
def disc_fmod(a, b):
    # C's fmod, for floats and ints. fmod(+-inf, b) is NaN; the GPU's float % gave a number there
    # (seen on an H100 with Triton 3.6), so a non-finite a is mapped to NaN explicitly: a - a is
    # NaN exactly for infinite or NaN floats, and 0 for finite values and every integer.
    return tl.where((a - a) != 0, a - a, a % b)


@triton.jit
def disc_floor_div_f(a, b):
    # Floor of the exact quotient, as in the C++ prelude: tl.floor(a / b) is wrong where a / b rounds
    # up to an integer the exact quotient lies just below. a - fmod(a, b) is an exact multiple of b.
    q = a / b
    mod = disc_fmod(a, b)
    div = (a - mod) / b
    div = tl.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1.0, div)
    down = tl.floor(div)
    down = tl.where(div - down > 0.5, down + 1.0, down)
    return tl.where(b == 0, q, tl.where(div == 0, q * 0.0, down))  # q * 0.0: a zero with the quotient's sign


@triton.jit
def disc_remainder(a, b):
    # Python's modulo: the result takes the sign of b (Triton's % is C's fmod).
    r = disc_fmod(a, b)
    return tl.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)


@triton.jit
def disc_add(a, b):
    return a + b


@triton.jit
def disc_mul(a, b):
    return a * b


@triton.jit
def disc_uniform(seed, site_offset, i):
    # random_uniform (disc/ir/ops/random.py): SplitMix64 of (seed, site, position), bit for bit the
    # reference's and the C++ kernel's numbers; 64-bit unsigned arithmetic wraps as in C.
    z = seed.to(tl.uint64, bitcast=True) + site_offset + i.to(tl.uint64, bitcast=True) * 0x9E3779B97F4A7C15
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB
    z = z ^ (z >> 31)
    return (z >> 40).to(tl.int32).to(tl.float32) * 5.9604644775390625e-08


@triton.jit
def disc_sinh(x):
    # From expm1, not exp: (e^x - e^-x) / 2 cancels for small x.
    return 0.5 * (disc_expm1(x) - disc_expm1(-x))


@triton.jit
def disc_cosh(x):
    return 0.5 * (tl.exp(x) + tl.exp(-x))


@triton.jit
def disc_asinh(x):
    # asinh(a) = log1p(a + a^2 / (1 + sqrt(1 + a^2))) keeps small a exact; past 2^60, a^2 would
    # overflow and asinh(a) = log(2a) to float precision.
    a = tl.abs(x)
    small = disc_log1p(a + a * a / (1.0 + tl.sqrt(1.0 + a * a)))
    r = tl.where(a > 1.152921504606847e18, tl.log(a) + 0.6931471805599453, small)
    return tl.where(x < 0, -r, r)


@triton.jit
def disc_acosh(x):
    # acosh(1 + t) = log1p(t + sqrt(t (t + 2))), exact near 1; below 1 the sqrt gives NaN, as torch.
    t = x - 1.0
    r = disc_log1p(t + tl.sqrt(t * (t + 2.0)))
    return tl.where(x > 1.152921504606847e18, tl.log(x) + 0.6931471805599453, r)


@triton.jit
def disc_atanh(x):
    # atanh(x) = log1p(2x / (1 - x)) / 2: +-inf at +-1, NaN beyond, as torch.
    return 0.5 * disc_log1p(2.0 * x / (1.0 - x))


@triton.jit
def disc_round_bf16(x):
    # f32 to bf16, rounded to nearest even with NaN kept NaN, in integer steps: the compiled
    # conversion does this, and the interpreter's truncates (twice eager's error).
    bits = x.to(tl.uint32, bitcast=True)
    rounded = bits + 0x7FFF + ((bits >> 16) & 1)
    top = tl.where(x != x, bits | 0x400000, rounded) >> 16
    return top.to(tl.uint16).to(tl.bfloat16, bitcast=True)
