"""Normalization on the GPU: every variant, forward and backward, in bfloat16, float16 and
float32 on moderately sized inputs, against the float64 reference (computed on the CPU).

Run this module on its own (`pytest tests/test_normalization_gpu.py`): the CPU test modules
turn Triton's interpreter on at import, which would make the kernels here interpreted too.
"""

import pytest
import torch
import torch.nn.functional as F
from conftest import gpu_only

import rtdnn
import rtdnn.nn as rnn
from rtdnn import reference as R

pytestmark = gpu_only()

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
#: Norm-wise relative error allowed: output rounding of the storage type, with margin.
TOL = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 2e-5}


def rand(shape, dtype, *, channels_last=False, shift=0.0, scale=1.0, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    if channels_last:
        shape = (shape[0], *shape[2:], shape[1])
    t = torch.randn(shape, generator=g, device="cuda", dtype=torch.float32) * scale + shift
    t = t.to(dtype)
    return t.movedim(-1, 1) if channels_last else t


def check(out, ref, dtype, factor=1.0, floor=0.0, what=""):
    out64, ref64 = out.detach().double().cpu(), ref.detach().double().cpu()
    assert torch.isfinite(out64).all(), f"{what}: non-finite values"
    err = float((out64 - ref64).norm()) / max(float(ref64.norm()), floor, 1e-300)
    assert err <= TOL[dtype] * factor, f"{what}: rel. error {err:.2e} > {TOL[dtype] * factor:.1e}"


def term_size(dy, rstd, w=None):
    s = float(dy.double().norm()) * float(rstd.max())
    return s * (float(w.abs().max()) if w is not None else 1.0)


BN_SHAPES = [(16, 64, 28, 28), (8, 256, 14, 14), (4, 32, 9, 10, 11), (64, 96)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", BN_SHAPES)
@pytest.mark.parametrize("channels_last", [True, False])
def test_batch_norm(dtype, shape, channels_last):
    cl = channels_last and len(shape) > 2
    x = rand(shape, dtype, channels_last=cl, shift=0.5, scale=2.0)
    c = shape[1]
    w, b = rand((c,), torch.float32, seed=1), rand((c,), torch.float32, seed=2)
    rm, rv = torch.zeros(c, device="cuda"), torch.ones(c, device="cuda")
    y, mean, invstd = rtdnn.batch_norm_forward_training(
        x, w, b, running_mean=rm, running_var=rv, momentum=0.2
    )
    ref = R.batch_norm_forward_training(
        x, w, b, running_mean=torch.zeros(c), running_var=torch.ones(c), momentum=0.2
    )
    assert y.stride() == x.stride()
    check(y, ref[0], dtype, what="y")
    check(mean, ref[1], torch.float32, factor=10, what="mean")
    check(invstd, ref[2], torch.float32, factor=10, what="invstd")
    check(rm, ref[3], torch.float32, factor=10, what="running_mean")
    check(rv, ref[4], torch.float32, factor=10, what="running_var")
    yi = rtdnn.batch_norm_forward_inference(x, w, b, rm, rv)
    check(yi, R.batch_norm_forward_inference(x, w, b, rm, rv), dtype, what="inference")
    dy = rand(shape, dtype, channels_last=cl, seed=3)
    got = rtdnn.batch_norm_backward(dy, x, mean, invstd, w, b)
    want = R.batch_norm_backward(dy, x, mean, invstd, w, b)
    check(got[0], want[0], dtype, factor=2, floor=term_size(dy, invstd, w), what="dx")
    check(got[1], want[1], torch.float32, factor=50, what="dweight")
    check(got[2], want[2], torch.float32, factor=50, what="dbias")


@pytest.mark.parametrize("activation", ["relu", "silu", "hardswish"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_batch_norm_add_activation(dtype, activation):
    shape = (16, 128, 14, 14)
    x = rand(shape, dtype, channels_last=True)
    z = rand(shape, dtype, channels_last=True, seed=1)
    w, b = rand((128,), torch.float32, seed=2), rand((128,), torch.float32, seed=3)
    args = dict(z=z, activation=activation)
    y, mean, invstd = rtdnn.batch_norm_forward_training(x, w, b, **args)
    ref = R.batch_norm_forward_training(x, w, b, **args)
    check(y, ref[0], dtype, what="y")
    dy = rand(shape, dtype, channels_last=True, seed=4)
    got = rtdnn.batch_norm_backward(dy, x, mean, invstd, w, b, **args)
    want = R.batch_norm_backward(dy, x, mean, invstd, w, b, **args)
    # Where the pre-activation is within rounding of 0 the two sides may pick different
    # sides of the relu: a few elements, hence the wider bound.
    check(got[0], want[0], dtype, factor=5, floor=term_size(dy, invstd, w), what="dx")
    check(got[1], want[1], torch.float32, factor=100, what="dweight")
    check(got[2], want[2], torch.float32, factor=100, what="dbias")
    check(got[3], want[3], dtype, factor=5, what="dz")
    # eps must be > 0; 1e-30 vanishes next to the variance in float32.
    yi = rtdnn.batch_norm_forward_inference(x, w, b, mean, invstd**-2, eps=1e-30, **args)
    check(yi, y, dtype, factor=2, what="inference with the batch statistics")


@pytest.mark.parametrize("dtype", DTYPES)
def test_batch_norm_per_activation(dtype):
    x = rand((64, 16, 7, 7), dtype, channels_last=True)
    w = rand((16, 7, 7), torch.float32, seed=1)
    y, mean, invstd = rtdnn.batch_norm_forward_training(x, w, mode="per_activation")
    ref = R.batch_norm_forward_training(x, w, mode="per_activation")
    check(y, ref[0], dtype, what="y")
    dy = rand(x.shape, dtype, seed=2)
    got = rtdnn.batch_norm_backward(dy, x, mean, invstd, w, mode="per_activation")
    want = R.batch_norm_backward(dy, x, mean, invstd, w, mode="per_activation")
    check(got[0], want[0], dtype, factor=2, floor=term_size(dy, invstd, w), what="dx")
    check(got[1], want[1], torch.float32, factor=50, what="dweight")


ROW_CASES = [((512, 768), (768,)), ((256, 2048), (2048,)), ((64, 4096), (4096,)),
             ((16, 40000), (40000,)), ((4, 3, 8, 64), (8, 64)),
             ((3, 100000), (100000,))]  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, norm", ROW_CASES)
def test_layer_and_rms_norm(dtype, shape, norm):
    x = rand(shape, dtype, shift=1.0)
    w, b = rand(norm, dtype, seed=1), rand(norm, dtype, seed=2)
    dy = rand(shape, dtype, seed=3)
    y, mean, rstd = rtdnn.layer_norm_forward(x, norm, w, b)
    ref = R.layer_norm_forward(x, norm, w, b)
    check(y, ref[0], dtype, what="layer y")
    check(rstd, ref[2], torch.float32, factor=10, what="layer rstd")
    got = rtdnn.layer_norm_backward(dy, x, norm, mean, rstd, w)
    want = R.layer_norm_backward(dy, x, norm, mean, rstd, w)
    check(got[0], want[0], dtype, factor=2, floor=term_size(dy, rstd, w), what="layer dx")
    check(got[1], want[1], dtype, factor=5, what="layer dweight")
    check(got[2], want[2], dtype, factor=5, what="layer dbias")
    y, rstd = rtdnn.rms_norm_forward(x, norm, w, eps=1e-6)
    ref = R.rms_norm_forward(x, norm, w, eps=1e-6)
    check(y, ref[0], dtype, what="rms y")
    got = rtdnn.rms_norm_backward(dy, x, norm, rstd, w)
    want = R.rms_norm_backward(dy, x, norm, rstd, w)
    check(got[0], want[0], dtype, factor=2, floor=term_size(dy, rstd, w), what="rms dx")
    check(got[1], want[1], dtype, factor=5, what="rms dweight")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("channels_last", [True, False])
@pytest.mark.parametrize("shape, groups", [((8, 64, 16, 16), 8), ((4, 32, 20, 20), 32),
                                           ((2, 16, 4, 8, 8), 4)])  # fmt: skip
def test_group_and_instance_norm(dtype, channels_last, shape, groups):
    x = rand(shape, dtype, channels_last=channels_last, shift=0.5)
    c = shape[1]
    w, b = rand((c,), torch.float32, seed=1), rand((c,), torch.float32, seed=2)
    dy = rand(shape, dtype, channels_last=channels_last, seed=3)
    y, mean, rstd = rtdnn.group_norm_forward(x, groups, w, b)
    ref = R.group_norm_forward(x, groups, w, b)
    check(y, ref[0], dtype, what="y")
    got = rtdnn.group_norm_backward(dy, x, groups, mean, rstd, w)
    want = R.group_norm_backward(dy, x, groups, mean, rstd, w)
    check(got[0], want[0], dtype, factor=2, floor=term_size(dy, rstd, w), what="dx")
    check(got[1], want[1], torch.float32, factor=50, what="dweight")
    check(got[2], want[2], torch.float32, factor=50, what="dbias")
    y, mean, rstd = rtdnn.instance_norm_forward(x, w, b)
    check(y, R.instance_norm_forward(x, w, b)[0], dtype, what="instance y")
    got = rtdnn.instance_norm_backward(dy, x, mean, rstd, w)
    want = R.instance_norm_backward(dy, x, mean, rstd, w)
    check(got[0], want[0], dtype, factor=2, floor=term_size(dy, rstd, w), what="instance dx")


def test_large_mean_small_variance_float32():
    x = rand((32, 64, 16, 16), torch.float32, channels_last=True, shift=1e3)
    # eps must be > 0; 1e-30 vanishes next to the variance in float32.
    y, mean, invstd = rtdnn.batch_norm_forward_training(x, eps=1e-30)
    ref = R.batch_norm_forward_training(x, eps=1e-30)
    assert R.rel_error(invstd.double() ** -2, ref[2] ** -2) < 1e-5
    assert R.rel_error(y, ref[0]) < 2e-6
    x = rand((64, 4096), torch.float32, shift=1e3)
    y, mean, rstd = rtdnn.layer_norm_forward(x, 4096, eps=1e-30)
    ref = R.layer_norm_forward(x, 4096, eps=1e-30)
    assert R.rel_error(rstd.double() ** -2, ref[2] ** -2) < 1e-5
    assert R.rel_error(y, ref[0]) < 2e-6


def test_deterministic_and_prepared_launches_agree():
    x = rand((32, 256, 14, 14), torch.bfloat16, channels_last=True)
    dy = rand(x.shape, torch.bfloat16, channels_last=True, seed=1)
    runs = [rtdnn.batch_norm_forward_training(x) for _ in range(3)]
    grads = [rtdnn.batch_norm_backward(dy, x, runs[0][1], runs[0][2]) for _ in range(3)]
    for r in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], r, strict=True))
    for g in grads[1:]:
        assert all(torch.equal(a, b) for a, b in zip(grads[0][:3], g[:3], strict=True))
    x = rand((1024, 768), torch.bfloat16)
    dy = rand(x.shape, torch.bfloat16, seed=2)
    w = rand((768,), torch.bfloat16, seed=3)
    outs = [rtdnn.layer_norm_forward(x, 768, w) for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(*outs, strict=True))
    grads = [rtdnn.layer_norm_backward(dy, x, 768, outs[0][1], outs[0][2], w) for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))


