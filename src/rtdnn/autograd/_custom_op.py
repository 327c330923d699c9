"""The custom-op machinery every family module uses: rtdnn primitives as torch.library custom
ops with autograd and fake (meta) kernels, so they work under autograd and torch.compile
traces them without graph breaks.

The ops are functional (no alpha, beta or out): those belong to the plain API in rtdnn.ops.

Eager calls take a shorter road. Going through the dispatcher costs a custom op tens of
microseconds per call, more than many of these kernels take on the GPU, so on plain tensors
outside any tracing each op runs its implementation directly, or, when an input needs a
gradient, through a torch.autograd.Function built from the same forward, setup_context and
backward. Under torch.compile, fake tensors, tensor subclasses or dispatch modes the call goes
through the registered custom op, so traced graphs hold rtdnn::* ops.

Inductor runs these ops as they are (fallback kernels): they are registered as such when a trace
first meets one of them with Inductor loaded, before Inductor lowers the graph (see
lower_as_fallbacks). A compiled graph then calls each op through the dispatcher with plain
tensors and no gradient to record (AOTAutograd runs its forward and backward graphs in no-grad
mode); the op's autograd kernel sends such calls straight to the implementation, which spares
two Python kernels and a redispatch per call (see shortcut_untracked_calls).
"""

from __future__ import annotations

import functools
import sys
import threading
import warnings

import torch
from torch import Tensor
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

from ..core import BadParamError, check_scaling
from ..core.handle import call_with_transient_scratch

_unwrap_if_dead = torch._C._functorch.unwrap_if_dead

#: The name of every rtdnn custom op ("rtdnn::conv_forward", ...), for lower_as_fallbacks.
OP_NAMES: list[str] = []
_lowered: set[str] = set()  # the names lower_as_fallbacks has dealt with
_lowering_lock = threading.Lock()


def lower_as_fallbacks() -> None:
    """Once Inductor is loaded, tell it to run each rtdnn op not yet told as it is (a fallback
    kernel), with the stride constraint it gives by default to a custom op it has no lowering
    for (the eager strides, or their order, by torch version).

    It must be told beforehand because on meeting such an op Inductor (torch 2.11) first
    formats a log line with each argument's whole IR history, which grows exponentially with
    a network's depth where residual branches join: compiling a converted ResNet-50 did not
    finish in five minutes (later torch versions format it only when the log is on). The ops'
    fake kernels call this: Inductor traces them (through AOTAutograd) before it lowers the
    graph, and has loaded its lowering module by then. Where torch's private helpers are
    missing or refuse, Inductor is left to its own road, slow but right: this never fails a
    trace."""
    lowering = sys.modules.get("torch._inductor.lowering")
    if lowering is None or len(_lowered) >= len(OP_NAMES):
        return
    with _lowering_lock:
        for name in OP_NAMES:
            if name in _lowered:
                continue
            _lowered.add(name)
            try:
                _register_fallback(lowering, name)
            except Exception:  # it only spares Inductor a slow road: never fail a trace
                pass


def _register_fallback(lowering, name: str) -> None:
    """Every overload of the rtdnn op `name` as an Inductor fallback (see lower_as_fallbacks)."""
    from torch._library.utils import get_layout_constraint_tag

    packet = getattr(torch.ops.rtdnn, name.removeprefix("rtdnn::"))
    for overload in packet.overloads():
        op = getattr(packet, overload)
        if op not in lowering.lowerings:
            tag = get_layout_constraint_tag(op, with_default=True)
            lowering.make_fallback(op, lowering.tag_to_layout_constraint(tag), warn=False)


#: Argument types that are never tensors (CustomOp.__call__ skips them; isinstance against
#: Tensor costs a tenth of a microsecond, and a convolution has a dozen such arguments).
_PLAIN_ARGUMENTS = frozenset({int, float, bool, str, type(None), list, tuple})

#: Dispatch keys below autograd of a call on plain tensors (no tracing, mode or subclass).
_PLAIN_BACKENDS = (torch._C.DispatchKey.CUDA, torch._C.DispatchKey.CPU)


