"""Recurrent networks (cuDNN's RNN primitive, PyTorch's conventions) on the batch-reduce GEMM.

Modes rnn_tanh, rnn_relu, lstm (optionally with a projection, proj_size) and gru, with PyTorch's
gate order and equations (see kernels/rnn.py); num_layers stacked layers, one or two directions,
inter-layer dropout from a seed, and variable-length batches.

Each layer and direction runs as:
  * the input projection of every time step at once: gx = X W_ih^T + b_ih, one GEMM;
  * the recurrence, in one of two ways (cuDNN's persistent and standard algorithms):
    - persistent (the default where it applies, see `PERSISTENT`): one launch runs every
      step; each program owns a tile of (batch rows, hidden units), computes its share of
      gh = h W_hh^T + b_hh and the cell, and waits for the whole grid before the next step
      (kernels/rnn.py's persistent_forward_kernel);
    - standard: per time step, the recurrent product gh = h W_hh^T + b_hh (a GEMM over the
      rows of the batch still running) and the cell kernel (gates, state update, output);
      lstm with proj_size: h = h_raw W_hr^T, one more GEMM per step.
The backward runs the steps in reverse, persistent (persistent_backward_kernel: per step the
gate gradients of each program's tile, a wait for the grid, then its tile of dh_prev = dgh
W_hh) or standard (the cell backward kernel and a GEMM per step), then takes each weight's
gradient as one GEMM over all time steps and the input's as one more.

The core works on packed sequences (PyTorch's PackedSequence layout): the rows of every time
step one after the other, step t holding batch_sizes[t] rows, sequences sorted by decreasing
length so that the rows running at step t are the first batch_sizes[t]. `rnn` converts the
padded or packed input of a caller to that and back.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import triton
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from ..core import (
    INTERPRETED,
    bad_param,
    cdiv,
    check_runnable,
    check_tensor,
    not_supported,
    resolve_math_mode,
)
from ..kernels import rnn as kernels
from ..kernels.launch import launch_cached
from ._common import check_real
from .dropout import dropout_backward, dropout_forward
from .linear import _gemm, _matrix, linear_backward_bias

MODES = tuple(kernels.MODES)

#: Run the recurrence of a layer and direction as one persistent launch where it applies
#: (no proj_size; on a GPU, at most one program per multiprocessor, and the device has not
#: refused a cooperative launch; on the CPU, one program of at most 64 x 64); False runs
#: every step as its own launches, as with proj_size.
PERSISTENT = True


@dataclass(frozen=True)
class RnnSpec:
    """The network's sizes: what the weights must look like."""

    mode: str
    input_size: int
    hidden_size: int
    proj_size: int
    num_layers: int
    directions: int
    bias: bool

    @property
    def gates(self) -> int:
        return kernels.MODES[self.mode][1]

    @property
    def out_size(self) -> int:
        """Columns of h (and of each direction's output): proj_size if set, else hidden_size."""
        return self.proj_size or self.hidden_size

    def layer_input_size(self, layer: int) -> int:
        return self.input_size if layer == 0 else self.directions * self.out_size

    @property
    def per_direction(self) -> int:
        return 2 + 2 * self.bias + (self.proj_size > 0)

    def weight_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        """(torch.nn's parameter name, shape) of every weight in torch.nn's _flat_weights order."""
        gh, h, p = self.gates * self.hidden_size, self.hidden_size, self.out_size
        out = []
        for layer in range(self.num_layers):
            for d in range(self.directions):
                sfx = f"_l{layer}" + ("_reverse" if d else "")
                out += [(f"weight_ih{sfx}", (gh, self.layer_input_size(layer)))]
                out += [(f"weight_hh{sfx}", (gh, p))]
                if self.bias:
                    out += [(f"bias_ih{sfx}", (gh,)), (f"bias_hh{sfx}", (gh,))]
                if self.proj_size:
                    out += [(f"weight_hr{sfx}", (p, h))]
        return out

    def weights_of(self, weights, layer: int, d: int) -> tuple:
        """(w_ih, w_hh, b_ih, b_hh, w_hr, index of w_ih) of one layer and direction."""
        i = (layer * self.directions + d) * self.per_direction
        w = list(weights[i : i + self.per_direction])
        b_ih, b_hh = (w[2], w[3]) if self.bias else (None, None)
        w_hr = w[-1] if self.proj_size else None
        return w[0], w[1], b_ih, b_hh, w_hr, i


# -- what the forward keeps for the backward (cuDNN's reserve space) ---------------------------


