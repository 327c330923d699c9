"""Pointwise work of one recurrent time step: the gate nonlinearities and the state update
(forward), and the gate derivatives (backward), for the rows of the batch active at that step.

The GEMMs around a step (the input projection of every step at once, the recurrent product
h @ W_hh^T of this step, a projection) run on the batch-reduce GEMM; these kernels read their
results. Gates follow PyTorch's order and equations (G gates of H columns each, gate g in
columns [g*H, (g+1)*H) of a row):

    rnn_tanh, rnn_relu   h = act(gx + gh)
    lstm (i, f, g, o)    c = f * c_prev + i * g,  h = o * tanh(c)
    gru (r, z, n)        n = tanh(gx_n + r * gh_n),  h = (1 - z) * n + z * h_prev

where gx = x W_ih^T + b_ih and gh = h_prev W_hh^T + b_hh (float32). Arithmetic is float32
whatever the storage dtype; the cell state and everything saved for the backward are float32.

Every matrix is row-major with the row stride given (`*_stride`) or, for the saved buffers,
equal to its width. One program owns a BLOCK_B x BLOCK_H tile of (rows, H).
"""

import triton
import triton.language as tl

from ..core import cdiv
from .arrival import wait_for_grid
from .mathfn import sigmoid, tanh

RNN_TANH = tl.constexpr(0)
RNN_RELU = tl.constexpr(1)
LSTM = tl.constexpr(2)
GRU = tl.constexpr(3)

#: mode name -> (kernel MODE constant, number of gates)
MODES = {"rnn_tanh": (0, 1), "rnn_relu": (1, 1), "lstm": (2, 4), "gru": (3, 3)}


@triton.jit
def _tile(rows, H, BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr):
    rb = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    rh = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = (rb < rows)[:, None] & (rh < H)[None, :]
    return rb, rh, mask


@triton.jit
def _cell(GX, gate, gh, c_prev, h_prev, H, mask, MODE: tl.constexpr):
    """The cell's arithmetic on one tile: GX + gate: the tile's gx pointers at gate 0 (gate k
    k * H columns further); gh: the NGATES tiles of h_prev W_hh^T + b_hh (float32); c_prev
    (lstm) and h_prev (gru) float32. Returns (h, c, the gate activations as a 4-tuple, what
    SAVE and SAVE2 keep); unused entries are h."""
    if MODE == LSTM:
        i = sigmoid(tl.load(GX + gate, mask=mask) + gh[0])
        f = sigmoid(tl.load(GX + gate + H, mask=mask) + gh[1])
        g = tanh(tl.load(GX + gate + 2 * H, mask=mask) + gh[2])
        o = sigmoid(tl.load(GX + gate + 3 * H, mask=mask) + gh[3])
        c = f * c_prev + i * g
        h = o * tanh(c)
        return h, c, (i, f, g, o), c, c_prev
    elif MODE == GRU:
        r = sigmoid(tl.load(GX + gate, mask=mask) + gh[0])
        z = sigmoid(tl.load(GX + gate + H, mask=mask) + gh[1])
        n = tanh(tl.load(GX + gate + 2 * H, mask=mask) + r * gh[2])
        h = (1.0 - z) * n + z * h_prev
        return h, h, (r, z, n, h), gh[2], h
    else:
        pre = tl.load(GX + gate, mask=mask) + gh[0]
        if MODE == RNN_TANH:
            h = tanh(pre)
        else:
            h = tl.maximum(pre, 0.0)
        return h, h, (h, h, h, h), h, h


@triton.jit
def _save(GATES, SAVE, SAVE2, gate, row, H, mask, acts, save, save2, MODE: tl.constexpr,
          NGATES: tl.constexpr):  # fmt: skip
    """Store what the backward reads: the gate activations (h for plain RNNs), lstm's c and
    c_prev, gru's gh_n."""
    for k in tl.static_range(NGATES):
        tl.store(GATES + gate + k * H, acts[k], mask=mask)
    if MODE == LSTM or MODE == GRU:
        tl.store(SAVE + row, save, mask=mask)
    if MODE == LSTM:
        tl.store(SAVE2 + row, save2, mask=mask)