def shortcut_untracked_calls(op, fn) -> None:
    """Replace the autograd kernel torch.library gave the custom op `op` (a CustomOpDef of
    `fn`) by one that runs `fn` itself when autograd has nothing to record and the tensors
    are plain CUDA or CPU tensors, and torch's kernel otherwise.

    torch's kernel redispatches below autograd to a second Python kernel, which checks the
    outputs for aliasing and then calls `fn`: about 20 us more per call on the host (27 against
    8 us for a convolution, CPU), milliseconds in a compiled ResNet-50's step of 130 calls.
    Everything traced (fake tensors, functionalization, dispatch modes, subclasses) shows
    another key above the backend, and any gradient to record takes torch's road, so only the
    plain eager call is shortened.
    torch's private helper, or the replacement itself, failing leaves torch's kernel in place.

    Such a call keeps no scratch buffer (core.handle.call_with_transient_scratch): it comes
    from a compiled graph, which CUDA-graph trees may be recording. Nor does any other call
    that reaches the CUDA or CPU kernel through the dispatcher (in inference mode, which skips
    the autograd kernel, below torch's autograd kernel, or an eager call sent through the
    dispatcher by a mode such as `with torch.device(...)`: those allocate per call).

    torch's CUDA and CPU kernel also checked that no output aliases an input; rtdnn's ops
    return new tensors, which tests/test_eager_road.py checks for the ops it calls.
    """
    try:
        from torch._library.autograd import make_autograd_impl

        torch_kernel = make_autograd_impl(op._opoverload, op)
        below_autograd = torch._C._after_autograd_keyset
    except Exception:
        return
    is_grad_enabled, any_requires_grad = torch._C.is_grad_enabled, torch._C._any_requires_grad
    below_autograd_guard = torch._C._AutoDispatchBelowAutograd

    def autograd_kernel(keyset, *args, **kwargs):
        if (keyset & below_autograd).highestPriorityTypeId() in _PLAIN_BACKENDS and not (
            is_grad_enabled() and any_requires_grad(*args)
        ):
            # Below autograd, as torch's kernel runs it: forward-mode tangents (dual tensors)
            # must not flow through the torch ops inside fn.
            with below_autograd_guard():
                return call_with_transient_scratch(fn, *args, **kwargs)
        return torch_kernel(keyset, *args, **kwargs)

    def backend_kernel(*args, **kwargs):
        return call_with_transient_scratch(fn, *args, **kwargs)

    with warnings.catch_warnings():  # "overriding a previously registered kernel": on purpose
        warnings.simplefilter("ignore")
        try:
            # allow_override: torch 2.11 refuses a second Python kernel for a key without it.
            op._lib.impl(
                op._name, autograd_kernel, "Autograd", with_keyset=True, allow_override=True
            )
            for device in ("CUDA", "CPU"):
                op._lib.impl(op._name, backend_kernel, device, allow_override=True)
        except Exception:
            pass


class CustomOp:
    """A torch.library custom op (functional, no mutated arguments) with an eager fast path.

    Use as a decorator like torch.library.custom_op; `register_fake` and `register_autograd`
    take the same arguments as CustomOpDef's.
    """

    def __init__(self, name: str, fn):
        self.fn = fn
        self.eager = fn
        self.op = torch.library.custom_op(name, mutates_args=())(fn)
        shortcut_untracked_calls(self.op, fn)
        OP_NAMES.append(name)
        self.function: type[torch.autograd.Function] | None = None
        functools.update_wrapper(self, fn)

    def register_eager(self, eager) -> None:
        """Run `eager` instead of the op's function on the eager road: the same results, but it
        may also update some inputs in place (what a functional op cannot), and leave off
        trailing outputs that stand in for nothing there (e.g. empty tensors where the op has
        no tensor to return; the op's callers must accept the shorter tuple)."""
        if self.function is not None:
            raise RuntimeError(f"{self.fn.__name__}: register_eager before register_autograd")
        self.eager = eager

    def register_fake(self, fake):
        @functools.wraps(fake)
        def fake_for_inductor(*args, **kwargs):
            lower_as_fallbacks()
            return fake(*args, **kwargs)

        return self.op.register_fake(fake_for_inductor)

    def register_autograd(self, backward, *, setup_context) -> None:
        self.op.register_autograd(backward, setup_context=setup_context)
        eager = self.eager

        # forward(ctx, ...) rather than a separate setup_context: Function.apply binds the
        # arguments with inspect.signature on every call when setup_context is overridden.
        def forward(ctx, *args):
            # Gradients of unused outputs stay None instead of tensors of zeros: the backward
            # formulas read only the first output's gradient (the others are statistics).
            ctx.set_materialize_grads(False)
            ctx.num_inputs = len(args)
            output = eager(*args)
            setup_context(ctx, args, output)
            return output

        def backward_or_none(ctx, *grads):
            if grads[0] is None:  # no gradient reached the main output: nothing to propagate
                return (None,) * ctx.num_inputs
            return backward(ctx, *grads)

        self.function = type(
            f"{self.fn.__name__}_function",
            (torch.autograd.Function,),
            {"forward": staticmethod(forward), "backward": staticmethod(backward_or_none)},
        )
        # Function.apply's own entry point, in C. The Python classmethod around it adds what
        # these Functions do not need on the eager road (setup_context binding, functorch
        # transforms, which __call__ checks) at about a microsecond per call.
        self.apply = torch._C._FunctionBase.__dict__["apply"].__get__(None, self.function)

    def __call__(self, *args):
        # One pass over the arguments: a tensor subclass (FakeTensor, FunctionalTensor, a
        # user's) sends the call through the dispatcher, as tracing and dispatch modes do.
        needs_grad = False
        for a in args:
            kind = type(a)
            if kind in _PLAIN_ARGUMENTS:  # most arguments: a set lookup, not an isinstance
                continue
            if kind is Tensor or kind is torch.nn.Parameter:
                needs_grad = needs_grad or a.requires_grad
            elif isinstance(a, Tensor):
                return self.op(*args)
        if _traced_or_in_mode():
            return self.op(*args)
        if needs_grad and self.function is not None and torch.is_grad_enabled():
            # A tensor left over from a finished torch.func transform (a "dead wrapper") goes
            # through Function.apply, which unwraps it; only a call autograd records looks.
            if torch._C._are_functorch_transforms_active() or any(
                _unwrap_if_dead(a) is not a for a in args if isinstance(a, Tensor)
            ):
                return self.function.apply(*args)
            return self.apply(*args)
        return self.eager(*args)


