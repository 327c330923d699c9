"""Convolution: the public functional API.

Shapes follow torch: x (N, C, *spatial), w (K, C/groups, *kernel), y (N, K, *out_spatial),
with 1 to 3 spatial dims and any strides (conv_forward also takes an unbatched x (C, *spatial),
as torch does); a batch of N = 0 gives an empty result (and zero
filter and bias gradients) without a kernel launch. Each call validates everything before a
kernel is launched, builds a ConvProblem, picks an algorithm and runs it:

    out = alpha * conv(...) + beta * out          (out's prior value; beta != 0 needs `out`)

`mode="convolution"` flips the filter (true convolution), "cross_correlation" (the default)
does not, as in cuDNN. `math` is "fp32" (strict) or "tf32" for float32 data; None follows
`torch.backends.cudnn.allow_tf32`. Half-precision data always accumulates in float32.
`deterministic=True` allows only algorithms whose results repeat bit for bit (algo="auto" skips
the others; naming one raises BadParamError); None follows
`torch.use_deterministic_algorithms`.

`out` must share no memory with x, w, dy or bias (BadParamError): every output element
reads many inputs, so no direction runs in place.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from .. import select
from ..algos import ConvAlgorithm, ConvTensors
from ..core import (
    AllocFailedError,
    ConvDesc,
    ConvProblem,
    Direction,
    TensorDesc,
    as_tuple,
    bad_param,
    check_out,
    check_out_disjoint,
    check_runnable,
    check_scaling,
    check_tensor,
    conv_activation,
    conv_output_shape,
    empty_like_layout,
    layout_strides,
    resolve_deterministic,
    resolve_math_mode,
)
from ..core.handle import stream_workspace
from ..select.plan import Plan, check_bytes, check_policy
from ._common import finish_empty
from .conv_plan import check_micro_batch, observing, plan_for, run_micro_batched
from .tensor_ops import reduce_tensor

IntOrSeq = int | Sequence[int]


def _conv_desc(ndim, stride, padding, dilation, groups, mode, math) -> ConvDesc:
    return ConvDesc.create(
        ndim - 2, stride, padding, dilation, groups, mode, resolve_math_mode(math)
    )


# A training loop repeats the same calls every step. Everything a call checks and chooses
# (shapes, algorithm, tiles) depends only on its signature: the tensors' shapes, strides, dtypes
# and devices and the parameters. So a call is validated and prepared once per signature, and
# later calls with that signature only allocate the output and launch. Only calls that passed
# validation are stored.
class _Algorithm:
    """An algorithm prepared for one problem: its workspace need, and its runner once built
    (the first run may time tile shapes on real data)."""

    def __init__(self, p: ConvProblem, algorithm: ConvAlgorithm):
        self.algorithm = algorithm
        self.workspace_bytes = algorithm.workspace_bytes(p)
        self.runner = None

    def run(self, p: ConvProblem, t: ConvTensors, workspace, alpha: float, beta: float) -> None:
        runner = self.runner  # read once: another thread may be building it too (harmless)
        if runner is None:
            runner = self.runner = self.algorithm.runner(p, t, workspace)
        runner(t, workspace, alpha, beta)


class _Prepared:
    """A validated call: its output's shape and strides, and what runs it. `fallback`: the
    algorithm that needs no workspace, run instead when the chosen one's workspace cannot be
    allocated (algo="auto"), or None (a named algorithm fails as asked)."""

    def __init__(
        self,
        p: ConvProblem,
        algorithm: ConvAlgorithm,
        shape,
        like: torch.Tensor,
        fallback: ConvAlgorithm | None = None,
    ):
        self.problem = p
        self.chosen = _Algorithm(p, algorithm)
        self.fallback = _Algorithm(p, fallback) if fallback is not None else None
        self.shape = tuple(shape)
        self.strides = layout_strides(self.shape, like)

    def output(self, out: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
        if out is not None:
            return out
        return torch.empty_strided(self.shape, self.strides, dtype=like.dtype, device=like.device)

    def __call__(self, t: ConvTensors, alpha: float, beta: float) -> None:
        chosen = self.chosen
        try:
            workspace = stream_workspace(chosen.workspace_bytes, t.x.device)
        except AllocFailedError:
            # Building the fallback may time tile shapes, which a CUDA graph's capture forbids.
            if self.fallback is None or (t.x.is_cuda and torch.cuda.is_current_stream_capturing()):
                raise
            # The signature runs the fallback from now on, on every stream and thread (any
            # thread that gets here makes the same switch): asking again for memory that was
            # not there would cost every call. get_conv_algorithm still names the choice.
            chosen = self.chosen = self.fallback
            workspace = None
        chosen.run(self.problem, t, workspace, alpha, beta)


_prepared: dict[tuple, _Prepared] = {}


def _run(
    call: _Prepared, t: ConvTensors, micro_batch: str, workspace_limit, alpha, beta,
    deterministic: bool,
) -> None:  # fmt: skip
    if micro_batch == "undivided" and not observing():  # observed: measured, see conv_plan
        call(t, alpha, beta)
    else:  # validated like any call; the plan picks the algorithms (see conv_plan)
        run_micro_batched(call.problem, t, micro_batch, workspace_limit, alpha, beta, deterministic)


def _lookup(direction: Direction, tensors, *params) -> tuple[tuple | None, _Prepared | None]:
    """(key, prepared call or None). Lists among the parameters count as tuples. The key is
    None when an argument is not a tensor or a parameter cannot be hashed: such calls are
    validated every time (and most fail)."""
    try:
        key = (
            direction,
            *[None if t is None else (t.shape, t.stride(), t.dtype, t.device) for t in tensors],
            *[tuple(v) if type(v) is list else v for v in params],
        )
        return key, _prepared.get(key)
    except (AttributeError, TypeError):
        return None, None


def prepared_forward(x, w, bias, stride, padding, dilation, groups, mode: str,
                     deterministic: bool) -> _Prepared | None:  # fmt: skip
    """The prepared call that conv_forward(x, w, bias, stride=..., padding=..., dilation=...,
    groups=..., mode=..., deterministic=...) stored (the other arguments left at their
    defaults; padding as numbers), or None if none has run (or it was forgotten). Run it with
    run_prepared."""
    return _lookup(
        Direction.FORWARD, (x, w, bias, None), stride, padding, dilation, groups, mode, "auto",
        None, resolve_math_mode(None), deterministic, "identity",
    )[1]  # fmt: skip


def prepared_backward(direction: Direction, first, second, shape, stride, padding, dilation,
                      groups, mode: str, deterministic: bool) -> _Prepared | None:  # fmt: skip
    """As prepared_forward, for conv_backward_data (first, second = dy, w; shape = x_shape) or
    conv_backward_filter (x, dy; w_shape)."""
    return _lookup(
        direction, (first, second, None), shape, stride, padding, dilation, groups, mode, "auto",
        None, resolve_math_mode(None), deterministic,
    )[1]  # fmt: skip


def run_prepared(call: _Prepared, t: ConvTensors, deterministic: bool) -> None:
    """Run a call that `prepared` returned on tensors of its signature (alpha 1, beta 0, no
    out: nothing left to check per call)."""
    _run(call, t, "undivided", None, 1.0, 0.0, deterministic)


def _remember(key: tuple | None, call: _Prepared) -> _Prepared:
    if key is not None:
        _prepared[key] = call
    return call


def _prepare(
    direction: Direction,
    tensors: ConvTensors,
    conv: ConvDesc,
    algo: str,
    workspace_limit: int | None,
    deterministic: bool,
    out_shape,
    like: torch.Tensor,
    activation: str = "identity",
) -> _Prepared:
    x, w, y = tensors.x, tensors.w, tensors.y
    check_runnable(x.device)
    p = ConvProblem.create(
        direction, TensorDesc.of(x), TensorDesc.of(w), TensorDesc.of(y), conv, x.device.type,
        tensors.bias is not None, activation,
    )  # fmt: skip
    algorithm = select.resolve(p, algo, workspace_limit, deterministic)
    # auto's choice may need more memory than is free when a call asks for its workspace; the
    # algorithm that needs none then runs instead.
    fallback = None
    if algo == "auto" and algorithm.workspace_bytes(p):
        fallback = select.choose(p, "no_workspace", None, deterministic)
    return _Prepared(p, algorithm, out_shape, like, fallback)


def _shape_arg(name: str, shape, ndim: int) -> tuple[int, ...]:
    try:
        t = tuple(int(s) for s in shape)
    except (TypeError, ValueError):
        raise bad_param(name, shape, f"a sequence of {ndim} ints") from None
    if len(t) != ndim:
        raise bad_param(name, shape, f"a sequence of {ndim} ints")
    return t


def _output(out: torch.Tensor | None, shape, like: torch.Tensor) -> torch.Tensor:
    if out is None:
        return empty_like_layout(shape, like)
    check_out(out, shape, like)
    return out


def same_padding(kernel: Sequence[int], dilation: Sequence[int]) -> tuple[tuple, tuple]:
    """torch's padding="same" for stride 1: the total padding dilation * (kernel - 1) per dim,
    split as (padding on both sides, one extra entry on the right where the total is odd)."""
    totals = [d * (k - 1) for d, k in zip(dilation, kernel, strict=True)]
    return tuple(t // 2 for t in totals), tuple(t % 2 for t in totals)


def pad_same(x: torch.Tensor, kernel: Sequence[int], dilation: Sequence[int]):
    """(x, numeric padding) for padding="same" at stride 1: x padded by one more on the right
    where a dim's total padding is odd, as torch does."""
    both, extra = same_padding(kernel, dilation)
    if any(extra):
        x = F.pad(x, [p for e in reversed(extra) for p in (0, e)])
    return x, both


