"""Spatial transformer kernels: the affine grid generator and the grid sampler.

Every problem is 3-D: a 2-D problem is a volume of depth 1 whose grid has no z coordinate
(THREE_D=False), so the z axis contributes one tap of weight 1 and is folded away at compile
time. All math is float32 whatever the storage dtype.

Sampler forward: a program owns BLOCK output points of one image and loops over the channels,
gathering the 8 (trilinear) or 4 (bilinear) corner taps of each point; taps outside the input
read 0 (the padding modes move the coordinate first, so only "zeros" ever reads outside).

Sampler backward: the same programs compute the grid gradient (a gather: deterministic) and
scatter the input gradient into a float32 buffer. The scatter uses atomic adds, whose order,
and so the last bits of the sum, vary from run to run; the deterministic variant gives each
program one image and a block of channels and visits the points one after the other with
plain loads and stores, so every sum runs in the same order (slower: the points are serial).
"""

from __future__ import annotations

import triton
import triton.language as tl

NEAREST, BILINEAR = 0, 1
ZEROS, BORDER, REFLECTION = 0, 1, 2


@triton.constexpr_function
def _taps(mode, three_d):
    """Input points read per output point: the trilinear or bilinear corners, or one."""
    return 1 if mode == NEAREST else (8 if three_d else 4)


@triton.jit
def _base_coord(i, size, ALIGN: tl.constexpr):
    """torch's affine_grid base coordinate of index i along an axis of `size` points."""
    f = i.to(tl.float32)
    s = size * 1.0  # a size of 1 arrives as a compile-time int
    if ALIGN:
        v = -1.0 + 2.0 * f / tl.maximum(s - 1.0, 1.0)
    else:
        v = (2.0 * f + 1.0) / s - 1.0
    return tl.where(size > 1, v, 0.0)