def _dependent_chain(x, w, g, dy):
    """Ops that each read what the one before wrote, issued with no host synchronization:
    every pass of every op must see what the kernel before it wrote."""
    y, mean, invstd = rtdnn.batch_norm_forward_training(x, w)
    dx, dw, _ = rtdnn.batch_norm_backward(g, x, mean, invstd, w)[:3]
    rows = dx.movedim(1, -1).reshape(-1, dx.shape[1] * dx.shape[3])  # channels-last rows
    z, lmean, lrstd = rtdnn.layer_norm_forward(rows, rows.shape[1])
    dz = rtdnn.layer_norm_backward(dy, z, rows.shape[1], lmean, lrstd)[0]
    return y, dx, dw, z, dz


def _reference_chain(x, w, g, dy):
    y, mean, invstd = R.batch_norm_forward_training(x, w)[:3]
    dx, dw, _ = R.batch_norm_backward(g, x, mean, invstd, w)[:3]
    rows = dx.movedim(1, -1).reshape(-1, dx.shape[1] * dx.shape[3])
    z, lmean, lrstd = R.layer_norm_forward(rows, rows.shape[1])
    dz = R.layer_norm_backward(dy, z, rows.shape[1], lmean, lrstd)[0]
    return y, dx, dw, z, dz