def _check_operands(
    name: str, t: object, w: object, *, unbatched: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """(t, w): the data operand `name` (x or dy; may be empty) and the filter w, of equal rank
    (3 to 5), t's dtype and device. w's rank sets t's, so a rank mismatch names t (`unbatched`:
    the message mentions t's unbatched rank, w.dim() - 1, too)."""
    t = check_tensor(name, t, empty=True)
    w = check_tensor("w", w, ndim=(3, 4, 5), dtype=t.dtype, device=t.device)
    if t.dim() != w.dim():
        expected = f"{w.dim()}, as w.dim()"
        if unbatched:
            expected += f", or {w.dim() - 1} (unbatched)"
        raise bad_param(f"{name}.dim()", t.dim(), expected)
    return t, w


def named_padding(x, w, padding: str, stride, dilation) -> tuple[torch.Tensor, tuple]:
    """(x, numeric padding) for padding="valid" or "same" (x padded on the right where "same"
    needs an odd total, as torch does)."""
    x, w = _check_operands("x", x, w, unbatched=True)
    n = x.dim() - 2
    if padding == "valid":
        return x, (0,) * n
    if padding != "same":
        raise bad_param("padding", padding, 'an int, a sequence of ints, "same" or "valid"')
    if any(s != 1 for s in as_tuple("stride", stride, n)):
        raise bad_param("stride", stride, 'all 1 with padding="same" (as torch requires)')
    return pad_same(x, w.shape[2:], as_tuple("dilation", dilation, n))


def conv_forward(
    x: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    stride: IntOrSeq = 1,
    padding: IntOrSeq | str = 0,
    dilation: IntOrSeq = 1,
    groups: int = 1,
    mode: str = "cross_correlation",
    alpha: float = 1.0,
    beta: float = 0.0,
    out: torch.Tensor | None = None,
    algo: str = "auto",
    workspace_limit: int | None = None,
    math: str | None = None,
    micro_batch: str = "undivided",
    deterministic: bool | None = None,
    activation: str | None = None,
) -> torch.Tensor:
    """y = act(alpha * conv(x, w) + bias + beta * out).

    x: (N, C, *S), or unbatched (C, *S) as torch.nn.functional.conv*d takes; w: (K, C/groups,
    *R); bias: (K,) or None. Returns y (N, K, *O) (unbatched: (K, *O)), in x's memory format
    (channels-last in, channels-last out) unless `out` is given, which is then written in
    place and returned (batched or not as x). `padding` is per spatial dim, or "valid" (none)
    or "same" (O = S, stride 1 only; an odd total pads one more on the right, as
    torch.nn.Conv does). `algo` is "auto" (the fastest whose workspace fits
    `workspace_limit` bytes) or an algorithm name such as "IMPLICIT_GEMM" or "GEMM";
    `deterministic` (None: torch.are_deterministic_algorithms_enabled()) limits either to
    algorithms whose results repeat bit for bit.
    `micro_batch` "powerOfTwo" or "all" (with algo="auto") runs the batch in micro-batches,
    each with the fastest algorithm whose workspace fits `workspace_limit` (see plan_conv);
    the first call of a shape measures them all. "undivided" (the default) does not split.
    `activation` (None or "identity": none; "relu") is applied last, as cuDNN's
    ConvolutionBiasActivationForward does: in the GEMM's epilogue for the GEMM algorithms
    (IMPLICIT_GEMM, IMPLICIT_PRECOMP_GEMM, GEMM and their split forms), by one more pass over
    y for the others.
    """
    if micro_batch != "undivided":
        check_micro_batch(micro_batch, algo)
    if isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor) and x.dim() == w.dim() - 1:
        # Unbatched: a batch of one, then the batch dim dropped (out, if given, is unbatched
        # too and is written through a view).
        if isinstance(out, torch.Tensor) and out.dim() != x.dim():
            raise bad_param("out.dim()", out.dim(), f"{x.dim()}, unbatched as x is")
        y = conv_forward(
            x.unsqueeze(0), w, bias, stride=stride, padding=padding, dilation=dilation,
            groups=groups, mode=mode, alpha=alpha, beta=beta,
            out=out.unsqueeze(0) if isinstance(out, torch.Tensor) else out, algo=algo,
            workspace_limit=workspace_limit, math=math, micro_batch=micro_batch,
            deterministic=deterministic, activation=activation,
        )  # fmt: skip
        return out if out is not None else y.squeeze(0)
    if isinstance(padding, str):
        x, padding = named_padding(x, w, padding, stride, dilation)
    deterministic = resolve_deterministic(deterministic)
    activation = "identity" if activation is None else activation  # the key's spelling
    key, call = _lookup(
        Direction.FORWARD, (x, w, bias, out), stride, padding, dilation, groups, mode, algo,
        workspace_limit, resolve_math_mode(math), deterministic, activation,
    )  # fmt: skip
    if call is None:
        activation = conv_activation(activation)  # checked before an empty batch returns
        x, w = _check_operands("x", x, w, unbatched=True)
        conv = _conv_desc(x.dim(), stride, padding, dilation, groups, mode, math)
        y_shape = conv_output_shape(x.shape, w.shape, conv)
        if bias is not None:
            bias = check_tensor("bias", bias, ndim=1, dtype=x.dtype, device=x.device)
            if bias.shape[0] != w.shape[0]:
                raise bad_param("bias.shape", tuple(bias.shape), f"({w.shape[0]},), one per filter")
        check_scaling(alpha, beta, out)
        y = _output(out, y_shape, x)
        check_out_disjoint(out, x=x, w=w, bias=bias)
        if y.numel() == 0:  # a batch of 0
            return y
        bias = bias.contiguous() if bias is not None else None
        tensors = ConvTensors(x, w, y, bias)
        prepared = _prepare(
            Direction.FORWARD,
            tensors,
            conv,
            algo,
            workspace_limit,
            deterministic,
            y_shape,
            x,
            activation,
        )
        call = _remember(key, prepared)
    else:
        check_scaling(alpha, beta, out)
        y = call.output(out, x)
        check_out_disjoint(out, x=x, w=w, bias=bias)
        tensors = ConvTensors(x, w, y, bias.contiguous() if bias is not None else None)
    _run(call, tensors, micro_batch, workspace_limit, alpha, beta, deterministic)
    return y


