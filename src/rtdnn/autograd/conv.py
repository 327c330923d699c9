"""Convolution: forward, backward data, filter and bias as custom ops with autograd."""

from __future__ import annotations

from torch import Tensor

from .. import ops
from ..core import ConvDesc, as_tuple, conv_activation, conv_output_shape, empty_like_layout
from ..ops.conv import IntOrSeq, named_padding
from ._custom_op import check_differentiable, custom_op, public, records_grad
from .activation import activation_backward


def _desc(x: Tensor, stride, padding, dilation, groups, mode) -> ConvDesc:
    return ConvDesc.create(x.dim() - 2, stride, padding, dilation, groups, mode, "fp32")


# The forward op takes the plain API's algorithm choice and math mode; the backward ops take the
# math mode and workspace limit (their algorithm is chosen for their own direction). All take
# `deterministic`; left at None, each op reads torch.use_deterministic_algorithms when it runs,
# as torch's own convolution backward does. alpha scales
# the convolution (not the bias) in float32 inside the kernel, as the plain call does, and
# scales the data and filter gradients the same way.


@custom_op("rtdnn::conv_forward")
def conv_forward(
    x: Tensor,
    w: Tensor,
    bias: Tensor | None,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
    mode: str,
    algo: str = "auto",
    workspace_limit: int | None = None,
    math: str | None = None,
    alpha: float = 1.0,
    micro_batch: str = "undivided",
    deterministic: bool | None = None,
    activation: str = "identity",
) -> Tensor:
    return ops.conv_forward(
        x, w, bias, stride=stride, padding=padding, dilation=dilation, groups=groups, mode=mode,
        alpha=alpha, algo=algo, workspace_limit=workspace_limit, math=math,
        micro_batch=micro_batch, deterministic=deterministic, activation=activation,
    )  # fmt: skip


@conv_forward.register_fake
def _(x, w, bias, stride, padding, dilation, groups, mode, algo="auto", workspace_limit=None,
      math=None, alpha=1.0, micro_batch="undivided", deterministic=None,
      activation="identity"):  # fmt: skip
    shape = conv_output_shape(x.shape, w.shape, _desc(x, stride, padding, dilation, groups, mode))
    return empty_like_layout(shape, x)


@custom_op("rtdnn::conv_backward_data")
def conv_backward_data(
    dy: Tensor,
    w: Tensor,
    x_shape: list[int],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
    mode: str,
    workspace_limit: int | None = None,
    math: str | None = None,
    alpha: float = 1.0,
    micro_batch: str = "undivided",
    deterministic: bool | None = None,
) -> Tensor:
    return ops.conv_backward_data(
        dy, w, x_shape, stride=stride, padding=padding, dilation=dilation, groups=groups,
        mode=mode, alpha=alpha, workspace_limit=workspace_limit, math=math,
        micro_batch=micro_batch,
        deterministic=deterministic,
    )  # fmt: skip


@conv_backward_data.register_fake
def _(dy, w, x_shape, stride, padding, dilation, groups, mode, workspace_limit=None, math=None,
      alpha=1.0, micro_batch="undivided", deterministic=None):  # fmt: skip
    return empty_like_layout(x_shape, dy)


@custom_op("rtdnn::conv_backward_filter")
def conv_backward_filter(
    x: Tensor,
    dy: Tensor,
    w_shape: list[int],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
    mode: str,
    workspace_limit: int | None = None,
    math: str | None = None,
    alpha: float = 1.0,
    micro_batch: str = "undivided",
    deterministic: bool | None = None,
) -> Tensor:
    return ops.conv_backward_filter(
        x, dy, w_shape, stride=stride, padding=padding, dilation=dilation, groups=groups,
        mode=mode, alpha=alpha, workspace_limit=workspace_limit, math=math,
        micro_batch=micro_batch,
        deterministic=deterministic,
    )  # fmt: skip


@conv_backward_filter.register_fake
def _(x, dy, w_shape, stride, padding, dilation, groups, mode, workspace_limit=None, math=None,
      alpha=1.0, micro_batch="undivided", deterministic=None):  # fmt: skip
    return empty_like_layout(w_shape, x)


