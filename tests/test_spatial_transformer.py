"""Spatial transformer (affine_grid, grid_sample): values and gradients against torch's float64
implementation, every padding mode and align_corners setting, 2-D and 3-D, layouts, dtypes."""

import itertools

import pytest
import torch
from conftest import assert_close, make_tensor

import rtdnn
from rtdnn import reference
from rtdnn.ops import spatial_transformer as st

PADDINGS = ("zeros", "border", "reflection")
SHAPES = {2: ((2, 3, 5, 6), (4, 3)), 3: ((2, 2, 3, 4, 5), (2, 3, 2))}


def _grid(n, out_sp, dims, dtype=torch.float32, layout="contiguous"):
    # Beyond [-1, 1], so every padding mode has points to move.
    g = (torch.rand(n, *out_sp, dims) * 2.6 - 1.3).to(dtype)
    if layout == "strided":
        base = torch.full((n, *out_sp, 2 * dims), float("nan"), dtype=dtype)
        view = base[..., ::2]
        view.copy_(g)
        return view
    return g


def _ref_grads(x, grid, dy, mode, padding, align):
    x64 = x.double().requires_grad_()
    g64 = grid.double().requires_grad_()
    y = reference.grid_sample(x64, g64, mode, padding, align)
    y.backward(dy.double())
    return y.detach(), x64.grad, g64.grad


@pytest.mark.parametrize("dims", (2, 3))
@pytest.mark.parametrize("align", (False, True))
@pytest.mark.parametrize("padding", PADDINGS)
def test_bilinear_values_and_gradients(dims, padding, align):
    x_shape, out_sp = SHAPES[dims]
    x = make_tensor(x_shape, torch.float32)
    grid = _grid(x_shape[0], out_sp, dims)
    y = st.grid_sample(x, grid, "bilinear", padding, align)
    dy = torch.randn(y.shape)
    y_ref, dx_ref, dg_ref = _ref_grads(x, grid, dy, "bilinear", padding, align)
    assert_close(y, y_ref)
    dx, dg = st.grid_sample_backward(dy, x, grid, "bilinear", padding, align)
    assert_close(dx, dx_ref)
    assert_close(dg, dg_ref)


@pytest.mark.parametrize("dims", (2, 3))
@pytest.mark.parametrize("padding", PADDINGS)
def test_nearest(dims, padding):
    x_shape, out_sp = SHAPES[dims]
    x = make_tensor(x_shape, torch.float32)
    grid = _grid(x_shape[0], out_sp, dims)
    y = st.grid_sample(x, grid, "nearest", padding, False)
    dy = torch.randn(y.shape)
    y_ref, dx_ref, dg_ref = _ref_grads(x, grid, dy, "nearest", padding, False)
    assert_close(y, y_ref)
    dx, dg = st.grid_sample_backward(dy, x, grid, "nearest", padding, False)
    assert_close(dx, dx_ref)
    assert torch.equal(dg, torch.zeros_like(dg)) and torch.equal(dg_ref, torch.zeros_like(dg_ref))


def test_rounding_ties_go_to_even_as_torch():
    x = make_tensor((1, 1, 1, 5), torch.float32)
    # align_corners=True on width 5: the coordinate is 2 * grid + 2, so these are exact ties
    # 0.5, 1.5, 2.5, 3.5, which round to 0, 2, 2, 4.
    cols = torch.tensor([-0.75, -0.25, 0.25, 0.75])
    grid = torch.stack([cols, torch.zeros(4)], -1).view(1, 1, 4, 2)
    y = st.grid_sample(x, grid, "nearest", "zeros", True)
    assert torch.equal(y.view(4), x.view(5)[[0, 2, 2, 4]])
    assert torch.equal(y, reference.grid_sample(x, grid, "nearest", "zeros", True).float())


