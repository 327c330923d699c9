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
    if MODE == LSTM:
        i = sigmoid(tl.load(GX + gate, mask=mask) + tl.load(GH + gate, mask=mask))
        f = sigmoid(tl.load(GX + gate + H, mask=mask) + tl.load(GH + gate + H, mask=mask))
        g = tanh(tl.load(GX + gate + 2 * H, mask=mask) + tl.load(GH + gate + 2 * H, mask=mask))
        o = sigmoid(tl.load(GX + gate + 3 * H, mask=mask) + tl.load(GH + gate + 3 * H, mask=mask))
        c_prev = tl.load(C + row, mask=mask)
        c = f * c_prev + i * g
        h = o * tanh(c)
        tl.store(C + row, c, mask=mask)
        tl.store(GATES + gate, i, mask=mask)
        tl.store(GATES + gate + H, f, mask=mask)
        tl.store(GATES + gate + 2 * H, g, mask=mask)
        tl.store(GATES + gate + 3 * H, o, mask=mask)
        tl.store(SAVE + row, c, mask=mask)
        tl.store(SAVE2 + row, c_prev, mask=mask)
    elif MODE == GRU:
        r = sigmoid(tl.load(GX + gate, mask=mask) + tl.load(GH + gate, mask=mask))
        z = sigmoid(tl.load(GX + gate + H, mask=mask) + tl.load(GH + gate + H, mask=mask))
        gh_n = tl.load(GH + gate + 2 * H, mask=mask)
        n = tanh(tl.load(GX + gate + 2 * H, mask=mask) + r * gh_n)
        h_prev = tl.load(HPREV + row, mask=mask).to(tl.float32)
        h = (1.0 - z) * n + z * h_prev
        tl.store(GATES + gate, r, mask=mask)
        tl.store(GATES + gate + H, z, mask=mask)
        tl.store(GATES + gate + 2 * H, n, mask=mask)
        tl.store(SAVE + row, gh_n, mask=mask)
    else:
        pre = tl.load(GX + gate, mask=mask) + tl.load(GH + gate, mask=mask)
        if MODE == RNN_TANH:
            h = tanh(pre)
        else:
            h = tl.maximum(pre, 0.0)
        tl.store(GATES + gate, h, mask=mask)
    tl.store(HOUT + rb[:, None] * ho_stride + rh[None, :], h.to(HOUT.dtype.element_ty), mask=mask)
    if WRITE_Y:
        tl.store(Y + rb[:, None] * y_stride + rh[None, :], h.to(Y.dtype.element_ty), mask=mask)


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
    out_ty = DGX.dtype.element_ty
    if MODE == LSTM:
        i = tl.load(GATES + gate, mask=mask)
        f = tl.load(GATES + gate + H, mask=mask)
        g = tl.load(GATES + gate + 2 * H, mask=mask)
        o = tl.load(GATES + gate + 3 * H, mask=mask)
        tc = tanh(tl.load(SAVE + row, mask=mask))
        c_prev = tl.load(SAVE2 + row, mask=mask)
        dc = tl.load(DC + row, mask=mask) + dh * o * (1.0 - tc * tc)
        tl.store(DGX + gate, (dc * g * i * (1.0 - i)).to(out_ty), mask=mask)
        tl.store(DGX + gate + H, (dc * c_prev * f * (1.0 - f)).to(out_ty), mask=mask)
        tl.store(DGX + gate + 2 * H, (dc * i * (1.0 - g * g)).to(out_ty), mask=mask)
        tl.store(DGX + gate + 3 * H, (dh * tc * o * (1.0 - o)).to(out_ty), mask=mask)
        tl.store(DC + row, dc * f, mask=mask)
    elif MODE == GRU:
        r = tl.load(GATES + gate, mask=mask)
        z = tl.load(GATES + gate + H, mask=mask)
        n = tl.load(GATES + gate + 2 * H, mask=mask)
        gh_n = tl.load(SAVE + row, mask=mask)
        h_prev = tl.load(HPREV + row, mask=mask).to(tl.float32)
        dn = dh * (1.0 - z) * (1.0 - n * n)
        dz = dh * (h_prev - n) * z * (1.0 - z)
        dr = dn * gh_n * r * (1.0 - r)
        tl.store(DGX + gate, dr.to(out_ty), mask=mask)
        tl.store(DGX + gate + H, dz.to(out_ty), mask=mask)
        tl.store(DGX + gate + 2 * H, dn.to(out_ty), mask=mask)
        tl.store(DGH + gate, dr.to(out_ty), mask=mask)
        tl.store(DGH + gate + H, dz.to(out_ty), mask=mask)
        tl.store(DGH + gate + 2 * H, (dn * r).to(out_ty), mask=mask)
        tl.store(dh_ptrs, dh * z, mask=mask)
    else:
        h = tl.load(GATES + gate, mask=mask)
        if MODE == RNN_TANH:
            dpre = dh * (1.0 - h * h)
        else:
            dpre = tl.where(h > 0.0, dh, 0.0)
        tl.store(DGX + gate, dpre.to(out_ty), mask=mask)


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
    return triton.cdiv(rows, block_b), triton.cdiv(hidden, block_h)