def conv_backward_data(
    dy: torch.Tensor,
    w: torch.Tensor,
    x_shape: Sequence[int],
    *,
    stride: IntOrSeq = 1,
    padding: IntOrSeq = 0,
    dilation: IntOrSeq = 1,
    groups: int = 1,
    mode: str = "cross_correlation",
    alpha: float = 1.0,
    beta: float = 0.0,
    out: torch.Tensor | None = None,
    algo: str = "auto",
    workspace_limit: int | None = None,
    math: str | None = None,
    micro_batch: str = "undivided",
    deterministic: bool | None = None,
) -> torch.Tensor:
    """dx = alpha * (gradient of conv(x, w) w.r.t. x, given dy) + beta * out.

    dy: (N, K, *O); w: (K, C/groups, *R); x_shape: (N, C, *S). Returns dx in dy's memory
    format, or `out`. `micro_batch` as in conv_forward.
    """
    return _backward(
        Direction.BACKWARD_DATA, dy, w, x_shape, ("dy", "w", "x_shape"), stride, padding,
        dilation, groups, mode, alpha, beta, out, algo, workspace_limit, math, micro_batch,
        deterministic,
    )  # fmt: skip


def conv_backward_filter(
    x: torch.Tensor,
    dy: torch.Tensor,
    w_shape: Sequence[int],
    *,
    stride: IntOrSeq = 1,
    padding: IntOrSeq = 0,
    dilation: IntOrSeq = 1,
    groups: int = 1,
    mode: str = "cross_correlation",
    alpha: float = 1.0,
    beta: float = 0.0,
    out: torch.Tensor | None = None,
    algo: str = "auto",
    workspace_limit: int | None = None,
    math: str | None = None,
    micro_batch: str = "undivided",
    deterministic: bool | None = None,
) -> torch.Tensor:
    """dw = alpha * (gradient of conv(x, w) w.r.t. w, given dy) + beta * out.

    x: (N, C, *S); dy: (N, K, *O); w_shape: (K, C/groups, *R). Returns dw in x's memory
    format, or `out`. `micro_batch` as in conv_forward (the micro-batches' gradients add up
    into dw, with alpha and beta applied as in one call).
    """
    return _backward(
        Direction.BACKWARD_FILTER, x, dy, w_shape, ("x", "dy", "w_shape"), stride, padding,
        dilation, groups, mode, alpha, beta, out, algo, workspace_limit, math, micro_batch,
        deterministic,
    )  # fmt: skip


