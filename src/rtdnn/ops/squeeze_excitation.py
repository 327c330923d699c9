"""Squeeze-and-excitation (the block of torchvision.ops.SqueezeExcitation, MobileNetV3 and
EfficientNet): the public functional API.

    s0 = mean of x over its spatial positions                 (N, C)
    z1 = s0 @ w1^T + b1,  z2 = act(z1) @ w2^T + b2            (N, R), (N, C)
    y  = x * gate(z2), broadcast over the spatial positions   x's shape

x: (N, C, *S) with 1 to 3 spatial dims, float32 / float16 / bfloat16, any strides (spatial dims
that cannot be read as one run of positions are copied first); y has x's dtype and memory
format. w1: (R, C) or (R, C, 1, ...) as a 1x1 convolution stores it, w2: (C, R) likewise,
b1: (R,) and b2: (C,) or None; the four share one floating dtype, which may differ from x's
(under torch.autocast the float32 parameters are read as they are). act: "relu" or "silu";
gate: "sigmoid" or "hardsigmoid". Everything between x and y is computed in float32, and R is
at most MAX_SQUEEZE.

The block is a composite of cheap steps on a small tensor; run as one op it costs four
launches each way (five backward above R = 128), against six ops and their autograd nodes
when each step is its own op. It writes new tensors only: no alpha, beta or out.
"""

from __future__ import annotations

import math

import torch
import triton

from ..algos.geometry import parallel_slots
from ..core import bad_param, cdiv, check_tensor, layout_strides, not_supported
from ..core.handle import check_runnable, stream_scratch
from ..core.prepared import PreparedCalls, signature
from ..kernels import squeeze_excitation as K
from ..kernels.launch import slot_launch
from ._common import check_span

ACTIVATIONS = tuple(K.ACTIVATIONS)
GATES = tuple(K.GATES)

#: The largest squeeze width R: the kernels hold a row block's R values in registers.
MAX_SQUEEZE = 512

#: Elements of x one program of the pool and scale kernels covers per step.
_TILE = 4096

#: Rows of the small products per program (tl.dot needs 16 or more).
_BLOCK_N = 16

_calls = PreparedCalls()


def _positions(shape, strides) -> tuple[int, int] | None:
    """(number of spatial positions, stride between consecutive ones) when the spatial dims
    of a tensor of this shape and strides read as one run of positions with one stride, else
    None."""
    dims = [(n, s) for n, s in zip(shape[2:], strides[2:], strict=True) if n != 1]
    count = math.prod(shape[2:])
    if not dims:
        return count, 1
    for (_, outer), (n, inner) in zip(dims, dims[1:], strict=False):
        if outer != n * inner:
            return None
    return count, dims[-1][1]


def _matrix(name: str, w: object, rows: int | None, cols: int, ndim: int, like: torch.Tensor):
    """w as a (rows, cols) matrix of a 1x1 convolution or a linear layer: its strides (row,
    column); rows None takes w's own."""
    w = check_tensor(name, w, device=like.device)
    if w.dim() not in (2, ndim) or any(n != 1 for n in w.shape[2:]):
        raise bad_param(f"{name}.shape", tuple(w.shape), "(rows, cols) or (rows, cols, 1, ...)")
    want = (w.shape[0] if rows is None else rows, cols)
    if tuple(w.shape[:2]) != want:
        raise bad_param(f"{name}.shape", tuple(w.shape), f"{want} in its first two dims")
    return w.stride(0), w.stride(1)


def _check(x, w1, b1, w2, b2, activation, gate) -> tuple[int, int, int, int, tuple, tuple]:
    """(N, C, R, L, w1's strides, w2's strides) of a valid call; raises naming the first bad
    argument."""
    x = check_tensor("x", x, ndim=(3, 4, 5), empty=True)
    if activation not in K.ACTIVATIONS:
        raise bad_param("activation", activation, f"one of {ACTIVATIONS}")
    if gate not in K.GATES:
        raise bad_param("gate", gate, f"one of {GATES}")
    n, c = x.shape[0], x.shape[1]
    length = math.prod(x.shape[2:])
    if c == 0 or length == 0:
        raise bad_param(
            "x.shape", tuple(x.shape), "channels and spatial positions (only N may be 0)"
        )
    check_span("x", x)
    w1_strides = _matrix("w1", w1, None, c, x.dim(), x)
    r = w1.shape[0]
    if r == 0:
        raise bad_param("w1.shape", tuple(w1.shape), "at least one row (the squeeze width R)")
    if r > MAX_SQUEEZE:
        raise not_supported("w1.shape[0]", r, f"squeeze widths up to {MAX_SQUEEZE}")
    w2_strides = _matrix("w2", w2, c, r, x.dim(), x)
    for name, b, size in (("b1", b1, r), ("b2", b2, c)):
        if b is not None:
            b = check_tensor(name, b, ndim=1, device=x.device)
            if b.shape[0] != size:
                raise bad_param(f"{name}.shape", tuple(b.shape), f"({size},)")
    for name, t in (("w2", w2), ("b1", b1), ("b2", b2)):
        if t is not None and t.dtype != w1.dtype:
            raise bad_param(f"{name}.dtype", t.dtype, f"{w1.dtype}, w1's dtype")
    check_runnable(x.device)
    return n, c, r, length, w1_strides, w2_strides