@triton.jit
def cell_forward_kernel(
    GX, GH, C, HPREV, HOUT, ho_stride, Y, y_stride, GATES, SAVE, SAVE2, rows, H,
    MODE: tl.constexpr, NGATES: tl.constexpr, WRITE_Y: tl.constexpr,
    BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr,
):  # fmt: skip
    """One step forward.

    GX, GH: (rows, NGATES*H) float32, biases included. C: (rows, H) float32 cell state, read
    and overwritten (lstm). HPREV: (rows, H), the previous hidden state (gru). HOUT: the new
    h, row stride ho_stride; Y: a second copy of it (the layer's output rows) when WRITE_Y.
    GATES: (rows, NGATES*H) float32, the gate activations saved for the backward; SAVE, SAVE2:
    (rows, H) float32, lstm's c and c_prev, gru's gh_n (SAVE2 unused).
    """
    rb, rh, mask = _tile(rows, H, BLOCK_B, BLOCK_H)
    gate = rb[:, None] * (NGATES * H) + rh[None, :]
    row = rb[:, None] * H + rh[None, :]
    gh = ()
    for k in tl.static_range(4):
        if k < NGATES:
            gh = gh + (tl.load(GH + gate + k * H, mask=mask),)
        else:
            gh = gh + (gh[0],)
    c_prev = tl.load(C + row, mask=mask) if MODE == LSTM else gh[0]
    h_prev = tl.load(HPREV + row, mask=mask).to(tl.float32) if MODE == GRU else gh[0]
    h, c, acts, save, save2 = _cell(GX, gate, gh, c_prev, h_prev, H, mask, MODE)
    if MODE == LSTM:
        tl.store(C + row, c, mask=mask)
    _save(GATES, SAVE, SAVE2, gate, row, H, mask, acts, save, save2, MODE, NGATES)
    tl.store(HOUT + rb[:, None] * ho_stride + rh[None, :], h.to(HOUT.dtype.element_ty), mask=mask)
    if WRITE_Y:
        tl.store(Y + rb[:, None] * y_stride + rh[None, :], h.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def persistent_forward_kernel(
    GX, W, B_HH, HBUF, C, Y, y_stride, GATES, SAVE, SAVE2, HPREV, BATCH_SIZES, STARTS, SYNC,
    steps, batch, H, w_stride,
    MODE: tl.constexpr, NGATES: tl.constexpr, REVERSE: tl.constexpr, HAS_BIAS: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr, BLOCK_B: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """Every time step of one layer and direction in one launch (cuDNN's persistent RNN): a
    program owns BLOCK_B rows of the batch x BLOCK_H hidden units for the whole sequence and
    computes, per step, its tiles of gh = h_prev W_hh^T + b_hh (NGATES products over K = H)
    and the cell; then the grid waits for every program (_grid_barrier) before the next step
    reads the new h. Launch at most one program per multiprocessor.

    GX: packed rows (rows, NGATES*H) float32, x W_ih^T + b_ih; W: W_hh (NGATES*H, H), row
    stride w_stride; B_HH: (NGATES*H,). HBUF: (2, batch, H) in the data dtype, h double
    buffered: step i reads half i % 2 and writes the other (half 0 holds h0 at the start,
    half steps % 2 holds h_n at the end; rows past a step's batch carry h over). C: (batch,
    H) float32, c0 in, c_n out (lstm). Y: the direction's output columns of the packed rows,
    row stride y_stride. GATES, SAVE, SAVE2 as in cell_forward_kernel and HPREV (rows, H):
    the h each row read, over the packed rows. BATCH_SIZES, STARTS: (steps,) int32, the rows
    running at each step and where they start. SYNC: int32, zero.
    """
    pid = tl.program_id(0)
    h_blocks = tl.cdiv(H, BLOCK_H)
    rb = pid // h_blocks * BLOCK_B + tl.arange(0, BLOCK_B)
    rh = pid % h_blocks * BLOCK_H + tl.arange(0, BLOCK_H)
    rk = tl.arange(0, BLOCK_K)
    h_ok = rh < H
    in_batch = (rb < batch)[:, None] & h_ok[None, :]
    row = rb[:, None] * H + rh[None, :]
    # W_hh's rows of this program's units, gate k at k * H: [BLOCK_K, BLOCK_H] per K step.
    w_cols = W + rh[None, :] * w_stride + rk[:, None]
    bias = ()
    for k in tl.static_range(4):
        if HAS_BIAS and k < NGATES:
            bias = bias + (tl.load(B_HH + k * H + rh, mask=h_ok, other=0.0).to(tl.float32),)
        else:
            bias = bias + (tl.zeros((BLOCK_H,), dtype=tl.float32),)
    programs = tl.num_programs(0)

    for i in range(steps):
        t = steps - 1 - i if REVERSE else i
        n = tl.load(BATCH_SIZES + t)
        start = tl.load(STARTS + t)
        CUR = HBUF + (i % 2) * batch * H
        NXT = HBUF + ((i + 1) % 2) * batch * H
        gh = (tl.zeros((BLOCK_B, BLOCK_H), dtype=tl.float32),) * 4
        for k0 in range(0, H, BLOCK_K):
            k_ok = k0 + rk < H
            # h was written by other programs: read it from L2 (.cg), never a stale L1 line.
            hk = tl.load(
                CUR + rb[:, None] * H + (k0 + rk)[None, :],
                mask=(rb < n)[:, None] & k_ok[None, :], other=0.0, cache_modifier=".cg",
            )  # fmt: skip
            w_ok = k_ok[:, None] & h_ok[None, :]
            if UPCAST:
                hk = hk.to(tl.float32)
            out = ()
            for k in tl.static_range(4):
                if k < NGATES:
                    wk = tl.load(w_cols + (k * H) * w_stride + k0, mask=w_ok, other=0.0)
                    if UPCAST:
                        wk = wk.to(tl.float32)
                    out = out + (tl.dot(hk, wk, gh[k], input_precision=PRECISION),)
                else:
                    out = out + (gh[k],)
            gh = out
        gh = (gh[0] + bias[0][None, :], gh[1] + bias[1][None, :], gh[2] + bias[2][None, :],
              gh[3] + bias[3][None, :])  # fmt: skip

        running = (rb < n)[:, None] & h_ok[None, :]
        packed = start + rb
        gate = packed[:, None] * (NGATES * H) + rh[None, :]
        h_prev = tl.load(CUR + row, mask=in_batch, other=0.0, cache_modifier=".cg")
        c_prev = tl.load(C + row, mask=running, other=0.0) if MODE == LSTM else gh[0]
        h, c, acts, save, save2 = _cell(
            GX, gate, gh, c_prev, h_prev.to(tl.float32), H, running, MODE
        )
        p_row = packed[:, None] * H + rh[None, :]
        _save(GATES, SAVE, SAVE2, gate, p_row, H, running, acts, save, save2, MODE, NGATES)
        tl.store(HPREV + p_row, h_prev, mask=running)
        if MODE == LSTM:
            tl.store(C + row, c, mask=running)
        h_out = h.to(HBUF.dtype.element_ty)
        tl.store(Y + packed[:, None] * y_stride + rh[None, :], h_out, mask=running)
        tl.store(NXT + row, tl.where(running, h_out, h_prev), mask=in_batch)
        wait_for_grid(SYNC, (i + 1) * programs)


@triton.jit
def _cell_grad(dh, dc, GATES, SAVE, SAVE2, HPREV, gate, row, H, mask, MODE: tl.constexpr):
    """The gradients of the gate pre-activations on one tile from dh (and lstm's dc), float32.
    GATES + gate, SAVE + row, ...: what the forward saved for the tile's rows. Returns (the
    gradients of gx as a 4-tuple, that of gru's gh_n (r times that of gx_n), what dh passes to
    h_prev directly (gru: z * dh), the gradient of c_prev (lstm)); unused entries are dh."""
    if MODE == LSTM:
        i = tl.load(GATES + gate, mask=mask)
        f = tl.load(GATES + gate + H, mask=mask)
        g = tl.load(GATES + gate + 2 * H, mask=mask)
        o = tl.load(GATES + gate + 3 * H, mask=mask)
        tc = tanh(tl.load(SAVE + row, mask=mask))
        c_prev = tl.load(SAVE2 + row, mask=mask)
        dc = dc + dh * o * (1.0 - tc * tc)
        dgx = (dc * g * i * (1.0 - i), dc * c_prev * f * (1.0 - f), dc * i * (1.0 - g * g),
               dh * tc * o * (1.0 - o))  # fmt: skip
        return dgx, dh, dh, dc * f
    elif MODE == GRU:
        r = tl.load(GATES + gate, mask=mask)
        z = tl.load(GATES + gate + H, mask=mask)
        n = tl.load(GATES + gate + 2 * H, mask=mask)
        gh_n = tl.load(SAVE + row, mask=mask)
        h_prev = tl.load(HPREV + row, mask=mask).to(tl.float32)
        dn = dh * (1.0 - z) * (1.0 - n * n)
        dz = dh * (h_prev - n) * z * (1.0 - z)
        dr = dn * gh_n * r * (1.0 - r)
        return (dr, dz, dn, dh), dn * r, dh * z, dh
    else:
        h = tl.load(GATES + gate, mask=mask)
        if MODE == RNN_TANH:
            dpre = dh * (1.0 - h * h)
        else:
            dpre = tl.where(h > 0.0, dh, 0.0)
        return (dpre, dh, dh, dh), dh, dh, dh


@triton.jit
def _store_grads(DGX, DGH, gate, H, mask, dgx, dgh_n, MODE: tl.constexpr, NGATES: tl.constexpr):
    """Store the gate gradients: DGX's NGATES gates; gru's DGH (its r and z gates as DGX's,
    its n gate r times DGX's)."""
    out_ty = DGX.dtype.element_ty
    for k in tl.static_range(NGATES):
        tl.store(DGX + gate + k * H, dgx[k].to(out_ty), mask=mask)
    if MODE == GRU:
        tl.store(DGH + gate, dgx[0].to(out_ty), mask=mask)
        tl.store(DGH + gate + H, dgx[1].to(out_ty), mask=mask)
        tl.store(DGH + gate + 2 * H, dgh_n.to(out_ty), mask=mask)


@triton.jit
def cell_backward_kernel(
    DH, dh_stride, DY, dy_stride, DC, GATES, SAVE, SAVE2, HPREV, DGX, DGH, rows, H,
    MODE: tl.constexpr, NGATES: tl.constexpr, HAS_DY: tl.constexpr,
    BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr,
):  # fmt: skip
    """One step backward: the gradients of the gate pre-activations from that of h.

    DH: (rows, H) float32, the gradient reaching h from the next step (plus DY, the output's
    gradient rows, when HAS_DY). DC: (rows, H) float32, lstm's gradient of c, overwritten with
    that of c_prev. GATES, SAVE, SAVE2, HPREV: what the forward saved and read. DGX: (rows,
    NGATES*H), the gradient of gx (and of gh, except for gru's n gate, whose gh_n gradient is
    r times that of gx_n: DGH). gru also overwrites DH with z * dh, h_prev's direct share.
    """
    rb, rh, mask = _tile(rows, H, BLOCK_B, BLOCK_H)
    gate = rb[:, None] * (NGATES * H) + rh[None, :]
    row = rb[:, None] * H + rh[None, :]
    dh_ptrs = DH + rb[:, None] * dh_stride + rh[None, :]
    dh = tl.load(dh_ptrs, mask=mask)
    if HAS_DY:
        dh += tl.load(DY + rb[:, None] * dy_stride + rh[None, :], mask=mask).to(tl.float32)
    dc = tl.load(DC + row, mask=mask) if MODE == LSTM else dh
    dgx, dgh_n, dh_direct, dc_prev = _cell_grad(
        dh, dc, GATES, SAVE, SAVE2, HPREV, gate, row, H, mask, MODE
    )
    _store_grads(DGX, DGH, gate, H, mask, dgx, dgh_n, MODE, NGATES)
    if MODE == LSTM:
        tl.store(DC + row, dc_prev, mask=mask)
    if MODE == GRU:
        tl.store(dh_ptrs, dh_direct, mask=mask)


@triton.jit
def persistent_backward_kernel(
    DY, dy_stride, DH, DC, GATES, SAVE, SAVE2, HPREV, W, DGX, DGH, BATCH_SIZES, STARTS, SYNC,
    steps, batch, H, w_stride,
    MODE: tl.constexpr, NGATES: tl.constexpr, REVERSE: tl.constexpr, PRECISION: tl.constexpr,
    UPCAST: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """The backward of persistent_forward_kernel's recurrence in one launch, the steps in
    reverse: per step, each program takes the gate gradients of its tile (cell_backward_kernel's
    arithmetic, dh and lstm's dc kept in registers from step to step), the grid waits, then
    each program takes its tile of the gradient reaching h_prev, dgh W_hh over every gate
    column (plus gru's z * dh). Rows past a step's batch carry dh over.

    DY: the direction's columns of the output gradient rows (packed), row stride dy_stride.
    DH, DC: (batch, H) float32, the gradients of h_n and c_n in, those of h0 and c0 out. W:
    W_hh (NGATES*H, H), row stride w_stride. DGX, DGH: (rows, NGATES*H) out (DGH is DGX
    except for gru). REVERSE: the direction ran its steps in reverse. The rest as in
    persistent_forward_kernel.
    """
    pid = tl.program_id(0)
    h_blocks = tl.cdiv(H, BLOCK_H)
    rb = pid // h_blocks * BLOCK_B + tl.arange(0, BLOCK_B)
    rh = pid % h_blocks * BLOCK_H + tl.arange(0, BLOCK_H)
    rk = tl.arange(0, BLOCK_K)
    h_ok = rh < H
    in_batch = (rb < batch)[:, None] & h_ok[None, :]
    row = rb[:, None] * H + rh[None, :]
    dh = tl.load(DH + row, mask=in_batch, other=0.0)
    dc = tl.load(DC + row, mask=in_batch, other=0.0) if MODE == LSTM else dh
    GH: tl.constexpr = NGATES * H
    programs = tl.num_programs(0)

    for i in range(steps):
        # The forward's last step first.
        t = i if REVERSE else steps - 1 - i
        n = tl.load(BATCH_SIZES + t)
        start = tl.load(STARTS + t)
        running = (rb < n)[:, None] & h_ok[None, :]
        packed = start + rb
        gate = packed[:, None] * GH + rh[None, :]
        p_row = packed[:, None] * H + rh[None, :]
        dh_total = dh + tl.load(
            DY + packed[:, None] * dy_stride + rh[None, :], mask=running, other=0.0
        ).to(tl.float32)
        dgx, dgh_n, dh_direct, dc_prev = _cell_grad(
            dh_total, dc, GATES, SAVE, SAVE2, HPREV, gate, p_row, H, running, MODE
        )
        _store_grads(DGX, DGH, gate, H, running, dgx, dgh_n, MODE, NGATES)
        if MODE == LSTM:
            dc = tl.where(running, dc_prev, dc)
        wait_for_grid(SYNC, (i + 1) * programs)

        # dh_prev = dgh W_hh over every gate column, written by every program.
        acc = tl.zeros((BLOCK_B, BLOCK_H), dtype=tl.float32)
        for k0 in range(0, GH, BLOCK_K):
            k_ok = k0 + rk < GH
            a = tl.load(
                DGH + packed[:, None] * GH + (k0 + rk)[None, :],
                mask=(rb < n)[:, None] & k_ok[None, :], other=0.0, cache_modifier=".cg",
            )  # fmt: skip
            w = tl.load(
                W + (k0 + rk)[:, None] * w_stride + rh[None, :],
                mask=k_ok[:, None] & h_ok[None, :], other=0.0,
            )  # fmt: skip
            if UPCAST:
                a = a.to(tl.float32)
                w = w.to(tl.float32)
            acc = tl.dot(a, w, acc, input_precision=PRECISION)
        if MODE == GRU:
            acc += dh_direct
        dh = tl.where(running, acc, dh)

    tl.store(DH + row, dh, mask=in_batch)
    if MODE == LSTM:
        tl.store(DC + row, dc, mask=in_batch)


@triton.jit
def add_rows_kernel(
    A, a_stride, B, b_stride, OUT, out_stride, rows, H,
    BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr,
):  # fmt: skip
    """OUT = A + B over (rows, H), in float32, stored in OUT's dtype."""
    rb, rh, mask = _tile(rows, H, BLOCK_B, BLOCK_H)
    a = tl.load(A + rb[:, None] * a_stride + rh[None, :], mask=mask).to(tl.float32)
    b = tl.load(B + rb[:, None] * b_stride + rh[None, :], mask=mask).to(tl.float32)
    out = OUT + rb[:, None] * out_stride + rh[None, :]
    tl.store(out, (a + b).to(OUT.dtype.element_ty), mask=mask)


def blocks(batch: int, hidden: int) -> tuple[int, int]:
    """Tile sizes for a step over at most `batch` rows of `hidden` columns."""
    return min(16, triton.next_power_of_2(batch)), min(128, triton.next_power_of_2(hidden))


def grid(rows: int, hidden: int, block_b: int, block_h: int) -> tuple[int, int]:
    return cdiv(rows, block_b), cdiv(hidden, block_h)