def _backward(
    direction: Direction, first, second, shape, names, stride, padding, dilation, groups, mode,
    alpha, beta, out, algo, workspace_limit, math, micro_batch, deterministic,
) -> torch.Tensor:  # fmt: skip
    """conv_backward_data (first, second = dy, w; shape = x_shape) and conv_backward_filter
    (first, second = x, dy; shape = w_shape): the result has `shape` in first's memory format
    (or is `out`); `names` name the three arguments in errors."""
    if micro_batch != "undivided":
        check_micro_batch(micro_batch, algo)
    deterministic = resolve_deterministic(deterministic)
    key, call = _lookup(
        direction, (first, second, out), shape, stride, padding, dilation, groups, mode, algo,
        workspace_limit, resolve_math_mode(math), deterministic,
    )  # fmt: skip
    data = direction is Direction.BACKWARD_DATA
    if call is None:  # a new signature: validate everything, then prepare below
        if data:  # dy's rank follows the filter's
            first, second = _check_operands("dy", first, second)
        else:
            first = check_tensor("x", first, ndim=(3, 4, 5), empty=True)
            second = check_tensor(
                "dy", second, ndim=first.dim(), dtype=first.dtype, device=first.device, empty=True
            )
        shape = _shape_arg(names[2], shape, first.dim())
        conv = _conv_desc(first.dim(), stride, padding, dilation, groups, mode, math)
        if data:
            y_shape = conv_output_shape(shape, second.shape, conv)  # shape is x's, second is w
        else:
            y_shape = conv_output_shape(first.shape, shape, conv)  # first is x, shape is w's
        check_scaling(alpha, beta, out)
        result = _output(out, shape, first)
        dy = first if data else second
        if dy.numel() == 0 or first.numel() == 0:  # a batch of 0: dx is empty, dw is zeros
            if tuple(dy.shape) != y_shape:
                raise bad_param("dy.shape", tuple(dy.shape), y_shape)
            return finish_empty(result, beta)
    else:
        check_scaling(alpha, beta, out)
        result = call.output(out, first)
    check_out_disjoint(out, **{names[0]: first, names[1]: second})
    # ConvTensors is (x, w, y): dx is the result of backward-data, dw of backward-filter.
    tensors = ConvTensors(result, second, first) if data else ConvTensors(first, result, second)
    if call is None:
        prepared = _prepare(
            direction, tensors, conv, algo, workspace_limit, deterministic, shape, first
        )
        call = _remember(key, prepared)
    _run(call, tensors, micro_batch, workspace_limit, alpha, beta, deterministic)
    return result


