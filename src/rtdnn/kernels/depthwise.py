"""Depthwise convolution by rows: DIRECT's kernels for one input channel per group.

A depthwise layer does a few multiply-adds per byte it moves (9 for a 3x3 filter), so its bar
is bandwidth, and what keeps the flat-tile kernels of kernels/direct.py under it is instruction
issue: every tap of every element costs a load, a convert to float32 and an FMA, plus a gather
of the filter, whose channels lie KH*KW apart. These kernels cut that down three ways:

- The filter is read from a float32 copy packed tap-major, P[tap, k] (pack_filter_kernel, into
  DIRECT's workspace): a thread's channels of one tap are one vector load, not a gather with
  a convert per channel.
- Programs own rows: (one image, a band of ROWS output rows, BLOCK_W columns, BLOCK_C
  channels), so pixel coordinates are counters, not divisions of a flat index, and the zero
  padding above and below the image is skipped, not multiplied.
- Forward rolls down the band (dilation 1 along H, any stride S), R output rows per step:
  each input row is loaded and converted once per filter column and feeds the output rows
  whose windows hold it (KH / S of them), in a ring of accumulators, and each filter element
  read serves the R rows; finished output rows leave the ring through the epilogue. That is
  one convert per KH / S multiply-adds, and one filter load per R * (pixels per thread),
  instead of one of each per multiply-add.

Backward-data is the forward kernel on dy with the filter flipped (packed with FLIP): at
stride 1 with the padding mirrored, (R - 1) * dil - pad; at a larger stride once per stride
phase, each a stride-1 pass over a strided subset of the packed taps (PD, PH, PW) writing every
stride-th dx element (algos/direct.py, _data_passes). Backward-filter
(depthwise_filter_rows_kernel) walks the rows of a chunk for one filter row, each thread over
runs of V consecutive output columns, so that an input column it loads serves every tap that
reads it, and writes float32 partial sums that direct_filter_finish_kernel adds in a fixed
order. Every problem is 3-D as in
conv_addressing.ConvGeometry; the strides make any layout work, channels-last gives vectors.

    forward          y[n, k, o]  = sum_r x[n, k // KG, o*s - p + r*d] * w[k, 0, r]
    backward-filter  dw[k, 0, r] = sum_{n, o} dy[n, k, o] * x[n, k // KG, o*s - p + r*d]
"""

import triton
import triton.language as tl

from .brgemm import epilogue
from .conv_addressing import split_tap
from .direct import band_coords, input_channels


@triton.jit
def pack_filter_kernel(W, P, geo, K, KP, FLIP: tl.constexpr, BLOCK: tl.constexpr):
    """P[tap, k] = float32(w[k, 0, tap]) for every tap of the (KD, KH, KW) filter, rows KP
    apart, w read through geo's filter strides (a flipped view for true convolution). FLIP
    reverses the taps: the filter of backward-data run as a forward convolution."""
    kd, kh, kw = geo.kernel
    ws_k, ws_c, ws_d, ws_h, ws_w = geo.w_strides
    w_off = geo.offsets[1]
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < kd * kh * kw * K
    tap = offs // K
    k = offs % K
    rd, rh, rw = split_tap(tap, geo.kernel)
    if FLIP:
        rd, rh, rw = kd - 1 - rd, kh - 1 - rh, kw - 1 - rw
    w = tl.load(W + w_off + k * ws_k + rd * ws_d + rh * ws_h + rw * ws_w, mask=ok)
    tl.store(P + tap * KP + k, w.to(tl.float32), mask=ok)


