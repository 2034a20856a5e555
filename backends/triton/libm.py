"""Math that Triton has no operation for, as `@triton.jit` helpers the generated kernels call
(`libm.atan(x)`): every kernel module imports this one (codegen.HEADER).

Built from Triton's basic operations only: its interpreter, which runs the kernels without a
GPU, cannot call libdevice (`tl.extra.cuda.libdevice` raises there), and a helper that ran on
the GPU alone would go untested. Where float32 would lose accuracy the helpers compute in
float64, which on the GPU Triton lowers to correctly rounded division and square root and
libdevice-grade exp, log, sin and cos (float32 `/`, `tl.sqrt` and `tl.exp` are approximate
there), so the float32 result is the exact value rounded, to within an ulp:

1. tan, sinh, cosh, asinh, acosh, atanh: the textbook formulas in float64, with the argument
   itself returned below 1e-5 where a formula cancels (sinh, asinh, atanh: the next term is
   below float32's precision).
2. atan, asin, acos: Cephes' float64 atan (range reduction to |t| <= 0.66, a degree 4/5
   rational; relative error 2 float64 ulps); asin(x) = atan(x / sqrt((1-x)(1+x))) and
   acos(x) = 2 atan(sqrt((1-x)/(1+x))), whose products and quotients of float32 values are
   exact or rounded once in float64 (no cancellation near +-1).
3. rint: round half to even, exactly, by the float32 sum |x| + 2**23 (whose rounding is the
   answer) for |x| < 2**23; larger floats are whole already.
4. fmod, mod: exact, like np.fmod and np.mod. fmod reduces |a| by |b| * 2**k in float64 steps
   (each quotient below 2**28 is then exact; see `fmod`); mod adds b where the signs differ, in
   float32, as NumPy does. A float `%` is no substitute: on the GPU it is a - trunc(a/b) * b,
   wrong once a/b is large.
5. imod, ifmod: integer remainders as NumPy gives them (0 for a zero divisor, and for -1,
   whose quotient of the type's minimum overflows).
6. multiply: the combine function of a product reduction.

A float's sign is flipped by multiplying by -1: Triton 3.6 (the GPU machines') lowers a float's
unary minus to 0 - x, which loses the sign of a zero.

The float helpers take float32 tensors or float literals (a splat operand) and return float32.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def tan(x):
    w = tl.cast(x, tl.float64)
    return (tl.sin(w) / tl.cos(w)).to(tl.float32)


@triton.jit
def sinh(x):
    w = tl.cast(x, tl.float64)
    return tl.where(tl.abs(w) < 1e-5, w, 0.5 * (tl.exp(w) - tl.exp(-w))).to(tl.float32)


@triton.jit
def cosh(x):
    w = tl.cast(x, tl.float64)
    return (0.5 * (tl.exp(w) + tl.exp(-w))).to(tl.float32)


@triton.jit
def asinh(x):
    w = tl.cast(x, tl.float64)
    a = tl.abs(w)
    r = tl.log(a + tl.sqrt(a * a + 1.0))
    return tl.where(a < 1e-5, w, tl.where(w < 0.0, -r, r)).to(tl.float32)


@triton.jit
def acosh(x):
    w = tl.cast(x, tl.float64)
    return tl.where(w < 1.0, float("nan"), tl.log(w + tl.sqrt(w * w - 1.0))).to(tl.float32)


@triton.jit
def atanh(x):
    w = tl.cast(x, tl.float64)
    return tl.where(tl.abs(w) < 1e-5, w, 0.5 * tl.log((1.0 + w) / (1.0 - w))).to(tl.float32)


@triton.jit
def atan64(w):
    """Cephes atan in float64: with n = 2 quarter turns for |w| above tan(3pi/8) (t = -1/|w|),
    one above 0.66 (t = (|w|-1)/(|w|+1)), else none (t = |w|): n pi/4 + t + t z P(z)/Q(z) for
    z = t*t, pi/4's low bits added back. +-0 and NaN come back as they are."""
    a = tl.abs(w)
    big = a > 2.41421356237309504880
    mid = a > 0.66
    n = big.to(tl.float64) + mid.to(tl.float64)
    t = tl.where(big, -1.0 / a, tl.where(mid, (a - 1.0) / (a + 1.0), a))
    z = t * t
    p = (((-8.750608600031904122785e-1 * z - 1.615753718733365076637e1) * z - 7.500855792314704667340e1) * z
         - 1.228866684490136173410e2) * z - 6.485021904942025371773e1
    q = ((((z + 2.485846490142306297962e1) * z + 1.650270098316988542046e2) * z + 4.328810604912902668951e2) * z
         + 4.853903996359136964868e2) * z + 1.945506571482613964425e2
    y = n * 0.78539816339744830962 + (t + t * (z * p / q) + n * 3.061616997868382943065e-17)
    return tl.where(w < 0.0, -y, tl.where(w > 0.0, y, w))