@triton.jit
def _base_point(p, D, H, W, ALIGN: tl.constexpr):
    """The normalized (x, y, z) of output point p (z is 0 for a 2-D problem, D == 1)."""
    x = _base_coord(p % W, W, ALIGN)
    y = _base_coord((p // W) % H, H, ALIGN)
    z = _base_coord(p // (W * H), D, ALIGN)
    return x, y, z


@triton.jit
def affine_grid_kernel(
    theta, grid, P, D, H, W,
    THREE_D: tl.constexpr, ALIGN: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """grid[n, p, k] = theta[n, k, :] . (x, y[, z], 1); theta and grid contiguous."""
    n = tl.program_id(0)
    p = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = p < P
    x, y, z = _base_point(p, D, H, W, ALIGN)
    K: tl.constexpr = 3 if THREE_D else 2
    for k in tl.static_range(K):
        row = theta + (n * K + k) * (K + 1)
        v = tl.load(row).to(tl.float32) * x + tl.load(row + 1).to(tl.float32) * y
        if THREE_D:
            v += tl.load(row + 2).to(tl.float32) * z
        v += tl.load(row + K).to(tl.float32)
        tl.store(grid + (n * P + p) * K + k, v.to(grid.dtype.element_ty), mask=mask)


@triton.jit
def affine_grid_backward_kernel(
    dgrid, dtheta, P, D, H, W,
    THREE_D: tl.constexpr, ALIGN: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """dtheta[n, k, j] = sum_p dgrid[n, p, k] * base[p, j]; one program per (n, k).

    The sums run in float64: each lane adds P / BLOCK terms of both signs whose total is far
    smaller than their magnitudes (a random dgrid: by sqrt(P)), and in float32 a 64^3 grid's
    sums lost two digits (1.4e-2 relative error, where torch's matrix product has 1e-5)."""
    n = tl.program_id(0)
    k = tl.program_id(1)
    K: tl.constexpr = 3 if THREE_D else 2
    ax = tl.zeros([BLOCK], tl.float64)
    ay = tl.zeros([BLOCK], tl.float64)
    az = tl.zeros([BLOCK], tl.float64)
    a1 = tl.zeros([BLOCK], tl.float64)
    for start in range(0, P, BLOCK):
        p = start + tl.arange(0, BLOCK)
        mask = p < P
        g = tl.load(dgrid + (n * P + p) * K + k, mask=mask, other=0.0).to(tl.float64)
        x, y, z = _base_point(p, D, H, W, ALIGN)
        ax += g * x.to(tl.float64)
        ay += g * y.to(tl.float64)
        az += g * z.to(tl.float64)
        a1 += g
    row = dtheta + (n * K + k) * (K + 1)
    tl.store(row, tl.sum(ax, 0).to(dtheta.dtype.element_ty))
    tl.store(row + 1, tl.sum(ay, 0).to(dtheta.dtype.element_ty))
    if THREE_D:
        tl.store(row + 2, tl.sum(az, 0).to(dtheta.dtype.element_ty))
    tl.store(row + K, tl.sum(a1, 0).to(dtheta.dtype.element_ty))


@triton.jit
def _source(g, size, PADDING: tl.constexpr, ALIGN: tl.constexpr):
    """Grid value -> input coordinate along one axis, and d coordinate / d grid value
    (torch's grid_sampler_compute_source_index_set_grad)."""
    s = size * 1.0  # a size of 1 arrives as a compile-time int
    if ALIGN:
        c = (g + 1.0) * 0.5 * (s - 1.0)
        mult = tl.zeros_like(g) + 0.5 * (s - 1.0)
    else:
        c = ((g + 1.0) * s - 1.0) * 0.5
        mult = tl.zeros_like(g) + 0.5 * s
    if PADDING == 2:  # reflection: fold into [low, high], then clip as border
        if ALIGN:
            low = 0.0
            span = s - 1.0
        else:
            low = -0.5
            span = s
        r = c - low
        sign = tl.where(r < 0, -1.0, 1.0)
        r = tl.abs(r)
        flips = tl.floor(r / tl.maximum(span, 1.0))
        extra = r - flips * span
        odd = (flips - 2.0 * tl.floor(flips * 0.5)) != 0
        c = tl.where(odd, span - extra + low, extra + low)
        mult = mult * tl.where(odd, -sign, sign)
        degenerate = span <= 0  # one point, align_corners: torch reflects to 0, gradient 0
        c = tl.where(degenerate, 0.0, c)
        mult = tl.where(degenerate, 0.0, mult)
    if PADDING != 0:  # border (and reflection): clip to [0, size - 1]
        mult = tl.where((c <= 0) | (c >= s - 1.0), 0.0, mult)
        c = tl.minimum(tl.maximum(c, 0.0), s - 1.0)
    return c, mult


@triton.jit
def _round_half_even(c):
    r = tl.floor(c + 0.5)
    tie = (r - c) == 0.5
    odd = (r - 2.0 * tl.floor(r * 0.5)) != 0
    return tl.where(tie & odd, r - 1.0, r)


@triton.jit
def _point(p, OH, OW):
    """Output point p's (depth, row, column)."""
    ow = p % OW
    oh = (p // OW) % OH
    od = p // (OW * OH)
    return od, oh, ow


@triton.jit
def _setup(
    grid, n, p, mask, OH, OW, ID, IH, IW, sgn, sgd, sgh, sgw, sgk,
    MODE: tl.constexpr, PADDING: tl.constexpr, ALIGN: tl.constexpr, THREE_D: tl.constexpr,
):  # fmt: skip
    """Per output point: the input coordinates, their floor and fractions, the gradient
    multipliers."""
    od, oh, ow = _point(p, OH, OW)
    gbase = grid + n * sgn + od * sgd + oh * sgh + ow * sgw
    gx = tl.load(gbase, mask=mask, other=0.0).to(tl.float32)
    gy = tl.load(gbase + sgk, mask=mask, other=0.0).to(tl.float32)
    cx, mx = _source(gx, IW, PADDING, ALIGN)
    cy, my = _source(gy, IH, PADDING, ALIGN)
    if THREE_D:
        gz = tl.load(gbase + 2 * sgk, mask=mask, other=0.0).to(tl.float32)
        cz, mz = _source(gz, ID, PADDING, ALIGN)
    else:
        cz = tl.zeros_like(cx)
        mz = tl.zeros_like(cx)
    if MODE == 0:
        cx = _round_half_even(cx)
        cy = _round_half_even(cy)
        cz = _round_half_even(cz)
    x0 = tl.floor(cx)
    y0 = tl.floor(cy)
    z0 = tl.floor(cz)
    return cx, cy, cz, x0, y0, z0, mx, my, mz


@triton.jit
def _tap(cx, cy, cz, x0, y0, z0, ID, IH, IW, mask, C: tl.constexpr, MODE: tl.constexpr):
    """Corner C's indices, in-bounds mask, weight (1 for nearest) and the 1-D weights fx, fy,
    fz whose product it is for (tri)linear."""
    DX: tl.constexpr = C & 1
    DY: tl.constexpr = (C >> 1) & 1
    DZ: tl.constexpr = (C >> 2) & 1
    tx = cx - x0
    ty = cy - y0
    tz = cz - z0
    fx = tx if DX == 1 else 1.0 - tx
    fy = ty if DY == 1 else 1.0 - ty
    fz = tz if DZ == 1 else 1.0 - tz
    xf = x0 + DX
    yf = y0 + DY
    zf = z0 + DZ
    inb = (xf >= 0) & (xf < IW) & (yf >= 0) & (yf < IH) & (zf >= 0) & (zf < ID) & mask
    xi = tl.where(inb, xf, 0.0).to(tl.int32)
    yi = tl.where(inb, yf, 0.0).to(tl.int32)
    zi = tl.where(inb, zf, 0.0).to(tl.int32)
    w = 1.0 if MODE == 0 else fx * fy * fz
    return xi, yi, zi, inb, w, fx, fy, fz


@triton.jit
def grid_sample_kernel(
    x, grid, y, C, P, OH, OW, ID, IH, IW,
    sxn, sxc, sxd, sxh, sxw,
    sgn, sgd, sgh, sgw, sgk,
    syn, syc, syd, syh, syw,
    MODE: tl.constexpr, PADDING: tl.constexpr, ALIGN: tl.constexpr, THREE_D: tl.constexpr,
    BLOCK: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """Grid (N, cdiv(P, BLOCK)): BLOCK output points of one image, every channel, BLOCK_C
    channels at a time. The points' corners and weights are computed once and serve every
    channel; a block of channels keeps BLOCK_C gathers per corner in flight (the gathers'
    latency, not their bytes, bounds a channel at a time)."""
    n = tl.program_id(0)
    p = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = p < P
    cx, cy, cz, x0, y0, z0, mx, my, mz = _setup(
        grid, n, p, mask, OH, OW, ID, IH, IW, sgn, sgd, sgh, sgw, sgk,
        MODE, PADDING, ALIGN, THREE_D,
    )  # fmt: skip
    od, oh, ow = _point(p, OH, OW)
    ybase = y + n * syn + od * syd + oh * syh + ow * syw
    TAPS: tl.constexpr = _taps(MODE, THREE_D)
    cs = tl.arange(0, BLOCK_C)
    for c0 in range(0, C, BLOCK_C):
        c = c0 + cs
        acc = tl.zeros([BLOCK_C, BLOCK], tl.float32)
        for t in tl.static_range(TAPS):
            xi, yi, zi, inb, w, _, _, _ = _tap(cx, cy, cz, x0, y0, z0, ID, IH, IW, mask, t, MODE)
            at = zi * sxd + yi * sxh + xi * sxw
            v = tl.load(
                x + n * sxn + c[:, None] * sxc + at[None, :],
                mask=(c < C)[:, None] & inb[None, :],
                other=0.0,
            ).to(tl.float32)
            acc += v * w
        tl.store(
            ybase[None, :] + c[:, None] * syc,
            acc.to(y.dtype.element_ty),
            mask=(c < C)[:, None] & mask[None, :],
        )


@triton.jit
def grid_sample_backward_kernel(
    dy, x, grid, dx, dgrid, C, P, OH, OW, ID, IH, IW,
    sdn, sdc, sdd, sdh, sdw,
    sxn, sxc, sxd, sxh, sxw,
    sgn, sgd, sgh, sgw, sgk,
    MODE: tl.constexpr, PADDING: tl.constexpr, ALIGN: tl.constexpr, THREE_D: tl.constexpr,
    INPUT_GRAD: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """dgrid (contiguous (N, P, K), grid's dtype) always; dx (contiguous float32 (N, C, D*H*W),
    zeroed) by atomic adds when INPUT_GRAD."""
    n = tl.program_id(0)
    p = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = p < P
    cx, cy, cz, x0, y0, z0, mx, my, mz = _setup(
        grid, n, p, mask, OH, OW, ID, IH, IW, sgn, sgd, sgh, sgw, sgk,
        MODE, PADDING, ALIGN, THREE_D,
    )  # fmt: skip
    od, oh, ow = _point(p, OH, OW)
    dybase = dy + n * sdn + od * sdd + oh * sdh + ow * sdw
    TAPS: tl.constexpr = _taps(MODE, THREE_D)
    gx = tl.zeros([BLOCK], tl.float32)
    gy = tl.zeros([BLOCK], tl.float32)
    gz = tl.zeros([BLOCK], tl.float32)
    volume = ID * IH * IW
    for c in range(0, C):
        g = tl.load(dybase + c * sdc, mask=mask, other=0.0).to(tl.float32)
        for t in tl.static_range(TAPS):
            xi, yi, zi, inb, w, fx, fy, fz = _tap(cx, cy, cz, x0, y0, z0, ID, IH, IW, mask, t, MODE)
            if INPUT_GRAD:
                dst = dx + (n * C + c) * volume + (zi * IH + yi) * IW + xi
                # Relaxed: only the sum matters, not the order other threads see it in; the
                # default (acquire-release) fences every add.
                tl.atomic_add(dst, g * w, mask=inb, sem="relaxed")
            if MODE == 1:
                v = tl.load(
                    x + n * sxn + c * sxc + zi * sxd + yi * sxh + xi * sxw, mask=inb, other=0.0
                ).to(tl.float32)
                # d weight / d coordinate: +1 for the far corner of an axis, -1 for the near.
                gx += ((t & 1) * 2.0 - 1.0) * v * fy * fz * g
                gy += (((t >> 1) & 1) * 2.0 - 1.0) * v * fx * fz * g
                if THREE_D:
                    gz += (((t >> 2) & 1) * 2.0 - 1.0) * v * fx * fy * g
    K: tl.constexpr = 3 if THREE_D else 2
    out = dgrid + (n * P + p) * K
    tl.store(out, (gx * mx).to(dgrid.dtype.element_ty), mask=mask)
    tl.store(out + 1, (gy * my).to(dgrid.dtype.element_ty), mask=mask)
    if THREE_D:
        tl.store(out + 2, (gz * mz).to(dgrid.dtype.element_ty), mask=mask)


@triton.jit
def grid_sample_input_grad_serial_kernel(
    dy, grid, dx, C, P, OH, OW, ID, IH, IW,
    sdn, sdc, sdd, sdh, sdw,
    sgn, sgd, sgh, sgw, sgk,
    MODE: tl.constexpr, PADDING: tl.constexpr, ALIGN: tl.constexpr, THREE_D: tl.constexpr,
    BLOCK_C: tl.constexpr,
):  # fmt: skip
    """Deterministic input gradient: one program per (image, channel block) visits the points
    in order, each point's taps by plain read-modify-write (no two programs share an address)."""
    n = tl.program_id(0)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = c < C
    volume = ID * IH * IW
    for p in range(0, P):
        # A one-lane vector: the helpers are written for vectors of points.
        pv = p + tl.arange(0, 1)
        one = pv < P
        cx, cy, cz, x0, y0, z0, mx, my, mz = _setup(
            grid, n, pv, one, OH, OW, ID, IH, IW, sgn, sgd, sgh, sgw, sgk,
            MODE, PADDING, ALIGN, THREE_D,
        )  # fmt: skip
        od, oh, ow = _point(pv, OH, OW)
        g = tl.load(
            dy + n * sdn + od[:, None] * sdd + oh[:, None] * sdh + ow[:, None] * sdw
            + c[None, :] * sdc,
            mask=cmask[None, :], other=0.0,
        ).to(tl.float32)  # fmt: skip
        TAPS: tl.constexpr = _taps(MODE, THREE_D)
        for t in tl.static_range(TAPS):
            xi, yi, zi, inb, w, _, _, _ = _tap(cx, cy, cz, x0, y0, z0, ID, IH, IW, one, t, MODE)
            dst = dx + (n * C + c[None, :]) * volume + ((zi * IH + yi) * IW + xi)[:, None]
            m = inb[:, None] & cmask[None, :]
            cur = tl.load(dst, mask=m, other=0.0)
            tl.store(dst, cur + g * w[:, None], mask=m)
