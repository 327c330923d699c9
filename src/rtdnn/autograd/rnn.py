"""Recurrent networks as custom ops: the forward on packed sequences (rtdnn::rnn) and its
backward (rtdnn::rnn_backward), with fake kernels for torch.compile.

These are plain torch.library custom ops, not _custom_op.CustomOp: that class's eager road
skips the backward when the first output gets no gradient, but a network read only through its
final state h_n (a classifier) has exactly that, and an RNN's many launches make the
dispatcher's cost per call negligible. The forward also returns the reserve (what the backward
reads), as cuDNN's RNN does; it takes no gradient.

Padding, packing and the batch's sort order are handled around the ops by torch's own
differentiable functions (rtdnn.ops.rnn.prepare and RnnCall.finish).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..kernels.rnn import MODES
from ..ops.rnn import RnnSpec, prepare, reserve_sizes, rnn_backward_packed, rnn_forward_packed
from ..ops.rnn import rnn as plain_rnn
from ._custom_op import OP_NAMES, lower_as_fallbacks, records_grad


def _spec(x: Tensor, weights, mode, num_layers, bidirectional, bias, proj_size):
    hidden = weights[0].shape[0] // MODES[mode][1]
    return RnnSpec(
        mode, x.shape[-1], hidden, proj_size, num_layers, 2 if bidirectional else 1, bias
    )


@torch.library.custom_op("rtdnn::rnn", mutates_args=())
def rnn(
    x: Tensor,
    h0: Tensor,
    c0: Tensor | None,
    weights: list[Tensor],
    batch_sizes: list[int],
    mode: str,
    num_layers: int,
    bidirectional: bool,
    bias: bool,
    proj_size: int,
    dropout: float,
    training: bool,
    seed: int,
    math: str | None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(y, h_n, c_n, reserve float32, reserve in x's dtype); see ops.rnn.rnn_forward_packed."""
    spec = _spec(x, weights, mode, num_layers, bidirectional, bias, proj_size)
    return rnn_forward_packed(
        x, batch_sizes, h0, c0, weights, spec, dropout=dropout, training=training, seed=seed,
        math=math,
    )  # fmt: skip


@rnn.register_fake
def _(x, h0, c0, weights, batch_sizes, mode, num_layers, bidirectional, bias, proj_size,
      dropout, training, seed, math):  # fmt: skip
    lower_as_fallbacks()
    spec = _spec(x, weights, mode, num_layers, bidirectional, bias, proj_size)
    rows = x.shape[0]
    f32, data = reserve_sizes(spec, rows)
    c_n = x.new_empty(c0.shape if c0 is not None else (0,))
    return (
        x.new_empty((rows, spec.directions * spec.out_size)),
        x.new_empty(h0.shape),
        c_n,
        x.new_empty(f32, dtype=torch.float32),
        x.new_empty(data),
    )


OP_NAMES.append("rtdnn::rnn")  # for Inductor, as the CustomOp ops (lower_as_fallbacks)


@torch.library.custom_op("rtdnn::rnn_backward", mutates_args=())
def rnn_backward(
    dy: Tensor,
    dh_n: Tensor,
    dc_n: Tensor | None,
    x: Tensor,
    weights: list[Tensor],
    reserve_f32: Tensor,
    reserve_data: Tensor,
    batch_sizes: list[int],
    mode: str,
    num_layers: int,
    bidirectional: bool,
    bias: bool,
    proj_size: int,
    dropout: float,
    training: bool,
    seed: int,
    math: str | None,
) -> tuple[Tensor, Tensor, Tensor, list[Tensor]]:
    """(dx, dh0, dc0 (empty unless lstm), the weights' gradients)."""
    spec = _spec(x, weights, mode, num_layers, bidirectional, bias, proj_size)
    return rnn_backward_packed(
        dy, dh_n, dc_n, x, weights, reserve_f32, reserve_data, batch_sizes, spec,
        dropout=dropout, training=training, seed=seed, math=math,
    )  # fmt: skip