@pytest.mark.parametrize("layout", ("channels_last", "strided"))
def test_layouts(layout):
    x = make_tensor((2, 3, 5, 6), torch.float32, layout)
    grid = _grid(2, (4, 3), 2, layout="strided" if layout == "strided" else "contiguous")
    y = st.grid_sample(x, grid, "bilinear", "border", False)
    assert y.is_contiguous(memory_format=torch.channels_last) == (layout == "channels_last")
    dy = make_tensor(y.shape, torch.float32, layout)
    y_ref, dx_ref, dg_ref = _ref_grads(x, grid, dy, "bilinear", "border", False)
    assert_close(y, y_ref)
    dx, dg = st.grid_sample_backward(dy, x, grid, "bilinear", "border", False)
    assert_close(dx, dx_ref)
    assert_close(dg, dg_ref)


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16))
def test_half_dtypes(dtype):
    x = make_tensor((2, 3, 5, 6), dtype)
    grid = _grid(2, (4, 3), 2, dtype)
    y = st.grid_sample(x, grid, "bilinear", "reflection", True)
    assert y.dtype == dtype
    dy = torch.randn(y.shape).to(dtype)
    y_ref, dx_ref, dg_ref = _ref_grads(x, grid, dy, "bilinear", "reflection", True)
    assert_close(y, y_ref)
    dx, dg = st.grid_sample_backward(dy, x, grid, "bilinear", "reflection", True)
    assert dx.dtype == dg.dtype == dtype
    assert_close(dx, dx_ref)
    # The grid gradient sums products of differences of inputs: compared in float32 terms.
    assert_close(dg.float(), dg_ref, torch.bfloat16)


@pytest.mark.parametrize("dims", (2, 3))
def test_deterministic_input_gradient(dims):
    x_shape, out_sp = SHAPES[dims]
    x = make_tensor(x_shape, torch.float32)
    # Many points on few pixels, so the scatter really accumulates.
    grid = _grid(x_shape[0], out_sp, dims) * 0.3
    dy = torch.randn(x_shape[0], x_shape[1], *out_sp)
    _, dx_ref, _ = _ref_grads(x, grid, dy, "bilinear", "zeros", False)
    dx1, _ = st.grid_sample_backward(dy, x, grid, deterministic=True)
    dx2, _ = st.grid_sample_backward(dy, x, grid, deterministic=True)
    assert_close(dx1, dx_ref)
    assert torch.equal(dx1, dx2)


@pytest.mark.parametrize("dims,align", itertools.product((2, 3), (False, True)))
def test_affine_grid(dims, align):
    size = (2, 3, 5, 6) if dims == 2 else (2, 1, 3, 4, 5)
    theta = torch.randn(2, dims, dims + 1, requires_grad=True)
    grid = rtdnn.affine_grid(theta, size, align_corners=align)
    t64 = theta.detach().double().requires_grad_()
    ref = reference.affine_grid(t64, size, align)
    assert_close(grid, ref.detach())
    dgrid = torch.randn(grid.shape)
    grid.backward(dgrid)
    ref.backward(dgrid.double())
    assert_close(theta.grad, t64.grad)


@pytest.mark.filterwarnings("ignore:Since version 1.3.0")
def test_affine_grid_size_one_axis():
    theta = torch.randn(1, 2, 3)
    for align in (False, True):
        grid = rtdnn.affine_grid(theta, (1, 1, 1, 4), align_corners=align)
        assert_close(grid, reference.affine_grid(theta, (1, 1, 1, 4), align))


def test_spatial_transformer_network_autograd():
    """affine_grid then grid_sample, both differentiated through the public functions."""
    x = make_tensor((2, 3, 5, 6), torch.float32).requires_grad_()
    theta = (torch.eye(2, 3) + 0.2 * torch.randn(2, 2, 3)).requires_grad_()
    y = rtdnn.grid_sample(x, rtdnn.affine_grid(theta, x.shape), padding_mode="border")
    w = torch.randn(y.shape)
    (y * w).sum().backward()
    x64 = x.detach().double().requires_grad_()
    t64 = theta.detach().double().requires_grad_()
    y64 = reference.grid_sample(x64, reference.affine_grid(t64, x.shape), "bilinear", "border")
    (y64 * w.double()).sum().backward()
    assert_close(y.detach(), y64.detach())
    assert_close(x.grad, x64.grad)
    assert_close(theta.grad, t64.grad)


def test_grid_only_gradient():
    x = make_tensor((1, 2, 5, 6), torch.float32)
    grid = _grid(1, (3, 3), 2).requires_grad_()
    rtdnn.grid_sample(x, grid, align_corners=True).sum().backward()
    g64 = grid.detach().double().requires_grad_()
    reference.grid_sample(x, g64, align_corners=True).sum().backward()
    assert_close(grid.grad, g64.grad)


