"""Squeeze-and-excitation kernels: y = x * gate(W2 act(W1 mean(x) + b1) + b2).

x is read as (N, C, L): its spatial dims collapsed into one of L positions with one stride.
The block runs in four launches each way, each float32 inside (one more backward above a
squeeze width of 128, see weight_grad_kernel):

    forward   pool_kernel         partial sums of x over slices of L  -> P [splits, N, C]
              squeeze_kernel      s0 = sum(P) / L, z1 = s0 W1^T + b1
              excite_kernel       z2 = act(z1) W2^T + b2
              scale_kernel        y = x * gate(z2)
    backward  pool_kernel         partial sums of dy * x              -> P [splits, N, C]
              excite_grad_kernel  g = sum(P) * gate'(z2), dz1 = (g W2) * act'(z1)
              weight_grad_kernel  per block of channels: dW2, db2, dW1 (and db1) summed over
                                  the rows in order, t = (dz1 W1) / L
              scale_kernel        dx = dy * gate(z2) + t

The small matrix products (N x C by C x R and back) are tiles of tl.dot in float32 with IEEE
precision, spread over blocks of rows and of R or C so that a large block keeps many
multiprocessors busy; every sum runs in a fixed order, so the results are deterministic.
"""

import triton
import triton.language as tl

from .mathfn import sigmoid

#: act (between the two products) and gate (the scale) by name, as the kernels take them.
ACTIVATIONS = {"relu": 0, "silu": 1}
GATES = {"sigmoid": 0, "hardsigmoid": 1}


@triton.jit
def _act(z, ACT: tl.constexpr):
    if ACT == 0:
        return tl.where(z < 0.0, 0.0, z)  # NaN passes through, as in torch.relu
    if ACT == 2:  # identity: excite_kernel computing the pooled gradient t
        return z
    return z * sigmoid(z)


@triton.jit
def _act_grad(z, ACT: tl.constexpr):
    if ACT == 0:
        return tl.where(z > 0.0, 1.0, 0.0)
    s = sigmoid(z)
    return s * (1.0 + z * (1.0 - s))


@triton.jit
def _gate(z, GATE: tl.constexpr):
    if GATE == 0:
        return sigmoid(z)
    return tl.minimum(tl.maximum(z / 6.0 + 0.5, 0.0), 1.0)


@triton.jit
def _gate_grad(z, GATE: tl.constexpr):
    if GATE == 0:
        s = sigmoid(z)
        return s * (1.0 - s)
    # torch's hardsigmoid_backward: 1/6 strictly inside (-3, 3), 0 elsewhere.
    return tl.where((z > -3.0) & (z < 3.0), 1.0 / 6.0, 0.0)


