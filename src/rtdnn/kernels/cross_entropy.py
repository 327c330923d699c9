"""Cross-entropy with the log-softmax fused in, one program per row of logits.

Per row i with target t, class weights w (ones when not given), label smoothing eps over C
classes and lse = log(sum_c exp(x_c)):

    loss_i = (1 - eps) * w_t * (lse - x_t) + eps / C * sum_c w_c * (lse - x_c)
    dloss_i/dx_j = (1 - eps) * w_t * (p_j - [j == t]) + eps / C * (sum_c w_c * p_j - w_j)

with p = softmax(x). Rows whose target is ignore_index contribute nothing. The forward saves lse
per row so the backward reads the logits once more and never recomputes the maximum.

The host refuses targets outside [0, C) (other than ignore_index) before launching; the kernels
never read at an out-of-range target anyway (the load is redirected to class 0) and give such
a row a NaN loss, so a direct call cannot read out of bounds or return a plausible number.
"""

import triton
import triton.language as tl


@triton.jit
def cross_entropy_fwd_kernel(X, T, W, LOSS, LSE, WT, C, stride_row, stride_class, ignore_index,
                             eps, HAS_WEIGHT: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    row = tl.program_id(0)
    base = X + row.to(tl.int64) * stride_row
    target = tl.load(T + row)  # int64: compared before any narrowing
    # Online log-sum-exp: a running maximum and a sum rescaled when the maximum grows.
    m = tl.full((BLOCK,), float("-inf"), tl.float32)
    s = tl.zeros((BLOCK,), tl.float32)
    wx = tl.zeros((BLOCK,), tl.float32)  # sum_c w_c * x_c, for label smoothing
    w_sum = tl.zeros((BLOCK,), tl.float32)
    for c0 in range(0, C, BLOCK):
        c = c0 + tl.arange(0, BLOCK)
        inside = c < C
        x = tl.load(base + c * stride_class, mask=inside, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        # Lanes that have only seen -inf keep a zero sum: shift by 0 there, not by -inf,
        # so that no -inf - -inf = NaN is ever formed.
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        s = s * tl.exp(m - shift) + tl.where(inside, tl.exp(x - shift), 0.0)
        m = m_new
        w = inside.to(tl.float32)
        if HAS_WEIGHT:
            w = tl.load(W + c, mask=inside, other=0.0).to(tl.float32)
        wx += w * tl.where(inside, x, 0.0)
        w_sum += w
    m_row = tl.max(m, axis=0)
    lse = m_row + tl.log(tl.sum(s * tl.exp(m - m_row), axis=0))
    valid = target != ignore_index
    in_range = (target >= 0) & (target < C)
    safe_t = tl.where(valid & in_range, target, 0).to(tl.int32)
    x_t = tl.load(base + safe_t * stride_class).to(tl.float32)
    w_t = tl.where(valid, 1.0, 0.0)
    if HAS_WEIGHT:
        w_t = tl.where(valid, tl.load(W + safe_t).to(tl.float32), 0.0)
    smooth = tl.sum(w_sum, axis=0) * lse - tl.sum(wx, axis=0)
    loss = (1.0 - eps) * w_t * (lse - x_t) + eps / C * smooth
    loss = tl.where(in_range, loss, float("nan"))
    tl.store(LOSS + row, tl.where(valid, loss, 0.0))
    tl.store(LSE + row, lse)
    tl.store(WT + row, w_t)


@triton.jit
def cross_entropy_bwd_kernel(X, T, W, LSE, WT, G, DX, C, stride_row, stride_class, dstride_row,
                             dstride_class, g_stride, ignore_index, eps, HAS_WEIGHT: tl.constexpr,
                             BLOCK: tl.constexpr):  # fmt: skip
    """G: the loss gradient per row (g_stride 0 broadcasts one scalar, already divided by the
    mean's denominator)."""
    row = tl.program_id(0)
    target = tl.load(T + row)
    valid = target != ignore_index
    in_range = (target >= 0) & (target < C)
    g = tl.load(G + row * g_stride).to(tl.float32)
    g = tl.where(valid, tl.where(in_range, g, float("nan")), 0.0)
    lse = tl.load(LSE + row)
    w_t = tl.load(WT + row)
    base = X + row.to(tl.int64) * stride_row
    dbase = DX + row.to(tl.int64) * dstride_row
    w_acc = tl.zeros((BLOCK,), tl.float32)
    for c0 in range(0, C, BLOCK):
        c = c0 + tl.arange(0, BLOCK)
        if HAS_WEIGHT:
            w_acc += tl.load(W + c, mask=c < C, other=0.0).to(tl.float32)
        else:
            w_acc += tl.where(c < C, 1.0, 0.0)
    w_sum = tl.sum(w_acc, axis=0)
    for c0 in range(0, C, BLOCK):
        c = c0 + tl.arange(0, BLOCK)
        inside = c < C
        x = tl.load(base + c * stride_class, mask=inside, other=0.0).to(tl.float32)
        p = tl.exp(x - lse)
        w = tl.where(inside, 1.0, 0.0)
        if HAS_WEIGHT:
            w = tl.load(W + c, mask=inside, other=0.0).to(tl.float32)
        d = (1.0 - eps) * w_t * (p - tl.where(c == target, 1.0, 0.0)) + eps / C * (w_sum * p - w)
        tl.store(dbase + c * dstride_class, (g * d).to(DX.dtype.element_ty), mask=inside)


@triton.jit
def sum_kernel(V, OUT, n, BLOCK: tl.constexpr):
    """OUT[0] = sum of V[0:n] in a fixed order (one program: deterministic)."""
    acc = tl.zeros((BLOCK,), tl.float32)
    for i0 in range(0, n, BLOCK):
        i = i0 + tl.arange(0, BLOCK)
        acc += tl.load(V + i, mask=i < n, other=0.0)
    tl.store(OUT, tl.sum(acc, axis=0))
