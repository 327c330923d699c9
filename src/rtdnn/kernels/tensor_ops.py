"""OP functions of the elementwise kernel for op_tensor and dropout.

op_tensor computes op(alpha1 * A, alpha2 * B) with alpha1 = p0 and alpha2 = p1 (cuDNN's
cudnnOpTensor); the kernel's own alpha is 1 and its beta is the caller's.
"""

import triton
import triton.language as tl


@triton.jit
def op_add(a, b, c, index, p0, p1, p2, seed):
    return p0 * a + p1 * b


@triton.jit
def op_mul(a, b, c, index, p0, p1, p2, seed):
    return (p0 * a) * (p1 * b)


@triton.jit
def op_min(a, b, c, index, p0, p1, p2, seed):
    u = p0 * a
    v = p1 * b
    # NaN in either operand gives NaN, as torch.minimum.
    return tl.where((u < v) | (u != u), u, v)


@triton.jit
def op_max(a, b, c, index, p0, p1, p2, seed):
    u = p0 * a
    v = p1 * b
    return tl.where((u > v) | (u != u), u, v)


@triton.jit
def op_sqrt(a, b, c, index, p0, p1, p2, seed):
    return tl.sqrt_rn(p0 * a)


@triton.jit
def op_not(a, b, c, index, p0, p1, p2, seed):
    return 1.0 - p0 * a


OP_TENSOR = {"add": op_add, "mul": op_mul, "min": op_min, "max": op_max, "sqrt": op_sqrt,
             "not": op_not}  # fmt: skip
UNARY = ("sqrt", "not")


@triton.jit
def dropout_op(a, b, c, u, p0, p1, p2, seed):
    """Keep an element when its uniform u (the kernel's counter-based Philox number for the
    element's logical index) is >= p (p0), and scale kept ones by 1 / (1 - p) (p1).
    Multiplying by 0 (not selecting 0) keeps NaN inputs NaN, as torch's dropout does."""
    return a * tl.where(u >= p0, p1, 0.0)