# -- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(grid=torch.zeros(1, 2, 2, 3)), "grid.shape"),
        (dict(grid=torch.zeros(2, 2, 2, 2)), "grid.shape"),
        (dict(grid=torch.zeros(1, 2, 2, 2, 2)), "grid.dim()"),
        (dict(input=torch.zeros(1, 2, 3)), "input.dim()"),
        (dict(mode="cubic"), "mode"),
        (dict(padding_mode="wrap"), "padding_mode"),
        (dict(align_corners=None), "align_corners"),
        (dict(grid=torch.zeros(1, 2, 2, 2, dtype=torch.float16)), "grid.dtype"),
    ],
)
def test_bad_sampler_arguments(kwargs, name):
    args = dict(input=torch.randn(1, 2, 3, 4), grid=torch.zeros(1, 2, 2, 2)) | kwargs
    with pytest.raises(rtdnn.BadParamError, match=name.replace("(", r"\(").replace(")", r"\)")):
        rtdnn.grid_sample(**args)


def test_bicubic_is_not_supported():
    with pytest.raises(rtdnn.NotSupportedError, match="mode"):
        rtdnn.grid_sample(torch.randn(1, 2, 3, 4), torch.zeros(1, 2, 2, 2), mode="bicubic")


@pytest.mark.parametrize(
    "theta,size,name",
    [
        (torch.zeros(2, 2, 3), (2, 3, 4, 5, 6), "theta.shape"),
        (torch.zeros(2, 3, 4), (2, 3, 4, 5), "theta.shape"),
        (torch.zeros(1, 2, 3), (2, 3, 4, 5), "theta.shape"),
        (torch.zeros(2, 6), (2, 3, 4, 5), "theta.dim"),
        (torch.zeros(1, 2, 3), (1, 3, 0, 5), "size"),
        (torch.zeros(1, 2, 3), (1, 5), "size"),
    ],
)
def test_bad_affine_grid_arguments(theta, size, name):
    with pytest.raises(rtdnn.BadParamError, match=name):
        rtdnn.affine_grid(theta, size)


def test_custom_ops_pass_opcheck():
    """Schemas, fake kernels and autograd registration hold (what torch.compile relies on)."""
    from rtdnn.autograd import spatial_transformer as ag

    x = torch.randn(1, 2, 3, 4, requires_grad=True)
    grid = (torch.rand(1, 2, 2, 2) * 2 - 1).requires_grad_()
    torch.library.opcheck(ag.grid_sample_op.op, (x, grid, "bilinear", "border", False))
    theta = torch.randn(1, 2, 3, requires_grad=True)
    torch.library.opcheck(ag.affine_grid_op.op, (theta, [1, 2, 3, 4], False))


def test_theta_gradient_of_a_large_grid_keeps_its_digits():
    """dtheta sums dgrid x base point over every point: 64^3 of them, of both signs, whose
    total is far smaller than their magnitudes. Summed in float32 lane by lane it lost two
    digits (1.4e-2); float64 sums keep it at float32's rounding of the result."""
    size = (1, 1, 64, 64, 64)
    dgrid = torch.randn(1, 64, 64, 64, 3, generator=torch.Generator().manual_seed(0))
    for align in (False, True):
        got = st.affine_grid_backward(dgrid, size, align)
        base = torch.nn.functional.affine_grid(
            torch.eye(3, 4, dtype=torch.float64)[None], size, align_corners=align
        ).reshape(-1, 3)  # the base points: the identity map's grid
        base = torch.cat([base, torch.ones(len(base), 1, dtype=torch.float64)], 1)
        want = (dgrid.double().reshape(-1, 3).T @ base)[None]
        assert ((got.double() - want).norm() / want.norm()).item() < 1e-6


@pytest.mark.parametrize("mode", ("bilinear", "nearest"))
@pytest.mark.parametrize("channels", (5, 2))
def test_channels_last_blocks_of_channels(mode, channels):
    """Channels-last: the forward's block of channels is masked past the last channel, and
    the output keeps the layout."""
    x = make_tensor((2, channels, 5, 6), torch.float32, "channels_last")
    grid = _grid(2, (7, 3), 2)
    y = st.grid_sample(x, grid, mode, "reflection", False)
    assert y.is_contiguous(memory_format=torch.channels_last)
    assert_close(y, reference.grid_sample(x, grid, mode, "reflection", False).float())