def _layout(spec: RnnSpec, rows: int) -> tuple[dict, int, int]:
    """Where each saved matrix lives: {key: (buffer, offset, shape)}, buffer 0 being float32 and
    1 the data dtype; and the two buffers' sizes."""
    g, h, p, dirs = spec.gates, spec.hidden_size, spec.out_size, spec.directions
    sizes = [0, 0]
    table = {}

    def put(key, buf, shape):
        table[key] = (buf, sizes[buf], shape)
        sizes[buf] += math.prod(shape)

    for layer in range(spec.num_layers):
        for d in range(dirs):
            put((layer, d, "gates"), 0, (rows, g * h))  # gate activations (h for plain RNNs)
            if spec.mode in ("lstm", "gru"):
                put((layer, d, "save"), 0, (rows, h))  # lstm: c; gru: gh_n
            if spec.mode == "lstm":
                put((layer, d, "save2"), 0, (rows, h))  # c_prev
            put((layer, d, "hprev"), 1, (rows, p))
            if spec.proj_size:
                put((layer, d, "hraw"), 1, (rows, h))  # h before the projection
        if layer:
            put((layer, "input"), 1, (rows, dirs * p))  # the layer's input (after dropout)
    return table, sizes[0], sizes[1]


def reserve_sizes(spec: RnnSpec, rows: int) -> tuple[int, int]:
    """Elements of the float32 and the data-dtype reserve of a forward over `rows` rows."""
    _, f32, data = _layout(spec, rows)
    return f32, data


class _Reserve:
    def __init__(self, spec: RnnSpec, rows: int, f32: torch.Tensor, data: torch.Tensor):
        self.table, _, _ = _layout(spec, rows)
        self.buffers = (f32, data)

    def get(self, *key) -> torch.Tensor | None:
        if key not in self.table:
            return None
        buf, offset, shape = self.table[key]
        return self.buffers[buf][offset : offset + math.prod(shape)].view(shape)


# -- the core, on packed sequences -----------------------------------------------------------


def _mm_math(a: torch.Tensor, math: str | None) -> str:
    """The GEMMs' math mode for data like a: TF32 is a float32 mode only; None follows
    cuDNN's switch, as torch's cuDNN RNN does (the linear layers' GEMM would follow the matmul
    switch)."""
    return resolve_math_mode(math) if a.dtype == torch.float32 else "fp32"


def _mm(a, b, c, *, ta=False, tb=False, beta=0.0, bias=None, math=None) -> None:
    """c = op(a) @ op(b) (+ bias) + beta * c on the GEMM building block (float32 accumulation;
    c may be float32 whatever a and b are)."""
    _gemm(a, _matrix(a, ta), b, _matrix(b, tb), c, 1.0, beta, bias, None, _mm_math(a, math))


def _persistent_tiles(spec: RnnSpec, batch_sizes, device: torch.device):
    """(BLOCK_B, BLOCK_H, programs) of the persistent recurrence, or None where it does not
    apply (see PERSISTENT). On a GPU: among tiles whose programs fit one per multiprocessor
    (they wait on each other), the least data per program per step (its BLOCK_B rows of h and
    its units' gate rows of W_hh), then the most programs."""
    if not PERSISTENT or spec.proj_size or device in _refused:
        return None
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        # The kernels read a step schedule from a cache that a CUDA graph must not rely on
        # (an entry may be evicted and freed, or be recorded but never run).
        return None
    hid = spec.hidden_size
    if sum(batch_sizes) * spec.gates * hid >= 2**31:
        return None  # the kernels' offsets into the gate matrices are 32-bit
    batch = batch_sizes[0]
    fit_b, fit_h = max(16, triton.next_power_of_2(batch)), max(16, triton.next_power_of_2(hid))
    if INTERPRETED:
        # The interpreter runs programs one after another: one program does everything.
        return (fit_b, fit_h, 1) if fit_b * fit_h <= 64 * 64 else None
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    best = None
    for block_h in (16, 32, 64):
        for block_b in (16, 32, 64, 128):
            # Up to 4 gate accumulators of BLOCK_B x BLOCK_H float32 stay within registers.
            if block_b > fit_b or block_h > fit_h or block_b * block_h > 4096:
                continue
            programs = cdiv(hid, block_h) * cdiv(batch, block_b)
            if programs > sms:
                continue
            key = (block_b * hid + spec.gates * block_h * hid, -programs)
            if best is None or key < best[0]:
                best = (key, (block_b, block_h, programs))
    return None if best is None else best[1]