def conv_backward_bias(
    dy: torch.Tensor,
    *,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """db[k] = alpha * sum over n and every pixel of dy[n, k, ...] + beta * out[k].

    dy: (N, K, *O) with any strides. Returns db (K,) in dy's dtype (summed in float32).
    """
    dy = check_tensor("dy", dy, ndim=(3, 4, 5), empty=True)
    if out is not None:  # named as the caller knows them (reduce_tensor checks its "x" again)
        check_scaling(alpha, beta, out)
        check_out_disjoint(out, dy=dy)
    # The per-channel sum is a reduction like any other: float32 partial sums over slices of
    # the pixels and a fixed-order finish (deterministic), its launches prepared per shape.
    return reduce_tensor(
        dy, "add", (0, *range(2, dy.dim())), keepdim=False, alpha=alpha, beta=beta, out=out
    )


def _problem_for_selection(
    direction: str, x: torch.Tensor, w: torch.Tensor, stride, padding, dilation, groups, mode,
    math,
) -> tuple[ConvProblem, ConvTensors]:  # fmt: skip
    """The problem described by x and w in `direction`, and scratch tensors to run it on."""
    d = Direction.parse(direction)
    x, w = _check_operands("x", x, w)
    if x.numel() == 0:
        raise bad_param("x.shape", tuple(x.shape), "no zero-sized dimension")
    check_runnable(x.device)
    conv = _conv_desc(x.dim(), stride, padding, dilation, groups, mode, math)
    y = empty_like_layout(conv_output_shape(x.shape, w.shape, conv), x)
    # The caller's x and w are read; the direction's output gets a scratch tensor.
    scratch = ConvTensors(
        torch.empty_like(x) if d == Direction.BACKWARD_DATA else x,
        torch.empty_like(w) if d == Direction.BACKWARD_FILTER else w,
        y if d == Direction.FORWARD else torch.randn_like(y),
    )
    p = ConvProblem.create(
        d, TensorDesc.of(x), TensorDesc.of(w), TensorDesc.of(y), conv, x.device.type
    )
    return p, scratch


def plan_conv(
    x: torch.Tensor,
    w: torch.Tensor,
    *,
    direction: str = "forward",
    stride: IntOrSeq = 1,
    padding: IntOrSeq = 0,
    dilation: IntOrSeq = 1,
    groups: int = 1,
    mode: str = "cross_correlation",
    math: str | None = None,
    workspace_limit: int | None = None,
    policy: str = "all",
    deterministic: bool | None = None,
) -> Plan:
    """The fastest way to run this convolution in micro-batches within `workspace_limit` bytes.

    x (N, C, *S) and w give the shapes, strides, dtype and device; x's values are read, an
    output of the direction is scratch. Every algorithm is timed at every micro-batch size
    `policy` allows ("undivided": N only; "powerOfTwo": powers of two and N; "all": 1 to N),
    then a dynamic program over the batch picks the plan. Returns a Plan: `.micro_batches`, a
    list of (batch size, algorithm) adding up to N; `.time_ms`, their summed time; and
    `.workspace_bytes`, the most any of them needs (they share one buffer). The conv
    functions' `micro_batch=` runs such a plan. A limit below every workspace-using
    algorithm's need still gives a plan (some algorithm needs none). `deterministic` (None:
    torch.are_deterministic_algorithms_enabled()): of deterministic algorithms only.
    """
    check_policy("policy", policy)
    check_bytes("workspace_limit", workspace_limit)
    deterministic = resolve_deterministic(deterministic)
    p, scratch = _problem_for_selection(
        direction, x, w, stride, padding, dilation, groups, mode, math
    )
    return plan_for(p, scratch, policy, workspace_limit, deterministic)


def get_conv_algorithm(
    x: torch.Tensor,
    w: torch.Tensor,
    *,
    direction: str = "forward",
    stride: IntOrSeq = 1,
    padding: IntOrSeq = 0,
    dilation: IntOrSeq = 1,
    groups: int = 1,
    mode: str = "cross_correlation",
    math: str | None = None,
    preference: str = "fastest",
    workspace_limit: int | None = None,
    deterministic: bool | None = None,
) -> str:
    """The algorithm rtdnn would use for this convolution, without running anything.

    x and w give the shapes, strides, dtype and device (their values are not read).
    preference: "fastest" (within `workspace_limit` bytes, if given) or "no_workspace".
    Times measured by `find_conv_algorithms` for the same problem take precedence.
    `deterministic` (None: torch.are_deterministic_algorithms_enabled()): only among
    algorithms whose results repeat bit for bit.
    """
    deterministic = resolve_deterministic(deterministic)
    p, _ = _problem_for_selection(direction, x, w, stride, padding, dilation, groups, mode, math)
    return select.choose(p, preference, workspace_limit, deterministic).name


def find_conv_algorithms(
    x: torch.Tensor,
    w: torch.Tensor,
    *,
    direction: str = "forward",
    stride: IntOrSeq = 1,
    padding: IntOrSeq = 0,
    dilation: IntOrSeq = 1,
    groups: int = 1,
    mode: str = "cross_correlation",
    math: str | None = None,
    refresh: bool = False,
    deterministic: bool | None = None,
) -> list[select.AlgoPerf]:
    """Run every algorithm that supports this convolution; return them fastest first.

    Each entry has the algorithm name, its median time in ms, its workspace in bytes and
    whether it is deterministic. Later `algo="auto"` calls for the same problem use the result.
    Results are kept in the tuning database: a problem already measured in this environment
    (device, rtdnn, Triton and torch versions) is not run again unless `refresh` is True.
    `deterministic` (None: torch.are_deterministic_algorithms_enabled()): only the algorithms
    that are deterministic here are listed, those `algo="auto"` may then choose (every one is
    still run, so that the results also serve calls that allow the others).
    """
    if not isinstance(refresh, bool):
        raise bad_param("refresh", refresh, "True or False")
    deterministic = resolve_deterministic(deterministic)
    p, scratch = _problem_for_selection(
        direction, x, w, stride, padding, dilation, groups, mode, math
    )
    results = select.find(p, scratch, refresh=refresh)
    return [r for r in results if r.deterministic] if deterministic else results
