"""Division by a run-time divisor as a multiply-high and a shift.

A GPU has no integer divider: `n // d` by a value known only at run time compiles to about
twenty instructions (a reciprocal in floating point, then corrections). Inside a GEMM's main
loop, splitting every reduction index into (image, row, column) that way costs more issue
slots than the tensor-core products themselves. For a divisor fixed per launch, the quotient
is instead

    q = (umulhi(n, magic) + n) >> shift        for 0 <= n < 2^31,

with shift = ceil(log2 d) and magic = floor(2^32 * (2^shift - d) / d) + 1 (Granlund and
Montgomery's round-up method, as CUTLASS's FastDivmod): three instructions. `divider(d)`
computes (d, magic, shift) once per program, outside the loop that divides by it.
"""

import triton
import triton.language as tl


@triton.jit
def divider(d):
    """(d, magic, shift) for dividing non-negative int32 values by d (1 <= d < 2^31)."""
    d = d + tl.zeros((), tl.int32)  # a tensor even where d was specialized to a constant
    # shift = bit length of d - 1 (= ceil(log2 d)), by a binary search over 16, 8, 4, 2, 1.
    rest = d - 1
    shift = rest * 0
    for b in tl.static_range(4, -1, -1):
        wide = (rest >> (1 << b)) > 0
        rest = tl.where(wide, rest >> (1 << b), rest)
        shift += tl.where(wide, 1 << b, 0)
    shift += (rest > 0).to(tl.int32)
    # 2^shift - d < d, so the shifted numerator stays below 2^63 and magic below 2^32.
    magic = (((1 << shift) - d).to(tl.int64) << 32) // d + 1
    return d, magic.to(tl.uint32), shift.to(tl.uint32)


@triton.jit
def div_mod(n, div):
    """(n // d, n % d) for int32 n with 0 <= n < 2^31, `div` from divider(d)."""
    d, magic, shift = div
    u = n.to(tl.uint32)
    # umulhi(u, magic) < u, so the sum stays below 2^32.
    q = ((tl.umulhi(u, magic) + u) >> shift).to(tl.int32)
    return q, n - q * d


__all__ = ["div_mod", "divider"]