@triton.jit
def _input_rows(accs, Xrow, P, live, w_ok, k_ok, dw, in_w, iw0, xs_h, xs_w, KP: tl.constexpr,
                KH: tl.constexpr, KW: tl.constexpr, PH: tl.constexpr, PW: tl.constexpr,
                S: tl.constexpr, R: tl.constexpr):  # fmt: skip
    """The ring accs plus the products of the R * S input rows of one step in one depth plane:
    input row u meets ring slot j as filter row u + (D - j) * S (D = ceil(KH / S) - 1) where
    that is a row of the filter. Xrow: pointers into the first row at each column's window
    corner; P: the packed filter's first tap of the plane, per channel, filter row rh and
    column rw PH * rh + PW * rw taps further; live[u]: input row u is in the image (else it
    reads as zeros)."""
    D: tl.constexpr = (KH + S - 1) // S - 1
    for rw in tl.static_range(KW):
        i_w = iw0 + rw * dw
        cols = (w_ok & (i_w >= 0) & (i_w < in_w))[:, None] & k_ok[None, :]
        xs = ()
        for u in tl.static_range(R * S):
            xv = tl.load(Xrow + (u * xs_h + rw * dw * xs_w), mask=cols & live[u], other=0.0)
            xs = xs + (xv.to(tl.float32),)
        out = ()
        for j in tl.static_range(D + R):
            acc = accs[j]
            # A filter element serves every input row that meets it in this step (the
            # compiler reads it once).
            for u in tl.static_range(R * S):
                if (u + (D - j) * S >= 0) and (u + (D - j) * S < KH):
                    wv = tl.load(P + ((u + (D - j) * S) * PH + rw * PW) * KP)
                    acc += xs[u] * wv[None, :]
            out = out + (acc,)
        accs = out
    return accs