def test_dependent_launches_back_to_back_and_in_a_cuda_graph():
    """A chain of normalizations, each reading the previous one's result, run back to back and
    then replayed from a CUDA graph on fresh inputs, against the float64 reference."""
    x = rand((16, 64, 10, 10), torch.float32, channels_last=True, shift=2.0)
    w = rand((64,), torch.float32, seed=1) + 2.0
    g = rand(x.shape, torch.float32, channels_last=True, seed=2)
    dy = rand((16 * 10, 10 * 64), torch.float32, seed=3)
    names = ("bn y", "bn dx", "bn dweight", "ln y", "ln dx")
    factors = (5, 20, 20, 20, 50)  # each step's rounding is amplified by the next

    def compare(got, x, dy):
        want = _reference_chain(x, w, g, dy)
        for name, f, a, b in zip(names, factors, got, want, strict=True):
            check(a, b, torch.float32, factor=f, what=name)

    compare(_dependent_chain(x, w, g, dy), x, dy)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        _dependent_chain(x, w, g, dy)  # warm-up: prepared launches and scratch buffers
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = _dependent_chain(x, w, g, dy)
    for seed in (4, 5):
        x.copy_(rand(x.shape, torch.float32, channels_last=True, shift=-1.0, seed=seed))
        dy.copy_(rand(dy.shape, torch.float32, seed=seed + 10))
        for o in outs:
            o.fill_(float("nan"))
        graph.replay()
        compare(outs, x, dy)