def _launch_persistent(kernel, tiles, slots: dict, w_hh, batch_sizes, spec: RnnSpec, d: int,
                       data: torch.Tensor, math, k: int, **fixed) -> bool:  # fmt: skip
    """Launch a persistent recurrence kernel (kernels/rnn.py) of direction d over `tiles` =
    (BLOCK_B, BLOCK_H, programs): `slots` its tensors, W_hh (unit stride along its rows), the
    step schedule and a zeroed counter for the grid's waits added here; k: the length of its
    products' reduction (H forward, NGATES * H backward); data: a tensor in the data dtype.

    Returns False, having run nothing, where CUDA refuses the cooperative launch (fewer
    multiprocessors available than the device reports, as under MPS limits); the device then
    runs the per-step path from then on."""
    block_b, block_h, programs = tiles
    schedule = _schedule(tuple(batch_sizes), data.device)
    w = w_hh if w_hh.stride(1) == 1 else w_hh.contiguous()
    slots = dict(
        slots, W=w, BATCH_SIZES=schedule[0], STARTS=schedule[1],
        SYNC=torch.zeros(1, dtype=torch.int32, device=data.device),
    )  # fmt: skip
    mode, ngates = kernels.MODES[spec.mode]
    try:
        launch_cached(
            kernel, (programs,), slots, cooperative=True, steps=len(batch_sizes),
            batch=batch_sizes[0], H=spec.hidden_size, w_stride=w.stride(0), MODE=mode,
            NGATES=ngates, REVERSE=d == 1, PRECISION=_dot_precision(data, math),
            UPCAST=INTERPRETED and data.element_size() == 2, BLOCK_B=block_b, BLOCK_H=block_h,
            BLOCK_K=_block_k(k), **fixed,
        )  # fmt: skip
    except RuntimeError as error:
        if "cooperative launch" not in str(error):
            raise
        _refused.add(data.device)
        return False
    return True


#: Devices that refused a cooperative launch: they take the per-step path.
_refused: set[torch.device] = set()


def _dot_precision(a: torch.Tensor, math: str | None) -> str:
    """tl.dot's input precision for the persistent kernels: as the GEMMs' math mode."""
    return "tf32" if _mm_math(a, math) == "tf32" else "ieee"


def _block_k(k: int) -> int:
    """The persistent kernels' reduction step over k columns: 16 to 64."""
    return max(16, min(64, triton.next_power_of_2(k)))