@triton.jit
def pool_kernel(
    A, B, P, N, C, L, span, sa_n, sa_c, sa_l, sb_n, sb_c, sb_l,
    PRODUCT: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """P[split, n, c] = sum over l in the split's `span` positions of a[n, c, l] (times
    b[n, c, l] when PRODUCT). Grid: (N, channel blocks, splits)."""
    n = tl.program_id(0)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    split = tl.program_id(2)
    c_ok = c < C
    acc = tl.zeros([BLOCK_L, BLOCK_C], tl.float32)
    start = split * span
    end = tl.minimum(start + span, L)
    for l0 in range(start, end, BLOCK_L):
        pos = l0 + tl.arange(0, BLOCK_L)
        mask = (pos < end)[:, None] & c_ok[None, :]
        a = tl.load(A + n * sa_n + pos[:, None] * sa_l + c[None, :] * sa_c, mask=mask, other=0.0)
        a = a.to(tl.float32)
        if PRODUCT:
            b = tl.load(B + n * sb_n + pos[:, None] * sb_l + c[None, :] * sb_c, mask=mask,
                        other=0.0)  # fmt: skip
            a = a * b.to(tl.float32)
        acc += a
    tl.store(P + (split * N + n) * C + c, tl.sum(acc, axis=0), mask=c_ok)


@triton.jit
def _pooled_sum(P, splits, n, c, nc_mask, N, C):
    """The pool's partial sums of rows n, channels c, added over its splits in order."""
    total = tl.zeros(nc_mask.shape, tl.float32)
    for s in range(splits):
        total += tl.load(P + (s * N + n[:, None]) * C + c[None, :], mask=nc_mask, other=0.0)
    return total


@triton.jit
def squeeze_kernel(
    P, splits, W1, B1, S0, Z1, N, C, R, inv_l, sw1_r, sw1_c,
    HAS_B1: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_R: tl.constexpr,
):  # fmt: skip
    """z1 = s0 W1^T + b1 for a block of rows and of R, s0 = the pool's splits summed / L;
    stores z1 (N x R) and, in the first block of R, s0 (N x C). Grid: (row blocks, R blocks)."""
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    r = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    r_ok = r < R
    z1 = tl.zeros([BLOCK_N, BLOCK_R], tl.float32)
    for c0 in range(0, C, BLOCK_C):
        c = c0 + tl.arange(0, BLOCK_C)
        c_ok = c < C
        nc_mask = n_ok[:, None] & c_ok[None, :]
        s0 = _pooled_sum(P, splits, n, c, nc_mask, N, C) * inv_l
        if tl.program_id(1) == 0:
            tl.store(S0 + n[:, None] * C + c[None, :], s0, mask=nc_mask)
        w1t = tl.load(
            W1 + r[None, :] * sw1_r + c[:, None] * sw1_c, mask=c_ok[:, None] & r_ok[None, :],
            other=0.0,
        )  # fmt: skip
        z1 = tl.dot(s0, w1t.to(tl.float32), z1, input_precision="ieee")
    if HAS_B1:
        z1 += tl.load(B1 + r, mask=r_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(Z1 + n[:, None] * R + r[None, :], z1, mask=n_ok[:, None] & r_ok[None, :])


@triton.jit
def excite_kernel(
    Z1, W2, B2, Z2, N, C, R, sw2_c, sw2_r, out_scale,
    ACT: tl.constexpr, HAS_B2: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_R: tl.constexpr,
):  # fmt: skip
    """z2 = (act(z1) W2^T + b2) * out_scale for a block of rows and of channels (BLOCK_R covers
    all of R); stores z2 (N x C). Grid: (row blocks, channel blocks). With the identity as act
    it also gives the backward's t = (dz1 W1) / L where weight_grad_kernel splits R."""
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = c < C
    r = tl.arange(0, BLOCK_R)
    r_ok = r < R
    nr_mask = n_ok[:, None] & r_ok[None, :]
    z1 = tl.load(Z1 + n[:, None] * R + r[None, :], mask=nr_mask, other=0.0)
    h = tl.where(nr_mask, _act(z1, ACT), 0.0)
    w2t = tl.load(
        W2 + c[None, :] * sw2_c + r[:, None] * sw2_r, mask=r_ok[:, None] & c_ok[None, :],
        other=0.0,
    )  # fmt: skip
    z2 = tl.dot(h, w2t.to(tl.float32), input_precision="ieee")
    if HAS_B2:
        z2 += tl.load(B2 + c, mask=c_ok, other=0.0).to(tl.float32)[None, :]
    z2 = z2 * out_scale
    tl.store(Z2 + n[:, None] * C + c[None, :], z2, mask=n_ok[:, None] & c_ok[None, :])


@triton.jit
def scale_kernel(
    X, Z2, T, Y, C, L, sx_n, sx_c, sx_l, sy_n, sy_c, sy_l,
    GATE: tl.constexpr, ADD: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """y[n, c, l] = x[n, c, l] * gate(z2[n, c]) (+ t[n, c] when ADD). Grid: (position
    blocks, channel blocks, N)."""
    pos = tl.program_id(0) * BLOCK_L + tl.arange(0, BLOCK_L)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    n = tl.program_id(2)
    c_ok = c < C
    mask = (pos < L)[:, None] & c_ok[None, :]
    s = _gate(tl.load(Z2 + n * C + c, mask=c_ok, other=0.0), GATE)
    x = tl.load(X + n * sx_n + pos[:, None] * sx_l + c[None, :] * sx_c, mask=mask, other=0.0)
    y = x.to(tl.float32) * s[None, :]
    if ADD:
        y += tl.load(T + n * C + c, mask=c_ok, other=0.0)[None, :]
    tl.store(Y + n * sy_n + pos[:, None] * sy_l + c[None, :] * sy_c, y, mask=mask)


@triton.jit
def _gate_grad_rows(P, splits, Z2, n, c, nc_mask, N, C, GATE: tl.constexpr):
    """g = dL/dz2 on rows n, channels c: the pool's splits of sum(dy * x) times gate'(z2)."""
    ds = _pooled_sum(P, splits, n, c, nc_mask, N, C)
    z2 = tl.load(Z2 + n[:, None] * C + c[None, :], mask=nc_mask, other=0.0)
    return tl.where(nc_mask, ds * _gate_grad(z2, GATE), 0.0)


@triton.jit
def excite_grad_kernel(
    P, splits, Z1, Z2, W2, DZ1, N, C, R, sw2_c, sw2_r,
    ACT: tl.constexpr, GATE: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_R: tl.constexpr,
):  # fmt: skip
    """dz1 = (g W2) * act'(z1) for a block of rows and of R, g = dL/dz2; stores dz1 (N x R).
    Grid: (row blocks, R blocks)."""
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    r = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    r_ok = r < R
    dh = tl.zeros([BLOCK_N, BLOCK_R], tl.float32)
    for c0 in range(0, C, BLOCK_C):
        c = c0 + tl.arange(0, BLOCK_C)
        c_ok = c < C
        g = _gate_grad_rows(P, splits, Z2, n, c, n_ok[:, None] & c_ok[None, :], N, C, GATE)
        w2 = tl.load(
            W2 + c[:, None] * sw2_c + r[None, :] * sw2_r, mask=c_ok[:, None] & r_ok[None, :],
            other=0.0,
        )  # fmt: skip
        dh = tl.dot(g, w2.to(tl.float32), dh, input_precision="ieee")
    nr_mask = n_ok[:, None] & r_ok[None, :]
    z1 = tl.load(Z1 + n[:, None] * R + r[None, :], mask=nr_mask, other=0.0)
    tl.store(DZ1 + n[:, None] * R + r[None, :], dh * _act_grad(z1, ACT), mask=nr_mask)


@triton.jit
def weight_grad_kernel(
    P, splits, S0, Z1, Z2, DZ1, W1, T, DW1, DB1, DW2, DB2, N, C, R, inv_l,
    sw1_r, sw1_c, sd1_r, sd1_c, sd2_c, sd2_r,
    ACT: tl.constexpr, GATE: tl.constexpr, HAS_B1: tl.constexpr, HAS_B2: tl.constexpr,
    WITH_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_R: tl.constexpr,
):  # fmt: skip
    """For a block of channels and of R, summed over the rows in order: dW2 = g^T act(z1),
    db2 = sum of g (first R block), dW1 = dz1^T s0, db1 = the column sums of dz1 (first
    channel block); and, WITH_T (one block covers all of R), t = (dz1 W1) / L, the pooled
    gradient spread over the L positions (N x C). Grid: (channel blocks, R blocks)."""
    cb = tl.program_id(0)
    c = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = c < C
    r = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    r_ok = r < R
    rc_mask = r_ok[:, None] & c_ok[None, :]
    w1 = tl.load(W1 + r[:, None] * sw1_r + c[None, :] * sw1_c, mask=rc_mask, other=0.0)
    w1 = w1.to(tl.float32)
    dw1 = tl.zeros([BLOCK_R, BLOCK_C], tl.float32)
    dw2 = tl.zeros([BLOCK_C, BLOCK_R], tl.float32)
    db1 = tl.zeros([BLOCK_R], tl.float32)
    db2 = tl.zeros([BLOCK_C], tl.float32)
    for n0 in range(0, N, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_ok = n < N
        nc_mask = n_ok[:, None] & c_ok[None, :]
        nr_mask = n_ok[:, None] & r_ok[None, :]
        g = _gate_grad_rows(P, splits, Z2, n, c, nc_mask, N, C, GATE)
        z1 = tl.load(Z1 + n[:, None] * R + r[None, :], mask=nr_mask, other=0.0)
        h = tl.where(nr_mask, _act(z1, ACT), 0.0)
        dz1 = tl.load(DZ1 + n[:, None] * R + r[None, :], mask=nr_mask, other=0.0)
        s0 = tl.load(S0 + n[:, None] * C + c[None, :], mask=nc_mask, other=0.0)
        dw2 = tl.dot(tl.trans(g), h, dw2, input_precision="ieee")
        db2 += tl.sum(g, axis=0)
        dw1 = tl.dot(tl.trans(dz1), s0, dw1, input_precision="ieee")
        db1 += tl.sum(dz1, axis=0)
        if WITH_T:
            t = tl.dot(dz1, w1, input_precision="ieee") * inv_l
            tl.store(T + n[:, None] * C + c[None, :], t, mask=nc_mask)
    tl.store(DW1 + r[:, None] * sd1_r + c[None, :] * sd1_c, dw1, mask=rc_mask)
    tl.store(DW2 + c[:, None] * sd2_c + r[None, :] * sd2_r, dw2, mask=c_ok[:, None] & r_ok[None, :])
    if HAS_B2:
        if tl.program_id(1) == 0:
            tl.store(DB2 + c, db2, mask=c_ok)
    if HAS_B1:
        if cb == 0:
            tl.store(DB1 + r, db1, mask=r_ok)