@pytest.mark.parametrize("momentum", [0.1, None])
def test_batch_norm_module_matches_torch_over_steps(momentum):
    theirs = torch.nn.BatchNorm2d(32, momentum=momentum).cuda()
    ours = rnn.BatchNorm2d(32, momentum=momentum).cuda()
    with torch.no_grad():
        theirs.weight.copy_(rand((32,), torch.float32, seed=1))
        theirs.bias.copy_(rand((32,), torch.float32, seed=2))
    ours.load_state_dict(theirs.state_dict())
    for step in range(4):
        x = rand((8, 32, 12, 12), torch.float32, channels_last=True, shift=step, seed=step)
        xo, xt = x.clone().requires_grad_(), x.clone().requires_grad_()
        yo, yt = ours(xo), theirs(xt)
        dy = rand(x.shape, torch.float32, seed=10 + step)
        yo.backward(dy)
        yt.backward(dy)
        check(yo, yt, torch.float32, factor=5, what=f"y step {step}")
        check(xo.grad, xt.grad, torch.float32, factor=20, what=f"dx step {step}")
    check(ours.running_mean, theirs.running_mean, torch.float32, factor=5)
    check(ours.running_var, theirs.running_var, torch.float32, factor=5)
    assert int(ours.num_batches_tracked) == 4
    ours.eval()
    theirs.eval()
    x = rand((8, 32, 12, 12), torch.float32, seed=30)
    with torch.no_grad():
        check(ours(x), theirs(x), torch.float32, factor=5, what="eval")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_modules_in_half_precision(dtype):
    x = rand((4, 16, 8, 8), dtype, channels_last=True, shift=0.5).requires_grad_()
    for ours, theirs in [
        (rnn.BatchNorm2d(16), torch.nn.BatchNorm2d(16)),
        (rnn.GroupNorm(4, 16), torch.nn.GroupNorm(4, 16)),
        (rnn.InstanceNorm2d(16, affine=True), torch.nn.InstanceNorm2d(16, affine=True)),
    ]:
        ours, theirs = ours.cuda().to(dtype), theirs.cuda().to(dtype)
        y = ours(x)
        ref = theirs(x.detach().float().requires_grad_().to(dtype))
        check(y, ref, dtype, factor=2, what=type(ours).__name__)
        y.float().square().sum().backward()
        assert ours.weight.grad.dtype == dtype
    ln = rnn.LayerNorm(64).cuda().to(dtype)
    h = rand((32, 64), dtype, seed=5)
    check(ln(h), F.layer_norm(h.float(), (64,)), dtype, what="LayerNorm")