@rnn_backward.register_fake
def _(dy, dh_n, dc_n, x, weights, reserve_f32, reserve_data, batch_sizes, mode, num_layers,
      bidirectional, bias, proj_size, dropout, training, seed, math):  # fmt: skip
    lower_as_fallbacks()
    dc0 = x.new_empty(dc_n.shape if dc_n is not None else (0,))
    return (
        x.new_empty(x.shape),
        x.new_empty(dh_n.shape),
        dc0,
        [w.new_empty(w.shape) for w in weights],
    )


OP_NAMES.append("rtdnn::rnn_backward")


def _setup_context(ctx, inputs, output):
    x, h0, c0, weights, *config = inputs
    y, h_n, c_n, reserve_f32, reserve_data = output
    ctx.mark_non_differentiable(reserve_f32, reserve_data)
    ctx.save_for_backward(x, reserve_f32, reserve_data, *weights)
    ctx.config = config  # batch_sizes, mode, ..., math
    ctx.lstm = c0 is not None


def _backward(ctx, dy, dh_n, dc_n, _f32, _data):
    x, reserve_f32, reserve_data, *weights = ctx.saved_tensors
    batch_sizes, mode, num_layers, bidirectional, bias, proj_size = ctx.config[:6]
    dirs = 2 if bidirectional else 1
    spec = _spec(x, weights, mode, num_layers, bidirectional, bias, proj_size)
    # Outputs that took no part in the loss may arrive as None (torch.compile): zeros.
    if dy is None:
        dy = x.new_zeros((x.shape[0], dirs * spec.out_size))
    if dh_n is None:
        dh_n = x.new_zeros((num_layers * dirs, batch_sizes[0], spec.out_size))
    if ctx.lstm and dc_n is None:
        dc_n = x.new_zeros((num_layers * dirs, batch_sizes[0], spec.hidden_size))
    dx, dh0, dc0, dweights = rnn_backward(
        dy, dh_n, dc_n if ctx.lstm else None, x, weights, reserve_f32, reserve_data,
        *ctx.config,
    )  # fmt: skip
    return (dx, dh0, dc0 if ctx.lstm else None, dweights, *(None,) * len(ctx.config))


rnn.register_autograd(_backward, setup_context=_setup_context)


def rnn_api(
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
) -> tuple:
    call = prepare(
        input, hx, weights, mode=mode, num_layers=num_layers, bidirectional=bidirectional,
        bias=bias, batch_first=batch_first, proj_size=proj_size, dropout=dropout,
        training=training, lengths=lengths, enforce_sorted=enforce_sorted, seed=seed,
        generator=generator, math=math,
    )  # fmt: skip
    spec = call.spec
    if records_grad(call.data, call.h0, call.c0, *call.weights):
        y, h_n, c_n, _, _ = rnn(
            call.data, call.h0, call.c0, list(call.weights), call.batch_sizes, spec.mode,
            spec.num_layers, spec.directions == 2, spec.bias, spec.proj_size, call.dropout,
            call.training, call.seed, call.math,
        )  # fmt: skip
    else:
        y, h_n, c_n, _, _ = rnn_forward_packed(
            call.data, call.batch_sizes, call.h0, call.c0, call.weights, spec,
            dropout=call.dropout, training=call.training, seed=call.seed, math=call.math,
        )  # fmt: skip
    return call.finish(y, h_n, c_n if spec.mode == "lstm" else None)


rnn_api.__name__ = rnn_api.__qualname__ = "rnn"
rnn_api.__module__ = "rtdnn"
rnn_api.__doc__ = plain_rnn.__doc__.replace(
    "Not differentiable: rtdnn.rnn is, through a custom op.",
    "Differentiable: when an input or weight requires grad (and grad mode is on) the call runs\n"
    "    the custom op rtdnn::rnn, whose backward gives the gradients of the input, the initial\n"
    "    states and every weight. rtdnn.ops.rnn is the plain primitive.",
)