@functools.lru_cache(maxsize=64)
def _schedule(batch_sizes: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """(2, steps) int32 on `device`: each step's running rows and its first packed row (see
    _persistent_tiles on CUDA graphs)."""
    return torch.tensor([batch_sizes, _starts(batch_sizes)], dtype=torch.int32, device=device)


def _starts(batch_sizes) -> list[int]:
    starts, s = [], 0
    for n in batch_sizes:
        starts.append(s)
        s += n
    return starts


def _layer_seed(seed: int, layer: int) -> int:
    """The dropout seed of layer `layer`'s input (layer >= 1)."""
    return (seed + layer) % 2**63


def _dropping(spec: RnnSpec, dropout: float, training: bool) -> bool:
    return training and dropout > 0 and spec.num_layers > 1


def rnn_forward_packed(
    x: torch.Tensor,
    batch_sizes: list[int],
    h0: torch.Tensor,
    c0: torch.Tensor | None,
    weights,
    spec: RnnSpec,
    *,
    dropout: float = 0.0,
    training: bool = False,
    seed: int = 0,
    math: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The forward on packed, checked inputs (see `rnn` for the checks).

    x: (rows, input_size), rows = sum(batch_sizes); h0: (layers * directions, batch, out_size);
    c0 (lstm): (layers * directions, batch, hidden_size). Returns (y (rows, directions *
    out_size), h_n, c_n (empty unless lstm), reserve float32, reserve in x's dtype).
    """
    rows = x.shape[0]
    f32, data = reserve_sizes(spec, rows)
    reserve = _Reserve(spec, rows, x.new_empty(f32, dtype=torch.float32), x.new_empty(data))
    dirs, p = spec.directions, spec.out_size
    h_n = x.new_empty((spec.num_layers * dirs, batch_sizes[0], p))
    c_n = x.new_empty((*h_n.shape[:2], spec.hidden_size) if spec.mode == "lstm" else (0,))
    drop = _dropping(spec, dropout, training)
    layer_in = x
    for layer in range(spec.num_layers):
        last = layer == spec.num_layers - 1
        y = x.new_empty((rows, dirs * p)) if last or drop else reserve.get(layer + 1, "input")
        for d in range(dirs):
            _forward_direction(
                layer, d, layer_in, y, h0, c0, h_n, c_n, weights, spec, batch_sizes, reserve, math
            )
        if not last:
            layer_in = reserve.get(layer + 1, "input")
            if drop:
                dropout_forward(y, dropout, _layer_seed(seed, layer + 1), out=layer_in)
    return y, h_n, c_n, *reserve.buffers


def _forward_direction(layer, d, layer_in, y, h0, c0, h_n, c_n, weights, spec, batch_sizes,
                       reserve, math):  # fmt: skip
    mode, ngates = kernels.MODES[spec.mode]
    g, hid, p = spec.gates, spec.hidden_size, spec.out_size
    idx = layer * spec.directions + d
    w_ih, w_hh, b_ih, b_hh, w_hr, _ = spec.weights_of(weights, layer, d)
    rows, batch = layer_in.shape[0], batch_sizes[0]
    gates = reserve.get(layer, d, "gates")
    hprev = reserve.get(layer, d, "hprev")
    save, save2, hraw = (reserve.get(layer, d, k) for k in ("save", "save2", "hraw"))

    gx = torch.empty((rows, g * hid), dtype=torch.float32, device=y.device)
    _mm(layer_in, w_ih, gx, tb=True, bias=b_ih, math=math)
    c = c0[idx].to(torch.float32, copy=True).contiguous() if spec.mode == "lstm" else gx
    tiles = _persistent_tiles(spec, batch_sizes, y.device)
    if tiles is not None:
        # h double-buffered (see persistent_forward_kernel): h0 in half 0.
        hbuf = y.new_empty((2, batch, hid))
        hbuf[0] = h0[idx]
        slots = dict(
            GX=gx, B_HH=b_hh if b_hh is not None else gx, HBUF=hbuf, C=c, Y=y[:, d * p :],
            GATES=gates, SAVE=_rows(save, 0, rows, gx), SAVE2=_rows(save2, 0, rows, gx),
            HPREV=hprev,
        )  # fmt: skip
        if _launch_persistent(
            kernels.persistent_forward_kernel, tiles, slots, w_hh, batch_sizes, spec, d, y,
            math, hid, y_stride=y.stride(0), HAS_BIAS=b_hh is not None,
        ):  # fmt: skip
            h_n[idx] = hbuf[len(batch_sizes) % 2]
            if spec.mode == "lstm":
                c_n[idx] = c
            return
    gh = torch.empty((batch, g * hid), dtype=torch.float32, device=y.device)
    h = h0[idx].clone(memory_format=torch.contiguous_format)
    block_b, block_h = kernels.blocks(batch, hid)
    starts = _starts(batch_sizes)
    steps = range(len(batch_sizes)) if d == 0 else reversed(range(len(batch_sizes)))
    for t in steps:
        n, s = batch_sizes[t], starts[t]
        h_prev = hprev[s : s + n]
        h_prev.copy_(h[:n])
        _mm(h_prev, w_hh, gh[:n], tb=True, bias=b_hh, math=math)
        y_rows = y[s : s + n, d * p : (d + 1) * p]
        h_out = hraw[s : s + n] if spec.proj_size else h
        slots = dict(
            GX=gx[s : s + n], GH=gh, C=c, HPREV=h_prev, HOUT=h_out, Y=y_rows,
            GATES=gates[s : s + n], SAVE=_rows(save, s, n, gx), SAVE2=_rows(save2, s, n, gx),
        )  # fmt: skip
        launch_cached(
            kernels.cell_forward_kernel, kernels.grid(n, hid, block_b, block_h), slots,
            ho_stride=h_out.stride(0), y_stride=y_rows.stride(0), rows=n, H=hid, MODE=mode,
            NGATES=ngates, WRITE_Y=not spec.proj_size, BLOCK_B=block_b, BLOCK_H=block_h,
        )  # fmt: skip
        if spec.proj_size:
            _mm(hraw[s : s + n], w_hr, h[:n], tb=True, math=math)
            y_rows.copy_(h[:n])
    h_n[idx] = h
    if spec.mode == "lstm":
        c_n[idx] = c


def _rows(t: torch.Tensor | None, start: int, n: int, dummy: torch.Tensor) -> torch.Tensor:
    """Rows [start, start + n) of a saved matrix, or a pointer the kernel never reads."""
    return dummy if t is None else t[start : start + n]


def rnn_backward_packed(
    dy: torch.Tensor,
    dh_n: torch.Tensor,
    dc_n: torch.Tensor | None,
    x: torch.Tensor,
    weights,
    reserve_f32: torch.Tensor,
    reserve_data: torch.Tensor,
    batch_sizes: list[int],
    spec: RnnSpec,
    *,
    dropout: float = 0.0,
    training: bool = False,
    seed: int = 0,
    math: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """The backward of `rnn_forward_packed` (the same arguments, and its reserve).

    dy: (rows, directions * out_size), the gradient of y; dh_n, dc_n: those of h_n and c_n
    (dc_n None unless lstm). Returns (dx, dh0, dc0 (empty unless lstm), the weights' gradients
    in the order of `weights`).
    """
    rows = x.shape[0]
    reserve = _Reserve(spec, rows, reserve_f32, reserve_data)
    dweights: list = [None] * len(weights)
    dh0 = torch.empty_like(dh_n, memory_format=torch.contiguous_format)
    dc0 = x.new_empty((*dh_n.shape[:2], spec.hidden_size) if spec.mode == "lstm" else (0,))
    # The step kernels read rows of dy with unit column stride (an expanded dy has none).
    d_out = dy.contiguous()
    for layer in reversed(range(spec.num_layers)):
        layer_in = x if layer == 0 else reserve.get(layer, "input")
        dx = torch.empty(layer_in.shape, dtype=torch.float32, device=x.device)
        for d in range(spec.directions):
            _backward_direction(
                layer, d, layer_in, d_out, dx, dh_n, dc_n, dh0, dc0, weights, dweights, spec,
                batch_sizes, reserve, math,
            )  # fmt: skip
        d_out = dx.to(x.dtype)
        if layer and _dropping(spec, dropout, training):
            dropout_backward(d_out, dropout, _layer_seed(seed, layer), out=d_out)
    return d_out, dh0, dc0, dweights


def _backward_direction(layer, d, layer_in, d_out, dx, dh_n, dc_n, dh0, dc0, weights, dweights,
                        spec, batch_sizes, reserve, math):  # fmt: skip
    mode, ngates = kernels.MODES[spec.mode]
    g, hid, p = spec.gates, spec.hidden_size, spec.out_size
    idx = layer * spec.directions + d
    w_ih, w_hh, b_ih, b_hh, w_hr, first = spec.weights_of(weights, layer, d)
    rows = layer_in.shape[0]
    gates = reserve.get(layer, d, "gates")
    hprev = reserve.get(layer, d, "hprev")
    save, save2, hraw = (reserve.get(layer, d, k) for k in ("save", "save2", "hraw"))
    lstm, gru = spec.mode == "lstm", spec.mode == "gru"
    dh = dh_n[idx].to(torch.float32, copy=True).contiguous()
    dc = dc_n[idx].to(torch.float32, copy=True).contiguous() if lstm else dh
    dgx = d_out.new_empty((rows, g * hid))
    dgh = d_out.new_empty((rows, g * hid)) if gru else dgx
    dht = None  # the gradient reaching the projected h (proj_size)
    tiles = _persistent_tiles(spec, batch_sizes, dx.device)
    slots = dict(
        DY=d_out[:, d * p :], DH=dh, DC=dc, GATES=gates, SAVE=_rows(save, 0, rows, gates),
        SAVE2=_rows(save2, 0, rows, gates), HPREV=hprev, DGX=dgx, DGH=dgh,
    )  # fmt: skip
    if tiles is None or not _launch_persistent(
        kernels.persistent_backward_kernel, tiles, slots, w_hh, batch_sizes, spec, d, d_out,
        math, g * hid, dy_stride=d_out.stride(0),
    ):  # fmt: skip
        dht = _backward_steps(
            d, d_out, dh, dc, dgx, dgh, w_hh, w_hr, gates, save, save2, hprev, spec,
            batch_sizes, math,
        )  # fmt: skip
    dh0[idx] = dh
    if lstm:
        dc0[idx] = dc

    dweights[first] = w_ih.new_empty(w_ih.shape)
    _mm(dgx, layer_in, dweights[first], ta=True, math=math)
    dweights[first + 1] = w_hh.new_empty(w_hh.shape)
    _mm(dgh, hprev, dweights[first + 1], ta=True, math=math)
    if spec.bias:
        dweights[first + 2] = linear_backward_bias(dgx)
        dweights[first + 3] = linear_backward_bias(dgh)
    if spec.proj_size:
        dweights[first + spec.per_direction - 1] = w_hr.new_empty(w_hr.shape)
        _mm(dht, hraw, dweights[first + spec.per_direction - 1], ta=True, math=math)
    _mm(dgx, w_ih, dx, beta=1.0 if d else 0.0, math=math)


def _backward_steps(d, d_out, dh, dc, dgx, dgh, w_hh, w_hr, gates, save, save2, hprev, spec,
                    batch_sizes, math):  # fmt: skip
    """The standard algorithm's backward recurrence: launches per time step. dh, dc: the
    gradients of h_n and c_n in, those of h0 and c0 out. Returns the gradient reaching the
    projected h of every row (proj_size), else None."""
    mode, ngates = kernels.MODES[spec.mode]
    hid, p = spec.hidden_size, spec.out_size
    rows, batch = dgx.shape[0], batch_sizes[0]
    gru = spec.mode == "gru"
    dht = None
    if spec.proj_size:
        dht = d_out.new_empty((rows, p))  # the gradient reaching the projected h
        dh_raw = torch.empty((batch, hid), dtype=torch.float32, device=dh.device)
    block_b, block_h = kernels.blocks(batch, hid)
    block_p = kernels.blocks(batch, p)[1]
    starts = _starts(batch_sizes)
    forward_order = range(len(batch_sizes)) if d == 0 else reversed(range(len(batch_sizes)))
    for t in reversed(list(forward_order)):
        n, s = batch_sizes[t], starts[t]
        dy_rows = d_out[s : s + n, d * p : (d + 1) * p]
        if spec.proj_size:
            launch_cached(
                kernels.add_rows_kernel, kernels.grid(n, p, block_b, block_p),
                dict(A=dh, B=dy_rows, OUT=dht[s : s + n]), a_stride=p,
                b_stride=dy_rows.stride(0), out_stride=p, rows=n, H=p, BLOCK_B=block_b,
                BLOCK_H=block_p,
            )  # fmt: skip
            _mm(dht[s : s + n], w_hr, dh_raw[:n], math=math)
            dh_in, dh_stride, has_dy = dh_raw, hid, False
        else:
            dh_in, dh_stride, has_dy = dh, hid, True
        slots = dict(
            DH=dh_in, DY=dy_rows, DC=dc, GATES=gates[s : s + n], SAVE=_rows(save, s, n, gates),
            SAVE2=_rows(save2, s, n, gates), HPREV=hprev[s : s + n], DGX=dgx[s : s + n],
            DGH=dgh[s : s + n],
        )  # fmt: skip
        launch_cached(
            kernels.cell_backward_kernel, kernels.grid(n, hid, block_b, block_h), slots,
            dh_stride=dh_stride, dy_stride=dy_rows.stride(0), rows=n, H=hid, MODE=mode,
            NGATES=ngates, HAS_DY=has_dy, BLOCK_B=block_b, BLOCK_H=block_h,
        )  # fmt: skip
        # gru's cell left z * dh in dh, h_prev's direct share: the product adds to it.
        _mm(dgh[s : s + n], w_hh, dh[:n], beta=1.0 if gru else 0.0, math=math)
    return dht


# -- the public function: checks, and the caller's layout to packed and back -----------------


@dataclass
class RnnCall:
    """A checked call of `rnn`, in packed form, and how to give its results back."""

    spec: RnnSpec
    data: torch.Tensor  # (rows, input_size), packed
    batch_sizes: list[int]
    h0: torch.Tensor  # (layers * directions, batch, out_size), in packed (sorted) order
    c0: torch.Tensor | None
    weights: tuple
    dropout: float
    training: bool
    seed: int
    math: str | None
    kind: str  # "full" (every sequence of the input's length), "padded" or "packed"
    batch_first: bool
    total_length: int
    sorted_indices: torch.Tensor | None
    unsorted_indices: torch.Tensor | None

    def finish(self, y: torch.Tensor, h_n: torch.Tensor, c_n: torch.Tensor | None) -> tuple:
        """(output, h_n[, c_n]) in the caller's layout and batch order."""
        if self.unsorted_indices is not None:
            h_n = h_n.index_select(1, self.unsorted_indices)
            if c_n is not None:
                c_n = c_n.index_select(1, self.unsorted_indices)
        if self.kind == "full":
            out = y.view(len(self.batch_sizes), self.batch_sizes[0], y.shape[-1])
            out = out.transpose(0, 1) if self.batch_first else out
        else:
            sizes = torch.tensor(self.batch_sizes, dtype=torch.int64)
            out = PackedSequence(y, sizes, self.sorted_indices, self.unsorted_indices)
            if self.kind == "padded":
                out = pad_packed_sequence(
                    out, batch_first=self.batch_first, total_length=self.total_length
                )[0]
        return (out, h_n) if self.spec.mode != "lstm" else (out, h_n, c_n)


def _flag(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise bad_param(name, value, "True or False")
    return value


def _int(name: str, value, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise bad_param(name, value, f"an int >= {minimum}")
    return value


def _check_lengths(lengths, batch: int, steps: int, enforce_sorted: bool) -> torch.Tensor:
    if isinstance(lengths, torch.Tensor):
        if lengths.dim() != 1 or lengths.is_floating_point() or lengths.is_complex():
            raise bad_param("lengths", lengths, "a 1-D integer tensor or a sequence of ints")
        values = lengths.tolist()
    else:
        try:
            values = list(lengths)
        except TypeError:
            raise bad_param(
                "lengths", lengths, "a 1-D integer tensor or a sequence of ints"
            ) from None
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            raise bad_param("lengths", lengths, "a 1-D integer tensor or a sequence of ints")
    if len(values) != batch:
        raise bad_param("len(lengths)", len(values), f"{batch} (the batch size of input)")
    for v in values:
        if not 1 <= v <= steps:
            raise bad_param("lengths", values, f"every length in [1, {steps}] (input's length)")
    if enforce_sorted and any(a < b for a, b in zip(values, values[1:], strict=False)):
        raise bad_param(
            "lengths", values, "lengths sorted in decreasing order, or enforce_sorted=False"
        )
    return torch.tensor(values, dtype=torch.int64)


def _check_packed(input: PackedSequence, rows: int) -> list[int]:
    """A PackedSequence's batch sizes, checked against its data: the kernels index by them."""
    sizes = input.batch_sizes
    if not isinstance(sizes, torch.Tensor) or sizes.dim() != 1 or sizes.numel() == 0:
        raise bad_param("input.batch_sizes", sizes, "a non-empty 1-D tensor")
    values = [int(b) for b in sizes]
    if values[-1] < 1 or any(a < b for a, b in zip(values, values[1:], strict=False)):
        raise bad_param("input.batch_sizes", values, "positive and non-increasing")
    if sum(values) != rows:
        raise bad_param(
            "input.batch_sizes", values, f"sizes summing to input.data.shape[0] = {rows}"
        )
    for name in ("sorted_indices", "unsorted_indices"):
        idx = getattr(input, name)
        if idx is not None and tuple(idx.shape) != (values[0],):
            raise bad_param(f"input.{name}.shape", tuple(idx.shape), f"({values[0]},)")
    return values


def _check_state(name: str, t, shape: tuple, like: torch.Tensor) -> torch.Tensor:
    t = check_tensor(name, t, ndim=3, dtype=like.dtype, device=like.device)
    if tuple(t.shape) != shape:
        raise bad_param(
            f"{name}.shape", tuple(t.shape), f"{shape} (layers * directions, batch, hidden)"
        )
    return t


def prepare(
    input,
    hx,
    weights,
    *,
    mode: str,
    num_layers: int = 1,
    bidirectional: bool = False,
    bias: bool = True,
    batch_first: bool = False,
    proj_size: int = 0,
    dropout: float = 0.0,
    training: bool = True,
    lengths=None,
    enforce_sorted: bool = True,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    math: str | None = None,
) -> RnnCall:
    """Check every argument of `rnn` (before anything runs) and put the input in packed form."""
    if mode not in MODES:
        raise bad_param("mode", mode, f"one of {MODES}")
    num_layers = _int("num_layers", num_layers, 1)
    for name, v in (("bidirectional", bidirectional), ("bias", bias)):
        _flag(name, v)
    for name, v in (("batch_first", batch_first), ("training", training)):
        _flag(name, v)
    _flag("enforce_sorted", enforce_sorted)
    proj_size = _int("proj_size", proj_size, 0)
    if proj_size and mode != "lstm":
        raise not_supported("proj_size", proj_size, f"a projection is for lstm only, not {mode}")
    dropout = check_real("dropout", dropout)
    if not 0.0 <= dropout <= 1.0:
        raise bad_param("dropout", dropout, "a probability in [0, 1]")
    resolve_math_mode(math)

    packed = isinstance(input, PackedSequence)
    x = input.data if packed else input
    x = check_tensor("input", x, ndim=2 if packed else 3)
    if packed and lengths is not None:
        raise bad_param("lengths", lengths, "None for a PackedSequence (it holds its lengths)")

    # The weights, in torch.nn's order; hidden_size is read off the first.
    if isinstance(weights, torch.Tensor) or not hasattr(weights, "__len__"):
        raise bad_param("weights", type(weights).__name__, "a sequence of tensors")
    weights = tuple(weights)
    gates = kernels.MODES[mode][1]
    if not weights:
        raise bad_param("weights", weights, "a sequence of tensors (torch.nn's _flat_weights)")
    w0 = check_tensor("weights[0]", weights[0], ndim=2, dtype=x.dtype, device=x.device)
    if w0.shape[0] % gates:
        raise bad_param("weights[0].shape", tuple(w0.shape), f"({gates} * hidden_size, input)")
    hidden = w0.shape[0] // gates
    if proj_size and proj_size >= hidden:
        raise bad_param("proj_size", proj_size, f"less than hidden_size = {hidden}")
    spec = RnnSpec(
        mode, x.shape[-1], hidden, proj_size, num_layers, 2 if bidirectional else 1, bias
    )  # fmt: skip
    expected = spec.weight_shapes()
    if len(weights) != len(expected):
        raise bad_param(
            "len(weights)", len(weights),
            f"{len(expected)} for {num_layers} layers, {spec.directions} directions, "
            f"bias={bias}, proj_size={proj_size}: {[n for n, _ in expected]}",
        )  # fmt: skip
    for i, (w, (name, shape)) in enumerate(zip(weights, expected, strict=True)):
        w = check_tensor(f"weights[{i}] ({name})", w, dtype=x.dtype, device=x.device)
        if tuple(w.shape) != shape:
            what = "input size" if i == 0 else name
            raise bad_param(f"weights[{i}].shape ({what})", tuple(w.shape), f"{shape}")

    # The input's sequences and their lengths.
    sorted_indices = unsorted_indices = None
    if packed:
        batch_sizes = _check_packed(input, x.shape[0])
        sorted_indices, unsorted_indices = input.sorted_indices, input.unsorted_indices
        kind, total_length = "packed", len(batch_sizes)
    else:
        steps, batch = (x.shape[1], x.shape[0]) if batch_first else (x.shape[0], x.shape[1])
        total_length = steps
        if lengths is not None:
            lengths = _check_lengths(lengths, batch, steps, enforce_sorted)
            kind = "padded"
        else:
            kind, batch_sizes = "full", [batch] * steps
    batch = batch_sizes[0] if kind != "padded" else x.shape[0 if batch_first else 1]

    # The initial states.
    layers_dirs = num_layers * spec.directions
    h_shape = (layers_dirs, batch, spec.out_size)
    c_shape = (layers_dirs, batch, hidden)
    if mode == "lstm":
        if hx is not None and (not isinstance(hx, (tuple, list)) or len(hx) != 2):
            raise bad_param("hx", type(hx).__name__, "None or a pair (h0, c0) for lstm")
        h0, c0 = hx if hx is not None else (None, None)
    else:
        if isinstance(hx, (tuple, list)):
            raise bad_param("hx", type(hx).__name__, f"None or a tensor h0 for {mode}")
        h0, c0 = hx, None
    h0 = x.new_zeros(h_shape) if h0 is None else _check_state("h0", h0, h_shape, x)
    if mode == "lstm":
        c0 = x.new_zeros(c_shape) if c0 is None else _check_state("c0", c0, c_shape, x)

    if _dropping(spec, dropout, training):
        if seed is None:
            seed = int(torch.randint(0, 2**62, (), generator=generator))
        elif not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**63:
            raise bad_param("seed", seed, "None or an int in [0, 2**63)")
    else:
        seed = 0
    check_runnable(x.device)

    # Nothing is refused from here on: to packed form.
    if kind == "padded":
        p = pack_padded_sequence(input, lengths, batch_first, enforce_sorted=enforce_sorted)
        data, batch_sizes = p.data, [int(b) for b in p.batch_sizes]
        sorted_indices, unsorted_indices = p.sorted_indices, p.unsorted_indices
    elif kind == "full":
        data = (x.transpose(0, 1) if batch_first else x).reshape(-1, x.shape[-1])
    else:
        data = x
    if sorted_indices is not None:
        sorted_indices = sorted_indices.to(x.device)
        unsorted_indices = unsorted_indices.to(x.device)
        h0 = h0.index_select(1, sorted_indices)
        c0 = c0.index_select(1, sorted_indices) if c0 is not None else None
    # The GEMM epilogue reads a bias with unit stride; the GEMMs take any other strides.
    weights = tuple(w.contiguous() if w.dim() == 1 else w for w in weights)
    return RnnCall(
        spec, data, batch_sizes, h0, c0, weights, dropout, training, seed, math, kind,
        batch_first, total_length, sorted_indices, unsorted_indices,
    )  # fmt: skip


def rnn(
    input: torch.Tensor | PackedSequence,
    hx: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None,
    weights,
    *,
    mode: str,
    num_layers: int = 1,
    bidirectional: bool = False,
    bias: bool = True,
    batch_first: bool = False,
    proj_size: int = 0,
    dropout: float = 0.0,
    training: bool = True,
    lengths=None,
    enforce_sorted: bool = True,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    math: str | None = None,
) -> tuple:
    """A recurrent network over a batch of sequences, as torch.nn.RNN / LSTM / GRU compute it.

    input: (T, B, input_size), or (B, T, input_size) with batch_first, or a PackedSequence.
    hx: None (zeros), h0 (rnn_tanh, rnn_relu, gru) or (h0, c0) (lstm); h0: (num_layers *
    directions, B, H_out) and c0: (num_layers * directions, B, hidden_size), H_out being
    proj_size if set, else hidden_size; batch order is the caller's (a PackedSequence's
    unsorted order). weights: torch.nn's _flat_weights: per layer and direction (reverse
    second) weight_ih (G * hidden_size, in), weight_hh (G * hidden_size, H_out), then bias_ih
    and bias_hh (G * hidden_size,) if bias, then weight_hr (proj_size, hidden_size) if
    proj_size; G = 1, 4, 3 for rnn_*, lstm, gru; `in` is input_size, then directions * H_out.

    mode: "rnn_tanh", "rnn_relu", "lstm" or "gru". dropout: applied (in training) to the
    input of every layer l >= 1: rtdnn.dropout_forward's mask with seed (seed + l) mod 2**63
    on that input as a (rows, directions * H_out) tensor of packed rows, time-major (`seed`
    an int in [0, 2**63); None draws one from `generator`, torch's default if None).
    lengths: the lengths of the sequences of a padded input (sorted in decreasing order
    unless enforce_sorted=False; each in [1, T]); the output's steps past a sequence's end
    are 0. math: "fp32", "tf32" or None (torch's cuDNN TF32 switch) for the float32 GEMMs.

    Returns (output, h_n) or, for lstm, (output, h_n, c_n): output is (T, B, directions *
    H_out) (batch_first: (B, T, ...)) or a PackedSequence for a packed input; h_n, c_n are
    the states after each sequence's last step (the first step, for the reverse direction),
    shaped as h0 and c0. float32, float16 or bfloat16 storage; float32 arithmetic and cell
    state. Not differentiable: rtdnn.rnn is, through a custom op.
    """
    call = prepare(
        input, hx, weights, mode=mode, num_layers=num_layers, bidirectional=bidirectional,
        bias=bias, batch_first=batch_first, proj_size=proj_size, dropout=dropout,
        training=training, lengths=lengths, enforce_sorted=enforce_sorted, seed=seed,
        generator=generator, math=math,
    )  # fmt: skip
    y, h_n, c_n, _, _ = rnn_forward_packed(
        call.data, call.batch_sizes, call.h0, call.c0, call.weights, call.spec,
        dropout=call.dropout, training=call.training, seed=call.seed, math=call.math,
    )  # fmt: skip
    return call.finish(y, h_n, c_n if call.spec.mode == "lstm" else None)


__all__ = ["MODES", "RnnSpec", "prepare", "reserve_sizes", "rnn", "rnn_backward_packed",
           "rnn_forward_packed"]  # fmt: skip