@pytest.mark.parametrize("shape", [(64, 256, 28, 28), (32, 2048, 7, 7), (8, 64, 112, 112)])
@pytest.mark.parametrize("activation", ["identity", "relu"])
def test_batch_norm_passes_run_as_one_cooperative_launch(monkeypatch, shape, activation):
    """Batch norm's split passes, each direction one cooperative launch with a grid barrier
    between its passes (ResNet-50's shapes; ReLU and a residual recomputed in backward), run
    three times (the barrier's counters must be zero again after each launch), against the
    float64 reference: and it is the fused kernel that ran, not the separate passes."""
    from rtdnn.kernels import launch

    ran = []
    call = launch.SlotLaunch.__call__

    def recorded(self, *values):
        ran.append(self.fn.__name__)
        return call(self, *values)

    monkeypatch.setattr(launch.SlotLaunch, "__call__", recorded)
    dtype = torch.bfloat16
    x = rand(shape, dtype, channels_last=True, shift=0.5, scale=2.0)
    z = rand(shape, dtype, channels_last=True, seed=3)
    dy = rand(shape, dtype, channels_last=True, seed=4)
    c = shape[1]
    w, b = rand((c,), torch.float32, seed=1), rand((c,), torch.float32, seed=2)
    args = dict(z=z, activation=activation)
    ref = R.batch_norm_forward_training(x, w, b, **args)
    for _ in range(3):
        ran.clear()
        rm, rv = torch.zeros(c, device="cuda"), torch.ones(c, device="cuda")
        y, mean, invstd = rtdnn.batch_norm_forward_training(
            x, w, b, running_mean=rm, running_var=rv, **args
        )
        got = rtdnn.batch_norm_backward(dy, x, mean, invstd, w, b, **args)
        assert ran == ["norm_stats_apply_kernel", "norm_bwd_fused_kernel"], ran
        check(rm, 0.1 * ref[1], torch.float32, factor=10, what="running mean")
        check(y, ref[0], dtype, what="y")
        check(mean, ref[1], torch.float32, factor=10, what="mean")
        check(invstd, ref[2], torch.float32, factor=10, what="invstd")
        want = R.batch_norm_backward(dy, x, mean, invstd, w, b, **args)
        # A pre-activation within rounding of 0 may take either side of the ReLU.
        check(got[0], want[0], dtype, factor=5, floor=term_size(dy, invstd, w), what="dx")
        check(got[1], want[1], torch.float32, factor=100, what="dweight")
        check(got[2], want[2], torch.float32, factor=100, what="dbias")
        check(got[3], want[3], dtype, factor=5, what="dz")