class _Plan:
    """The launches of one call signature, forward and backward."""

    def __init__(self, x, w1, b1, w2, b2, activation, gate):
        n, c, r, length, self.w1_strides, self.w2_strides = _check(
            x, w1, b1, w2, b2, activation, gate
        )
        self.n, self.c, self.r, self.length = n, c, r, length
        if n > 65535:  # the scale kernel's third grid dim
            raise not_supported("x.shape[0]", n, "batches of up to 65535")
        # y (and dx) dense in x's memory format, whose spatial dims always read as one run;
        # an x whose spatial dims do not is copied into that layout first.
        self.y_strides = layout_strides(x.shape, x)
        self.shape = tuple(x.shape)
        self.copy_x = _positions(x.shape, x.stride()) is None
        read = self.y_strides if self.copy_x else x.stride()
        positions, x_step = _positions(x.shape, read)
        self.x_strides = (read[0], read[1], x_step)
        y_step = _positions(x.shape, self.y_strides)[1]
        self.out_strides = (self.y_strides[0], self.y_strides[1], y_step)
        act, gt = K.ACTIVATIONS[activation], K.GATES[gate]
        self.has_b1, self.has_b2 = b1 is not None, b2 is not None

        # pool: one program per (sample, channel block, slice of positions); slices enough
        # that the device has several programs per slot, each at least one tile long.
        block_c = min(64, triton.next_power_of_2(c))
        block_l = max(1, min(triton.next_power_of_2(positions), _TILE // block_c))
        c_blocks = cdiv(c, block_c)
        want = 4 * parallel_slots(x.device.type)
        splits = max(1, min(cdiv(want, max(1, n) * c_blocks), cdiv(positions, block_l)))
        span = cdiv(cdiv(positions, splits), block_l) * block_l
        self.splits = cdiv(positions, span)
        pool = dict(N=n, C=c, L=positions, span=span, BLOCK_L=block_l, BLOCK_C=block_c)
        slots = ("A", "B", "P", "sa_n", "sa_c", "sa_l", "sb_n", "sb_c", "sb_l")
        grid = (max(1, n), c_blocks, self.splits)
        self.pool = slot_launch(K.pool_kernel, grid, slots, PRODUCT=False, **pool)
        self.pool_product = slot_launch(K.pool_kernel, grid, slots, PRODUCT=True, **pool)

        # The small products. Over R (squeeze, excite_grad): blocks of 16 rows by 16 of R,
        # reading all of C in chunks. Over C (excite, weight_grad): blocks of channels with
        # all of R in registers, as many channels as keep a w tile at 4096 float32 values
        # (8 warps above that). Each product then has row blocks x R or C blocks programs.
        self.row_blocks = cdiv(n, _BLOCK_N)
        rows = max(1, self.row_blocks)
        full_r = max(16, triton.next_power_of_2(r))
        excite_c = max(16, min(64, 4096 // full_r))
        warps = 4 if full_r * excite_c <= 4096 else 8
        by_r = dict(N=n, C=c, R=r, BLOCK_N=_BLOCK_N, BLOCK_C=64, BLOCK_R=16)
        by_c = dict(N=n, C=c, R=r, BLOCK_N=_BLOCK_N, BLOCK_C=excite_c, BLOCK_R=full_r)
        # weight_grad keeps three channels x R accumulators and w1's tile: a quarter as many
        # channels as excite (ptxas spilled thousands of bytes with excite's tile, sm_90).
        # Above R = 128 it still did (a stack frame at 256 lanes of R), so there it takes
        # blocks of 64 of R as well, and t, which needs all of R, comes from excite_kernel
        # (identity activation, scaled by 1 / L): one launch more.
        split_r = full_r > 128
        grad_r = 64 if split_r else full_r
        grad_c = max(16, min(64, 1024 // grad_r))
        grad_warps = 4 if grad_r * grad_c <= 512 else 8 if grad_r * grad_c <= 2048 else 16
        w1s, w2s = self.w1_strides, self.w2_strides
        self.squeeze = slot_launch(
            K.squeeze_kernel, (rows, cdiv(r, 16)), ("P", "W1", "B1", "S0", "Z1"),
            splits=self.splits, inv_l=1.0 / length, sw1_r=w1s[0], sw1_c=w1s[1],
            HAS_B1=self.has_b1, **by_r,
        )  # fmt: skip
        excite = dict(num_warps=warps, HAS_B2=self.has_b2, **by_c)
        self.excite = slot_launch(
            K.excite_kernel, (rows, cdiv(c, excite_c)), ("Z1", "W2", "B2", "Z2"),
            sw2_c=w2s[0], sw2_r=w2s[1], out_scale=1.0, ACT=act, **excite,
        )  # fmt: skip
        self.excite_grad = slot_launch(
            K.excite_grad_kernel, (rows, cdiv(r, 16)), ("P", "Z1", "Z2", "W2", "DZ1"),
            splits=self.splits, sw2_c=w2s[0], sw2_r=w2s[1], ACT=act, GATE=gt, **by_r,
        )  # fmt: skip
        self.weight_grad = slot_launch(
            K.weight_grad_kernel, (cdiv(c, grad_c), cdiv(r, grad_r)),
            ("P", "S0", "Z1", "Z2", "DZ1", "W1", "T", "DW1", "DB1", "DW2", "DB2", "sd1_r",
             "sd1_c", "sd2_c", "sd2_r"), num_warps=grad_warps, splits=self.splits,
            inv_l=1.0 / length, sw1_r=w1s[0], sw1_c=w1s[1], ACT=act, GATE=gt,
            HAS_B1=self.has_b1, HAS_B2=self.has_b2, WITH_T=not split_r,
            **{**by_c, "BLOCK_C": grad_c, "BLOCK_R": grad_r},
        )  # fmt: skip
        # t = (dz1 W1) / L: W1 (R x C) read as excite reads W2 (C x R), through its strides
        self.pooled_grad = None
        if split_r:
            self.pooled_grad = slot_launch(
                K.excite_kernel, (rows, cdiv(c, excite_c)), ("Z1", "W2", "B2", "Z2"),
                sw2_c=w1s[1], sw2_r=w1s[0], out_scale=1.0 / length, ACT=2,
                **{**excite, "HAS_B2": False},
            )  # fmt: skip

        # scale: one program per (tile of positions, channel block, sample)
        scale_grid = (cdiv(positions, block_l), c_blocks, max(1, n))
        scale = dict(C=c, L=positions, GATE=gt, BLOCK_L=block_l, BLOCK_C=block_c)
        slots = ("X", "Z2", "T", "Y", "sx_n", "sx_c", "sx_l", "sy_n", "sy_c", "sy_l")
        self.scale = slot_launch(K.scale_kernel, scale_grid, slots, ADD=False, **scale)
        self.scale_add = slot_launch(K.scale_kernel, scale_grid, slots, ADD=True, **scale)
        # The saved float32 values: s0 and z2 (N x C each), then z1 (N x R).
        self.saved_numel = n * (2 * c + r)

    def _dense(self, t: torch.Tensor) -> torch.Tensor:
        """t copied into y's layout."""
        dense = torch.empty_strided(self.shape, self.y_strides, dtype=t.dtype, device=t.device)
        return dense.copy_(t)

    def _dy(self, dy: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int, int]]:
        """dy as the kernels read it (copied when its spatial dims are not one run), with its
        (sample, channel, position) strides."""
        run = _positions(dy.shape, dy.stride())
        if run is None:
            dy = self._dense(dy)
            return dy, self.out_strides
        return dy, (dy.stride(0), dy.stride(1), run[1])

    def _split(self, saved: torch.Tensor):
        n, c = self.n, self.c
        return saved[: n * c], saved[n * c : 2 * n * c], saved[2 * n * c :]

    def forward(self, x, w1, b1, w2, b2) -> tuple[torch.Tensor, torch.Tensor]:
        """(y, saved): saved holds s0, z2 and z1 in float32 for the backward."""
        y = torch.empty_strided(x.shape, self.y_strides, dtype=x.dtype, device=x.device)
        saved = torch.empty(self.saved_numel, dtype=torch.float32, device=x.device)
        if self.n == 0:
            return y, saved
        x = self._dense(x) if self.copy_x else x
        s0, z2, z1 = self._split(saved)
        pooled = stream_scratch(x.device, "se_pool", self.splits * self.n * self.c)
        self.pool(x, x, pooled, *self.x_strides, *self.x_strides)
        self.squeeze(pooled, w1, b1 if b1 is not None else w1, s0, z1)
        self.excite(z1, w2, b2 if b2 is not None else w2, z2)
        self.scale(x, z2, z2, y, *self.x_strides, *self.out_strides)
        return y, saved

    def backward(self, dy, x, saved, w1, w2):
        """(dx, dw1, db1, dw2, db2); db1 and db2 None without biases."""
        dw1, dw2 = torch.empty_like(w1), torch.empty_like(w2)
        db1 = w1.new_empty(self.r) if self.has_b1 else None
        db2 = w1.new_empty(self.c) if self.has_b2 else None
        dx = torch.empty_strided(x.shape, self.y_strides, dtype=x.dtype, device=x.device)
        if self.n == 0:
            for g in (dw1, dw2, db1, db2):
                if g is not None:
                    g.zero_()
            return dx, dw1, db1, dw2, db2
        x = self._dense(x) if self.copy_x else x
        dy, dy_strides = self._dy(dy)
        n, c, r = self.n, self.c, self.r
        s0, z2, z1 = self._split(saved)
        sizes = (self.splits * n * c, n * r, n * c)
        scratch = stream_scratch(x.device, "se_backward", sum(sizes))
        pooled, dz1, t = torch.split(scratch[: sum(sizes)], sizes)
        self.pool_product(dy, x, pooled, *dy_strides, *self.x_strides)
        self.excite_grad(pooled, z1, z2, w2, dz1)
        self.weight_grad(
            pooled, s0, z1, z2, dz1, w1, t, dw1, db1 if db1 is not None else dw1, dw2,
            db2 if db2 is not None else dw2, dw1.stride(0), dw1.stride(1), dw2.stride(0),
            dw2.stride(1),
        )  # fmt: skip
        if self.pooled_grad is not None:
            self.pooled_grad(dz1, w1, w1, t)
        self.scale_add(dy, z2, t, dx, *dy_strides, *self.out_strides)
        return dx, dw1, db1, dw2, db2


def _plan(x, w1, b1, w2, b2, activation, gate) -> _Plan:
    key = signature("squeeze_excitation", (x, w1, b1, w2, b2), activation, gate)
    return _calls.get(key, lambda: _Plan(x, w1, b1, w2, b2, activation, gate))


def squeeze_excitation_training(
    x: torch.Tensor,
    w1: torch.Tensor,
    b1: torch.Tensor | None,
    w2: torch.Tensor,
    b2: torch.Tensor | None,
    activation: str = "relu",
    gate: str = "sigmoid",
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, saved): the block's output and, for squeeze_excitation_backward, its float32
    intermediates (a flat tensor of N * (2C + R) values)."""
    return _plan(x, w1, b1, w2, b2, activation, gate).forward(x, w1, b1, w2, b2)


def squeeze_excitation(
    x: torch.Tensor,
    w1: torch.Tensor,
    b1: torch.Tensor | None,
    w2: torch.Tensor,
    b2: torch.Tensor | None,
    activation: str = "relu",
    gate: str = "sigmoid",
) -> torch.Tensor:
    """y = x * gate(act(mean(x) @ w1^T + b1) @ w2^T + b2), the means over x's spatial
    positions (see the module's docstring for shapes and dtypes)."""
    return squeeze_excitation_training(x, w1, b1, w2, b2, activation, gate)[0]


def squeeze_excitation_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    saved: torch.Tensor,
    w1: torch.Tensor,
    b1: torch.Tensor | None,
    w2: torch.Tensor,
    b2: torch.Tensor | None,
    activation: str = "relu",
    gate: str = "sigmoid",
) -> tuple[torch.Tensor, ...]:
    """(dx, dw1, db1, dw2, db2), the gradients of squeeze_excitation given dy (x's shape);
    `saved` is what squeeze_excitation_training returned with y. dx has y's layout, each
    weight gradient its weight's shape, strides and dtype; db1 and db2 are None where the
    bias is. The biases are read for their presence and shape only."""
    plan = _plan(x, w1, b1, w2, b2, activation, gate)
    dy = check_tensor("dy", dy, dtype=x.dtype, device=x.device, empty=True)
    if tuple(dy.shape) != tuple(x.shape):
        raise bad_param("dy.shape", tuple(dy.shape), f"{tuple(x.shape)}, x's shape")
    saved = check_tensor("saved", saved, ndim=1, dtype=torch.float32, device=x.device, empty=True)
    if saved.numel() != plan.saved_numel or not saved.is_contiguous():
        raise bad_param(
            "saved.shape", tuple(saved.shape), f"({plan.saved_numel},), contiguous, as returned"
        )
    return plan.backward(dy, x, saved, w1, w2)