@custom_op("rtdnn::conv_backward_bias")
def conv_backward_bias(dy: Tensor) -> Tensor:
    return ops.conv_backward_bias(dy)


@conv_backward_bias.register_fake
def _(dy):
    return dy.new_empty((dy.shape[1],))


def _conv_setup_context(ctx, inputs, output):
    # The eager road passes the arguments as the caller gave them, without the defaults of
    # those left out.
    x, w, bias, stride, padding, dilation, groups, mode, *tuning = inputs
    defaults = ("auto", None, None, 1.0, "undivided", None, "identity")
    _algo, workspace_limit, math, alpha, micro_batch, deterministic, activation = (
        *tuning,
        *defaults[len(tuning) :],
    )
    # The activation's gradient reads the output (relu: where it is positive).
    ctx.activation = activation
    ctx.save_for_backward(x, w, output if activation != "identity" else None)
    ctx.conv_args = (
        stride, padding, dilation, groups, mode, workspace_limit, math, alpha, micro_batch,
        deterministic,
    )  # fmt: skip
    ctx.has_bias = bias is not None


def _conv_backward(ctx, dy):
    x, w, y = ctx.saved_tensors
    if ctx.activation != "identity":
        dy = activation_backward(dy, y, y, ctx.activation, [])
    args = ctx.conv_args
    need_x, need_w, need_b = ctx.needs_input_grad[:3]
    dx = conv_backward_data(dy, w, list(x.shape), *args) if need_x else None
    dw = conv_backward_filter(x, dy, list(w.shape), *args) if need_w else None
    # y = alpha * conv(x, w) + bias: dx and dw take alpha (in args), db does not.
    db = conv_backward_bias(dy) if ctx.has_bias and need_b else None
    # One gradient per input of the full schema; autograd drops the trailing Nones the eager
    # road's shorter argument list has no input for.
    return dx, dw, db, *(None,) * 12


conv_forward.register_autograd(_conv_backward, setup_context=_conv_setup_context)


@public(ops.conv_forward)
def conv_forward_api(
    x: Tensor,
    w: Tensor,
    bias: Tensor | None = None,
    *,
    stride: IntOrSeq = 1,
    padding: IntOrSeq | str = 0,
    dilation: IntOrSeq = 1,
    groups: int = 1,
    mode: str = "cross_correlation",
    alpha: float = 1.0,
    beta: float = 0.0,
    out: Tensor | None = None,
    algo: str = "auto",
    workspace_limit: int | None = None,
    math: str | None = None,
    micro_batch: str = "undivided",
    deterministic: bool | None = None,
    activation: str | None = None,
) -> Tensor:
    if not records_grad(x, w, bias):
        return ops.conv_forward(
            x, w, bias, stride=stride, padding=padding, dilation=dilation, groups=groups,
            mode=mode, alpha=alpha, beta=beta, out=out, algo=algo,
            workspace_limit=workspace_limit, math=math, micro_batch=micro_batch,
            deterministic=deterministic, activation=activation,
        )  # fmt: skip
    check_differentiable("conv_forward", alpha, beta, out)
    activation = conv_activation(activation)  # before the op (a trace would not check it)
    if isinstance(x, Tensor) and isinstance(w, Tensor) and x.dim() == w.dim() - 1:  # unbatched
        return conv_forward_api(
            x.unsqueeze(0), w, bias, stride=stride, padding=padding, dilation=dilation,
            groups=groups, mode=mode, alpha=alpha, algo=algo, workspace_limit=workspace_limit,
            math=math, micro_batch=micro_batch, deterministic=deterministic, activation=activation,
        ).squeeze(0)  # fmt: skip
    if isinstance(padding, str):  # "same" may pad x on the right: F.pad carries the gradient
        x, padding = named_padding(x, w, padding, stride, dilation)
    n = x.dim() - 2
    return conv_forward(
        x, w, bias, list(as_tuple("stride", stride, n)), list(as_tuple("padding", padding, n)),
        list(as_tuple("dilation", dilation, n)), groups, mode, algo, workspace_limit, math,
        float(alpha), micro_batch, deterministic, activation,
    )  # fmt: skip