@triton.jit
def atan(x):
    return atan64(tl.cast(x, tl.float64)).to(tl.float32)


@triton.jit
def asin(x):
    w = tl.cast(x, tl.float64)
    return atan64(w / tl.sqrt((1.0 - w) * (1.0 + w))).to(tl.float32)


@triton.jit
def acos(x):
    w = tl.cast(x, tl.float64)
    return (2.0 * atan64(tl.sqrt((1.0 - w) / (1.0 + w)))).to(tl.float32)


@triton.jit
def rint(x):
    x = tl.cast(x, tl.float32)
    a = tl.abs(x)
    r = (a + 8388608.0) - 8388608.0
    r = tl.where(x.to(tl.int32, bitcast=True) < 0, r * -1.0, r)
    return tl.where(a < 8388608.0, r, x)


@triton.jit
def saturate(q, low, high):
    """q clamped to [low, high], NaN to low: QuantizeLinear's saturation, as the NumPy kernel's fmax/fmin."""
    return tl.where(q != q, low, tl.minimum(tl.maximum(q, low), high))


@triton.jit
def _exponent(w):
    """The biased exponent field of a non-negative float64."""
    return w.to(tl.int64, bitcast=True) >> 52


@triton.jit
def fmod(a, b):
    """a - n*b for the whole n = trunc(a/b), exactly, with a's sign; NaN for b = 0 or an
    infinite a, a itself for an infinite b.

    In float64, r = |a| and y = |b| have 24-bit significands, and so has every remainder on
    the way. A step takes c = y * 2**k (exact), k chosen so that r/c < 2**28, and r -= n*c for
    n = floor(r/c): the rounded quotient has the right whole part (a quotient of 24-bit
    significands that is not whole is at least 2**-24 from the nearest whole number, further
    than the rounding moves it), and n*c and the difference are exact. Each step shrinks the
    exponent gap by 27; float32 gaps reach 276, so 11 steps, the last with k = 0, suffice."""
    a = tl.cast(a, tl.float32)
    b = tl.cast(b, tl.float32)
    r = tl.abs(a.to(tl.float64))
    y = tl.abs(b.to(tl.float64))
    for _ in tl.static_range(11):
        k = tl.minimum(tl.maximum(_exponent(r) - _exponent(y) - 27, 0), 1000)
        c = y * ((k + 1023) << 52).to(tl.float64, bitcast=True)
        r = r - tl.floor(r / c) * c
    r32 = r.to(tl.float32)
    r32 = tl.where(a.to(tl.int32, bitcast=True) < 0, r32 * -1.0, r32)
    r32 = tl.where(tl.abs(b) == float("inf"), a, r32)
    return tl.where((b == 0.0) | (tl.abs(a) == float("inf")) | (a != a) | (b != b), float("nan"), r32)


@triton.jit
def mod(a, b):
    """fmod(a, b) moved into b's sign by adding b, and a zero remainder given b's sign (np.mod)."""
    b = tl.cast(b, tl.float32)
    m = fmod(a, b)
    m = tl.where((m != 0.0) & ((m < 0.0) != (b < 0.0)), m + b, m)
    return tl.where(m == 0.0, tl.where(b < 0.0, tl.abs(m) * -1.0, tl.abs(m)), m)


@triton.jit
def ifmod(a, b):
    """The remainder of truncating division (C's %, np.fmod), 0 for b in {0, -1}."""
    return a % tl.where((b == 0) | (b == -1), 1, b)


@triton.jit
def imod(a, b):
    """The remainder of flooring division (Python's %, np.mod): b's sign; 0 for b in {0, -1}."""
    r = ifmod(a, b)
    return tl.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)


@triton.jit
def multiply(a, b):
    return a * b
