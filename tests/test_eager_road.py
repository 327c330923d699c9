"""The eager road of rtdnn.autograd's ops (direct calls and a torch.autograd.Function) against
the registered custom ops that tracing uses: the same outputs, gradients and running
statistics, and tracers still see the custom ops."""

import threading

import torch
from conftest import assert_close
from torch.fx.experimental.proxy_tensor import make_fx

from rtdnn import autograd
from rtdnn.core import handle
from rtdnn.core.handle import stream_scratch

CONV_ARGS = ([1, 1], [1, 1], [1, 1], 1, "cross_correlation")


def test_conv_eager_matches_custom_op_with_gradients():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 5, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, requires_grad=True)
    dy = torch.randn(2, 4, 5, 5)
    results = []
    for call in (autograd.conv_forward, autograd.conv_forward.op):
        y = call(x, w, None, *CONV_ARGS)
        results.append((y, *torch.autograd.grad(y, (x, w), dy)))
    for eager, custom in zip(*results, strict=True):
        assert torch.equal(eager, custom)
    with torch.no_grad():  # the direct call
        assert torch.equal(autograd.conv_forward(x, w, None, *CONV_ARGS), results[0][0])


def test_dispatcher_calls_without_gradient_skip_the_redispatch(monkeypatch):
    """What a torch.compile'd graph does: the op through the dispatcher on plain tensors with
    nothing for autograd to record runs the implementation from the autograd kernel (no
    redispatch below it); with a gradient to record, torch's autograd kernel runs."""
    torch.manual_seed(2)
    x = torch.randn(2, 3, 5, 5)
    w = torch.randn(4, 3, 3, 3)
    redispatches = []
    redispatch = torch._ops.OpOverload.redispatch

    def counted(self, *args, **kwargs):
        redispatches.append(self)
        return redispatch(self, *args, **kwargs)

    monkeypatch.setattr(torch._ops.OpOverload, "redispatch", counted)
    op = autograd.conv_forward.op
    plain = op(x, w, None, *CONV_ARGS)
    with torch.no_grad():
        no_grad = op(x, w.requires_grad_(), None, *CONV_ARGS)
    assert redispatches == []
    recorded = op(x, w, None, *CONV_ARGS)
    assert len(redispatches) == 1 and recorded.grad_fn is not None
    assert torch.equal(plain, no_grad) and torch.equal(plain, recorded.detach())
    # torch's kernel checked that no output aliases an input; the shortcut does not
    inputs = {t.untyped_storage().data_ptr() for t in (x, w)}
    assert plain.untyped_storage().data_ptr() not in inputs
    assert_close(plain, torch.nn.functional.conv2d(x.double(), w.double(), padding=1))


def test_dispatcher_calls_carry_no_forward_mode_tangent():
    """Dual tensors with nothing to record take the shortcut, which runs below autograd as
    torch's kernel does: no tangent leaks through the torch ops inside (the running mean's
    clone would give a wrong one, 1 where the true derivative is 1 - momentum)."""
    import torch.autograd.forward_ad as fwad

    torch.manual_seed(4)
    x = torch.randn(4, 3, 2, 2)
    with fwad.dual_level():
        running_mean = fwad.make_dual(torch.zeros(3), torch.ones(3))
        outs = autograd.batch_norm_train.op(
            x, None, None, None, running_mean, torch.ones(3), 0.1, 1e-5, "identity", False
        )
        assert all(fwad.unpack_dual(o).tangent is None for o in outs)


def test_dispatcher_calls_keep_no_scratch_buffer():
    """A compiled graph's call (the op through the dispatcher) allocates its scratch for itself:
    CUDA-graph trees refuse memory kept past a call in their pool. The eager call keeps it."""
    torch.manual_seed(3)
    x = torch.randn(4, 3, 2, 2)
    args = (None, None, None, 0.1, 1e-5, "identity", False)
    stats = [torch.zeros(3), torch.ones(3)]
    handle._scratch.clear()
    y = autograd.batch_norm_train.op(x, *args[:3], *stats, *args[3:])[0]
    assert handle._scratch == {}
    y_eager = autograd.batch_norm(x, *stats, training=True)
    assert handle._scratch != {}
    assert torch.equal(y, y_eager)


def test_batch_norm_training_updates_buffers_in_place_like_the_custom_op():
    torch.manual_seed(1)
    x = torch.randn(4, 3, 2, 2) * 3 + 1
    args = (None, None, None, 0.1, 1e-5, "identity", False)
    stats = [torch.zeros(3), torch.ones(3)]
    y, mean, invstd, new_rm, new_rv = autograd.batch_norm_train.op(x, *args[:3], *stats, *args[3:])
    y_eager = autograd.batch_norm(x, *stats, training=True)
    assert torch.equal(y_eager, y)
    assert_close(stats[0], new_rm.double())
    assert_close(stats[1], new_rv.double())


def test_tracing_records_the_custom_ops():
    x, w = torch.randn(1, 2, 4, 4), torch.randn(2, 2, 3, 3)
    graph = make_fx(lambda x, w: autograd.conv_forward(x, w, None, *CONV_ARGS))(x, w)
    targets = {str(n.target) for n in graph.graph.nodes if n.op == "call_function"}
    assert "rtdnn.conv_forward.default" in targets, targets


def test_scratch_buffers_are_reused_per_thread():
    """Ops keep scratch buffers between calls, one per (device, stream, host thread): reused
    and grown by one thread, never shared with another (whose kernels could interleave)."""
    device = torch.device("cpu")
    first = stream_scratch(device, "test", 10)
    assert stream_scratch(device, "test", 10) is first
    grown = stream_scratch(device, "test", first.numel() + 1)
    assert grown.numel() > first.numel()
    assert stream_scratch(device, "test", 10) is grown
    assert stream_scratch(device, "other", 10) is not grown
    seen = []
    worker = threading.Thread(target=lambda: seen.append(stream_scratch(device, "test", 10)))
    worker.start()
    worker.join()
    assert seen[0].data_ptr() != grown.data_ptr()