@triton.jit
def depthwise_rows_kernel(
    X,
    P,
    Y,
    BIAS,
    geo,
    K,
    alpha,
    beta,
    KP: tl.constexpr,
    PD: tl.constexpr,
    PH: tl.constexpr,
    PW: tl.constexpr,
    KG: tl.constexpr,
    KD: tl.constexpr,
    KH: tl.constexpr,
    KW: tl.constexpr,
    S: tl.constexpr,
    ACTIVATION: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BETA_NONZERO: tl.constexpr,
    ROWS: tl.constexpr,
    R: tl.constexpr,
    BLOCK_W: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """y = act(alpha * conv(x, w) + bias + beta * y) for a band of ROWS output rows of one
    image (n, od), BLOCK_W columns and BLOCK_C channels, R output rows per step. Stride S and
    dilation 1 along H; any along D and W. P: the filter packed by pack_filter_kernel, rows KP
    apart (a constant, so that every tap's address is an immediate offset), tap (rd, rh, rw)
    at row PD * rd + PH * rh + PW * rw (a strided subset of a larger packed filter: a stride
    phase of backward-data); K: output channels."""
    in_d, in_h, in_w = geo.in_size
    od_n, oh_n, ow_n = geo.out_size
    sd, sh, sw = geo.stride
    pd, ph, pw = geo.padding
    dd, dh, dw = geo.dilation
    xs_n, xs_c, xs_d, xs_h, xs_w = geo.x_strides
    ys_n, ys_k, ys_d, ys_h, ys_w = geo.y_strides
    x_off, w_off, y_off = geo.offsets
    # Output row o needs input rows o * S - ph + rh: a finished row waits for D more steps.
    D: tl.constexpr = (KH + S - 1) // S - 1

    c_blocks = tl.cdiv(K, BLOCK_C)
    pid_c, pid_w, n, od, o0, rows = band_coords(
        tl.program_id(0), c_blocks, geo.out_size, ROWS, BLOCK_W
    )

    offs_k = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    k_ok = offs_k < K
    ow = pid_w * BLOCK_W + tl.arange(0, BLOCK_W)
    w_ok = ow < ow_n
    iw0 = ow * sw - pw
    Xcols = X + (x_off + n * xs_n + iw0 * xs_w)[:, None]
    Xcols += (input_channels(offs_k, 0, 1, KG) * xs_c)[None, :]
    Pk = P + offs_k
    y_cols = (y_off + n * ys_n + od * ys_d + ow * ys_w)[:, None] + (offs_k * ys_k)[None, :]
    y_mask = w_ok[:, None] & k_ok[None, :]

    # Step s reads input rows i0 + u (u < R * S), i0 = (o0 + s * R) * S - ph. Ring slot j
    # holds output row o0 + first + j, first = s * R - D, which meets input row u as filter
    # row u + (D - j) * S. After the step, slots 0 .. R-1 have met all their filter rows.
    # Slots of rows outside the band take products that are never stored: cheaper than
    # branching.
    accs = (tl.zeros((BLOCK_W, BLOCK_C), dtype=tl.float32),) * (D + R)
    for s in range(tl.cdiv(rows + D, R)):
        i0 = (o0 + s * R) * S - ph
        first = s * R - D
        for rd in tl.static_range(KD):
            i_d = od * sd - pd + rd * dd
            live = ()
            for u in tl.static_range(R * S):
                live = live + ((i_d >= 0) & (i_d < in_d) & (i0 + u >= 0) & (i0 + u < in_h),)
            # Rows of zero padding above and below the image are skipped.
            if (i_d >= 0) & (i_d < in_d) & (i0 + R * S > 0) & (i0 < in_h):
                Xrow = Xcols + (i_d * xs_d + i0 * xs_h)
                accs = _input_rows(
                    accs, Xrow, Pk + rd * PD * KP, live, w_ok, k_ok, dw, in_w, iw0, xs_h,
                    xs_w, KP, KH, KW, PH, PW, S, R,
                )  # fmt: skip
        for u in tl.static_range(R):
            if (first + u >= 0) & (first + u < rows):
                epilogue(
                    Y, y_cols + (o0 + first + u) * ys_h, y_mask, accs[u], alpha, beta, BIAS,
                    offs_k, k_ok, HAS_BIAS, BETA_NONZERO, ACTIVATION,
                )  # fmt: skip
        accs = accs[R:] + (tl.zeros((BLOCK_W, BLOCK_C), dtype=tl.float32),) * R


@triton.jit
def depthwise_runs_kernel(
    X,
    P,
    Y,
    BIAS,
    geo,
    K,
    alpha,
    beta,
    KP: tl.constexpr,
    PD: tl.constexpr,
    PH: tl.constexpr,
    PW: tl.constexpr,
    KG: tl.constexpr,
    KD: tl.constexpr,
    KH: tl.constexpr,
    KW: tl.constexpr,
    SW: tl.constexpr,
    DW: tl.constexpr,
    ACTIVATION: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BETA_NONZERO: tl.constexpr,
    ROWS: tl.constexpr,
    V: tl.constexpr,
    BLOCK_W: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """y = act(alpha * conv(x, w) + bias + beta * y) for a band of ROWS output rows of one
    image (n, od), BLOCK_W runs of V consecutive output columns and BLOCK_C channels, any
    stride and dilation (SW and DW, along W, compile-time). For wide filters (where the ring
    of depthwise_rows_kernel holds many rows) and narrow rows (where its tiles are mostly
    empty): a thread holds the V columns of a run, so each filter element it loads serves V
    columns, and each input column it loads (t = SW * j + DW * rw) every (column j, tap rw)
    pair that reads it. P, KP, PD, PH, PW: the packed filter as in depthwise_rows_kernel, read
    unmasked (the copy ends with a channel block of slack)."""
    in_d, in_h, in_w = geo.in_size
    od_n, oh_n, ow_n = geo.out_size
    sd, sh, _ = geo.stride
    pd, ph, pw = geo.padding
    dd, dh, _ = geo.dilation
    xs_n, xs_c, xs_d, xs_h, xs_w = geo.x_strides
    ys_n, ys_k, ys_d, ys_h, ys_w = geo.y_strides
    x_off, w_off, y_off = geo.offsets

    c_blocks = tl.cdiv(K, BLOCK_C)
    pid_c, pid_w, n, od, o0, rows = band_coords(
        tl.program_id(0), c_blocks, geo.out_size, ROWS, BLOCK_W * V
    )
    offs_k = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    k_ok = offs_k < K
    ow0 = pid_w * (BLOCK_W * V) + tl.arange(0, BLOCK_W) * V
    iw0 = ow0 * SW - pw
    Xcols = X + (x_off + n * xs_n + iw0 * xs_w)[:, None]
    Xcols += (input_channels(offs_k, 0, 1, KG) * xs_c)[None, :]
    # The filter is read as whole tiles, every run of a channel reading the same address:
    # the loads then have the accumulators' layout (a [BLOCK_C] load broadcast along the runs
    # went through shared memory and a barrier per load in the sm_90 compile).
    Pk = P + (offs_k[None, :] + tl.zeros((BLOCK_W, 1), dtype=tl.int32))
    y_cols = (y_off + n * ys_n + od * ys_d + ow0 * ys_w)[:, None] + (offs_k * ys_k)[None, :]

    for r in range(rows):
        oh = o0 + r
        accs = (tl.zeros((BLOCK_W, BLOCK_C), dtype=tl.float32),) * V
        for rd in tl.static_range(KD):
            i_d = od * sd - pd + rd * dd
            for rh in tl.static_range(KH):
                i_h = oh * sh - ph + rh * dh
                # Filter rows over the zero padding above and below the image are skipped.
                if (i_d >= 0) & (i_d < in_d) & (i_h >= 0) & (i_h < in_h):
                    Xrow = Xcols + (i_d * xs_d + i_h * xs_h)
                    ws = ()
                    for rw in tl.static_range(KW):
                        ws = ws + (tl.load(Pk + (rd * PD + rh * PH + rw * PW) * KP),)
                    for t in tl.static_range(SW * (V - 1) + DW * (KW - 1) + 1):
                        i_w = iw0 + t
                        mask = ((i_w >= 0) & (i_w < in_w))[:, None] & k_ok[None, :]
                        xv = tl.load(Xrow + t * xs_w, mask=mask, other=0.0).to(tl.float32)
                        out = ()
                        for j in tl.static_range(V):
                            acc = accs[j]
                            if (t >= SW * j) and ((t - SW * j) % DW == 0):
                                if (t - SW * j) // DW < KW:
                                    acc = tl.fma(xv, ws[(t - SW * j) // DW], acc)
                            out = out + (acc,)
                        accs = out
        for j in tl.static_range(V):
            y_mask = (ow0 + j < ow_n)[:, None] & k_ok[None, :]
            epilogue(
                Y, y_cols + (j * ys_w + oh * ys_h), y_mask, accs[j], alpha, beta, BIAS,
                offs_k, k_ok, HAS_BIAS, BETA_NONZERO, ACTIVATION,
            )  # fmt: skip


@triton.jit
def depthwise_filter_rows_kernel(
    X,
    DY,
    WS,
    geo,
    K,
    rows_per_chunk,
    KG: tl.constexpr,
    KD: tl.constexpr,
    KH: tl.constexpr,
    KW: tl.constexpr,
    SW: tl.constexpr,
    DW: tl.constexpr,
    FH: tl.constexpr,
    V: tl.constexpr,
    RR: tl.constexpr,
    BLOCK_W: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """Stage 1 of backward-filter: WS[chunk, k, tap] (float32) = the sum over the chunk's
    output rows (n, od, oh), every column, of dy * x at the tap, for the FH * KW taps of FH
    filter rows (rd, rh0 .. rh0 + FH - 1; FH is 1 or KH). The KD * KH / FH programs of a
    chunk and channel block are neighbours: they share its dy and x tiles in L2. With FH = KH
    (small filters) each dy tile is loaded once for every filter row.

    A tile is BLOCK_W runs of V consecutive output columns x BLOCK_C channels, from RR output
    rows a step (narrow rows: one row leaves most of a tile empty), and a thread holds the same
    elements of every column of a run (V tiles in a tuple, so indexing one is free). Input
    column t of a run (t = SW * j + DW * rw) meets output column j at tap rw: each input
    column is loaded and converted once for every tap that reads it, not once per tap, which
    cuts the loads, converts and masks per multiply-add by up to KW times (SW and DW, the
    stride and dilation along W, are compile-time constants for that)."""
    in_d, in_h, in_w = geo.in_size
    od_n, oh_n, ow_n = geo.out_size
    sd, sh, _ = geo.stride
    pd, ph, pw = geo.padding
    dd, dh, _ = geo.dilation
    xs_n, xs_c, xs_d, xs_h, xs_w = geo.x_strides
    ys_n, ys_k, ys_d, ys_h, ys_w = geo.y_strides
    x_off, w_off, y_off = geo.offsets
    TAPS: tl.constexpr = KD * KH * KW

    ROW_GROUPS: tl.constexpr = KH // FH
    pid = tl.program_id(0)
    frow = pid % (KD * ROW_GROUPS)
    rd = frow // ROW_GROUPS
    rh0 = (frow % ROW_GROUPS) * FH
    c_blocks = tl.cdiv(K, BLOCK_C)
    pid_c = (pid // (KD * ROW_GROUPS)) % c_blocks
    chunk = pid // (KD * ROW_GROUPS * c_blocks)
    offs_k = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    k_ok = offs_k < K
    x_chan = (x_off + input_channels(offs_k, 0, 1, KG) * xs_c)[None, :]
    dy_chan = (y_off + offs_k * ys_k)[None, :]
    RUNS: tl.constexpr = BLOCK_W // RR  # runs of a row in a tile
    lanes = tl.arange(0, BLOCK_W)
    runs = (lanes % RUNS) * V
    if RR == 1:
        lane_rows = tl.zeros((BLOCK_W,), dtype=tl.int32)  # a splat: the row math stays scalar
    else:
        lane_rows = lanes // RUNS

    accs = (tl.zeros((BLOCK_W, BLOCK_C), dtype=tl.float32),) * (FH * KW)
    start = chunk * rows_per_chunk
    end = tl.minimum(start + rows_per_chunk, geo.n * od_n * oh_n)
    for row0 in range(start, end, RR):
        row = row0 + lane_rows
        oh = row % oh_n
        od = (row // oh_n) % od_n
        n = row // (oh_n * od_n)
        i_d = od * sd - pd + rd * dd
        i_h0 = oh * sh - ph + rh0 * dh
        live = (row < end) & (i_d >= 0) & (i_d < in_d)
        # One row a step: a row whose filter rows all lie over the zero padding is skipped.
        go = True
        if RR == 1:
            r_h0 = (row0 % oh_n) * sh - ph + rh0 * dh
            r_d = ((row0 // oh_n) % od_n) * sd - pd + rd * dd
            go = (r_d >= 0) & (r_d < in_d) & (r_h0 + (FH - 1) * dh >= 0) & (r_h0 < in_h)
        if go:
            DYrow = DY + dy_chan + (n * ys_n + od * ys_d + oh * ys_h)[:, None]
            Xplane = X + x_chan + (n * xs_n + i_d * xs_d)[:, None]
            for w0 in range(0, ow_n, RUNS * V):
                ow0 = w0 + runs
                dys = ()
                for j in tl.static_range(V):
                    ow = ow0 + j
                    dy_mask = (live & (ow < ow_n))[:, None] & k_ok[None, :]
                    dyv = tl.load(DYrow + (ow * ys_w)[:, None], mask=dy_mask, other=0.0)
                    dys = dys + (dyv.to(tl.float32),)
                iw0 = ow0 * SW - pw
                for q in tl.static_range(FH):
                    i_h = i_h0 + q * dh
                    x_live = live & (i_h >= 0) & (i_h < in_h)
                    Xrow = Xplane + (i_h * xs_h)[:, None]
                    # Input column t of the run meets output column j at tap rw where t = SW
                    # * j + DW * rw: loaded and converted once for all of them. Columns past
                    # the row's end have dy = 0: no mask of their own.
                    for t in tl.static_range(SW * (V - 1) + DW * (KW - 1) + 1):
                        i_w = iw0 + t
                        mask = (x_live & (i_w >= 0) & (i_w < in_w))[:, None] & k_ok[None, :]
                        xv = tl.load(Xrow + (i_w * xs_w)[:, None], mask=mask, other=0.0)
                        xv = xv.to(tl.float32)
                        out = accs[: q * KW]
                        for rw in tl.static_range(KW):
                            acc = accs[q * KW + rw]
                            if (t >= DW * rw) and ((t - DW * rw) % SW == 0):
                                if (t - DW * rw) // SW < V:
                                    acc = tl.fma(xv, dys[(t - DW * rw) // SW], acc)
                            out = out + (acc,)
                        accs = out + accs[(q + 1) * KW :]

    # WS[chunk, k, tap] with tap = (rd * KH + rh) * KW + rw.
    part = WS + (chunk * K + offs_k).to(tl.int64) * TAPS + (rd * KH + rh0) * KW
    for i in tl.static_range(FH * KW):
        tl.store(part + i, tl.sum(accs[i], axis=0), mask=k_ok)