def runs_eager(*tensors) -> bool:
    """Whether CustomOp.__call__ would run an op's eager function on these tensors (None
    allowed) with nothing for autograd to record: grad mode off, plain tensors, no tracing
    or mode. A backward that calls several ops asks once and then calls their eager roads."""
    if torch.is_grad_enabled():
        return False
    for t in tensors:
        if t is not None and type(t) is not Tensor and type(t) is not torch.nn.Parameter:
            return False
    return not _traced_or_in_mode()


def _traced_or_in_mode() -> bool:
    """Whether torch.compile is tracing or a torch-function or dispatch mode is active: calls
    then go through the dispatcher (the registered op), never an eager road."""
    return (
        torch.compiler.is_compiling()
        or torch._C._is_torch_function_mode_enabled()
        or is_in_torch_dispatch_mode()
    )


def custom_op(name: str):
    """Decorator: `fn` as the custom op `name` with an eager fast path (see CustomOp)."""
    return functools.partial(CustomOp, name)


# -- helpers shared by the family modules ------------------------------------------------------


def _like(x: Tensor) -> Tensor:
    """What the ops allocate for an elementwise result: torch.empty_like's layout."""
    return torch.empty_like(x)


def _nothing(x: Tensor) -> Tensor:
    """An empty tensor where a custom op has no tensor to return (custom ops return tensors)."""
    return x.new_empty(0)


# -- the public functions -----------------------------------------------------------------------
# rtdnn's top level exports, for each plain forward function of rtdnn.ops, a function of the same
# signature defined in the family's module here (named <plain name>_api there, as the custom op
# has the plain name). Called on tensors that need no gradient (or in no-grad mode) it is the
# plain function; when autograd must record the call it runs the family's custom op, so the
# result has the same backward as the modules'. out= and beta (which accumulate into a tensor
# the caller owns) are refused then, as torch refuses out= with grad.


def records_grad(*args) -> bool:
    """True when autograd records a call on `args`: grad mode is on and a tensor among them
    requires grad (None and non-tensors do not)."""
    if not torch.is_grad_enabled():
        return False
    for a in args:
        if isinstance(a, Tensor) and a.requires_grad:
            return True
    return False


def check_differentiable(fn: str, alpha: float, beta: float, out: Tensor | None) -> None:
    """The call of `fn` is recorded by autograd: the plain checks of alpha and beta (beta != 0
    needs out), then out refused, as torch refuses out= arguments that require grad."""
    check_scaling(alpha, beta, out)
    if out is not None:
        raise BadParamError(
            f"{fn}(): out=... arguments don't support automatic differentiation, but one of the "
            "arguments requires grad (call it without out and beta, or under torch.no_grad())"
        )


def in_place_error(fn: str, written: str) -> BadParamError:
    """`fn` writes `written` in place behind autograd's back: the error when autograd records."""
    return BadParamError(
        f"{fn}() writes {written} in place, which autograd cannot record, but one of the "
        "arguments requires grad (call it under torch.no_grad(), or use op_tensor, which is "
        "differentiable)"
    )


def scaled(y: Tensor, alpha: float) -> Tensor:
    """alpha * y, differentiable; y itself when alpha is 1 (the custom ops take no alpha)."""
    return y if alpha == 1 else y * alpha


def public(plain, *, in_place: bool = False, stats: bool = False):
    """Decorator: the differentiable version of the plain function `plain`, which rtdnn exports
    under plain's name (and pickles as rtdnn.<name>), with plain's docstring and a note.
    in_place: `plain` writes an argument in place, so the version refuses recorded calls.
    stats: `plain` also returns statistics, which the version returns detached."""

    def wrap(fn):
        fn.__name__ = fn.__qualname__ = plain.__name__
        fn.__module__ = "rtdnn"
        note = _IN_PLACE_NOTE if in_place else _NOTE
        if stats:
            note = note.rstrip() + _STATS_NOTE
        fn.__doc__ = (plain.__doc__ or "").rstrip() + note.format(name=plain.__name__)
        return fn

    return wrap


_NOTE = """

    Differentiable: when an input requires grad (and grad mode is on) the call runs the custom
    op the rtdnn.nn modules use, and its result carries autograd; out= and beta != 0 then raise
    BadParamError. rtdnn.ops.{name} is the plain primitive without autograd.
    """

_IN_PLACE_NOTE = """

    Not differentiable (it writes in place): when an input requires grad and grad mode is on it
    raises BadParamError. rtdnn.ops.{name} is the plain primitive.
    """

_STATS_NOTE = """ The statistics it returns take no
    gradient: they come back detached.
    """
