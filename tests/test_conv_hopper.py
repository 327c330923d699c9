"""The warp-specialized Hopper convolution's host-side rules, on the CPU (the kernel itself runs
on sm_90 only: tests/test_conv_gpu.py, test_hopper_kernel)."""

import dataclasses
import math

import pytest
import torch

from rtdnn.algos import ALGORITHMS
from rtdnn.algos.implicit_gemm import HopperConvTiles, hopper_unsupported
from rtdnn.kernels import conv_hopper
from rtdnn.ops.conv import _problem_for_selection


@pytest.mark.parametrize("pixels", [conv_hopper.BLOCK_M, conv_hopper.BLOCK_M_WIDE])
@pytest.mark.parametrize(
    "shape", [(1, 1, 1), (128, 7, 7), (64, 7, 7), (64, 14, 14), (2, 56, 56), (1, 224, 224),
              (3, 3, 70), (5, 9, 2)],
)  # fmt: skip
def test_box_covers_tile_and_splits_in_halves(shape, pixels):
    """A forward tile's box holds its pixels (128, or 256 for the wide tiles) in powers of
    two, two or more images or rows so that each consumer takes half, and wastes no more
    pixels than any such box."""
    box = conv_hopper.least_waste_box(*shape, pixels, halves=True)
    n, h, w = box
    assert n * h * w == pixels and all(b & (b - 1) == 0 for b in box)
    assert n > 1 or h > 1
    half = conv_hopper.half_box(box)
    assert 2 * half[0] * half[1] * half[2] == pixels

    def covered(box):
        return math.prod(-(-size // b) * b for size, b in zip(shape, box, strict=True))

    powers = [1 << i for i in range(9)]
    assert all(covered(box) <= covered((n, h, pixels // (n * h)))
               for n in powers for h in powers if 2 <= n * h <= pixels)  # fmt: skip


@pytest.mark.parametrize(
    "shape,waste",
    [((64, 7, 7), 0), ((64, 14, 14), 0), ((64, 28, 28), 0), ((64, 56, 56), 0),
     ((16, 112, 112), 0), ((32, 20, 20), 0), ((32, 17, 17), 0.06), ((1, 28, 28), 0.125),
     ((3, 1, 1), 0.95), ((5, 9, 70), 0.34)],
)  # fmt: skip
def test_weight_gradient_box(shape, waste):
    """The weight gradient's boxes of dy (least_waste_box, 64 pixels a step): 64 pixels in
    powers of two, the fewest outside the output (none on ResNet-50's and VGG-16's outputs),
    no box shape wasting less."""
    from rtdnn.kernels import conv_hopper_filter as chf

    def covered(box):
        return math.prod(-(-size // b) * b for size, b in zip(shape, box, strict=True))

    box = conv_hopper.least_waste_box(*shape, chf.PIXELS)
    assert math.prod(box) == chf.PIXELS and all(b & (b - 1) == 0 for b in box)
    assert 1 - math.prod(shape) / covered(box) == pytest.approx(waste, abs=0.01)
    powers = [1 << i for i in range(7)]
    assert all(covered(box) <= covered((n, h, chf.PIXELS // (n * h)))
               for n in powers for h in powers if n * h <= chf.PIXELS)  # fmt: skip


def _problem(direction, dtype=torch.bfloat16, **conv):
    x = torch.randn(2, 64, 9, 9, dtype=dtype).to(memory_format=torch.channels_last)
    w = torch.randn(64, 64, 3, 3, dtype=dtype).to(memory_format=torch.channels_last)
    args = dict(stride=1, padding=1, dilation=1, groups=1, mode="cross_correlation", math=None)
    p, _ = _problem_for_selection(direction, x, w, **{**args, **conv})
    return p


@pytest.mark.parametrize("direction", ["forward", "backward_data", "backward_filter"])
def test_not_offered_off_hopper(direction):
    """Off a Hopper GPU (here the CPU) the kernel says why it does not run, and IMPLICIT_GEMM
    offers its other tiles."""
    p = _problem(direction)
    assert "Hopper" in hopper_unsupported(p)
    candidates = ALGORITHMS["IMPLICIT_GEMM"].tile_candidates(p)
    assert candidates and not any(isinstance(t, HopperConvTiles) for t in candidates)


@pytest.mark.parametrize(
    "direction,dtype,math_mode,copied,reason",
    [
        ("forward", torch.float32, "tf32", False, None),
        ("forward", torch.float32, "fp32", False, "TF32"),  # strict float32: no TF32 products
        ("backward_data", torch.float32, "tf32", False, "k innermost"),
        ("backward_data", torch.float32, "tf32", True, None),  # IMPLICIT_PRECOMP_GEMM's copy
        ("backward_filter", torch.float32, "fp32", False, "TF32"),
        ("forward", torch.bfloat16, None, False, None),
    ],
)
def test_tf32_scope_on_hopper(direction, dtype, math_mode, copied, reason, monkeypatch):
    """On a Hopper machine (stubbed) the kernels take float32 data in TF32 math in forward,
    in backward-data on a filter copy with k innermost, reducing 32 channels a step (128
    bytes), and say why not elsewhere (the weight gradient's scope:
    test_weight_gradient_scope_on_hopper)."""
    from rtdnn.algos import implicit_gemm as ig

    monkeypatch.setattr(ig, "INTERPRETED", False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *args: (9, 0))
    p = dataclasses.replace(_problem(direction, dtype, math=math_mode), device="cuda")
    if copied:
        strides = ig.hopper_data_filter_strides(p.w.shape)
        p = dataclasses.replace(p, w=dataclasses.replace(p.w, strides=strides))
    got = hopper_unsupported(p)
    if reason is not None:
        assert got is not None and reason in got, got
        return
    assert got is None, got
    tiles = ig.hopper_candidates(p, 1)
    assert tiles and all(t.block_k == 128 // dtype.itemsize for t in tiles)


@pytest.mark.parametrize(
    "direction,channels,stride,hopper_first,pointer_offered",
    [
        ("forward", 64, 1, True, False),  # 128-byte steps: the Hopper kernel alone
        ("forward", 64, 2, True, False),
        ("backward_data", 64, 2, True, False),
        ("forward", 96, 1, True, True),
        ("forward", 96, 2, False, True),  # strided forward on 64-byte steps: pointer first
        ("backward_data", 96, 2, True, True),
    ],
)
def test_narrow_steps_offered_beside_pointer_tiles(direction, channels, stride, hopper_first,
                                                   pointer_offered, monkeypatch):  # fmt: skip
    """On a Hopper machine (stubbed), IMPLICIT_GEMM offers the Hopper kernel alone where it
    steps through 128-byte rows of channels; on 64-byte rows (channels not a multiple of 64
    16-bit ones) beside the pointer tiles, after them in a strided forward, as measured."""
    from rtdnn.algos import implicit_gemm as ig

    monkeypatch.setattr(ig, "INTERPRETED", False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *args: (9, 0))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(ig, "multiprocessor_count", lambda index: 132)
    cl = torch.channels_last
    x = torch.empty(2, channels, 9, 9, dtype=torch.bfloat16, memory_format=cl)
    w = torch.empty(channels, channels, 3, 3, dtype=torch.bfloat16, memory_format=cl)
    args = dict(stride=stride, padding=1, dilation=1, groups=1, math=None)
    p, _ = _problem_for_selection(direction, x, w, mode="cross_correlation", **args)
    p = dataclasses.replace(p, device="cuda")
    assert hopper_unsupported(p) is None
    candidates = ALGORITHMS["IMPLICIT_GEMM"].tile_candidates(p)
    hopper = [isinstance(t, HopperConvTiles) for t in candidates]
    assert any(hopper) and hopper[0] == hopper_first
    assert (not all(hopper)) == pointer_offered
    # The Hopper tiles one run at the head or the tail, on 64-byte steps beside the pointer
    # tiles (32 16-bit channels a step), 128-byte ones alone.
    run, rest = [True] * sum(hopper), [False] * (len(hopper) - sum(hopper))
    assert hopper == (run + rest if hopper_first else rest + run)
    steps = {t.block_k for t in candidates if isinstance(t, HopperConvTiles)}
    assert steps == ({32} if pointer_offered else {64})


@pytest.mark.parametrize(
    "kernel,pad,dil,stride",
    [
        (3, 1, 1, 2),
        (1, 0, 1, 2),
        (3, 1, 1, 1),
        (7, 3, 1, 2),
        (3, 2, 2, 2),
        (5, 2, 1, 2),
        (4, 1, 3, 2),
    ],
)
def test_data_phases_rebuild_backward_data(kernel, pad, dil, stride):
    """Backward-data assembled stride phase by stride phase from data_phase_taps, with the
    kernel's index arithmetic (tap t of a phase: filter tap first + step_filter t, dy pixel
    o + shift + t step), equals the float64 reference; phases no tap reaches stay zero."""
    from rtdnn import reference as R

    for side in (7, 8):
        out = (side + 2 * pad - dil * (kernel - 1) - 1) // stride + 1
        if out < 1:
            continue
        dy = torch.randn(2, 3, out, out, dtype=torch.float64)
        w = torch.randn(3, 2, kernel, kernel, dtype=torch.float64)
        dx = torch.zeros(2, 2, side, side, dtype=torch.float64)
        for a in range(stride):
            for b in range(stride):
                th = conv_hopper.data_phase_taps(kernel, pad, dil, stride, a)
                tw = conv_hopper.data_phase_taps(kernel, pad, dil, stride, b)
                for t in range(th.count):
                    for q in range(tw.count):
                        r = th.first + th.step_filter * t
                        s = tw.first + tw.step_filter * q
                        for u in range(len(range(a, side, stride))):
                            for v in range(len(range(b, side, stride))):
                                i, j = u + th.shift + t * th.step, v + tw.shift + q * tw.step
                                if 0 <= i < out and 0 <= j < out:
                                    dx[:, :, a + stride * u, b + stride * v] += (
                                        dy[:, :, i, j] @ w[:, :, r, s]
                                    )
        ref = R.conv_backward_data(dy, w, dx.shape, stride=stride, padding=pad, dilation=dil)
        assert torch.allclose(dx, ref, atol=1e-10), (side, (dx - ref).abs().max())


@pytest.mark.parametrize("stride", [1, 2])
def test_strided_forward_reads_the_right_phase(stride):
    """The loader's arithmetic for a strided forward (lift the shifted row, take its phase and
    its row within the phase) lands on input row stride x o - pad + r x dil."""
    for pad, dil, kernel in ((0, 1, 1), (1, 1, 3), (3, 1, 7), (2, 2, 3)):
        run = conv_hopper.forward_taps(kernel, pad, dil)
        lift = pad
        for o in range(5):
            for t in range(run.count):
                d = run.shift + t * run.step + stride * lift
                phase, row = d % stride, o + d // stride - lift
                assert stride * row + phase == stride * o - pad + t * dil


def _box(view: torch.Tensor, origin, size) -> torch.Tensor:
    """A TMA box of `view` (float64): the elements at origin + index, zero outside."""
    out = torch.zeros(size, dtype=torch.float64)
    src, dst = [], []
    for o, n, extent in zip(origin, size, view.shape, strict=True):
        lo, hi = max(o, 0), min(o + n, extent)
        if lo >= hi:
            return out
        src.append(slice(lo, hi))
        dst.append(slice(lo - o, hi - o))
    out[tuple(dst)] = view[tuple(src)].double()
    return out


def _emulate(fixed: dict, args: tuple) -> None:
    """conv_hopper_kernel's work, step by step in float64 on the CPU, from one recorded
    launch: its fixed arguments and its call's descriptors, bias, alpha and beta."""
    *reads, w_desc, y_desc, bias, alpha, beta = args
    views = [torch.as_strided(d.base, d.shape, d.strides) for d in (*reads, w_desc, y_desc)]
    x_views, w_view, y_view = views[:4], views[4], views[5]
    f = fixed
    box, chunk = list(reads[0].block_shape[:-1]), reads[0].block_shape[-1]
    # 2-D boxes [images, rows, columns]; 3-D [1, depth, rows, columns].
    if f["THREE_D"]:
        box_n, box_d, box_h, box_w = box
    else:
        (box_n, box_h, box_w), box_d = box, 1
    backward = f["W_REDUCED_ROWS"]
    block_n = w_desc.block_shape[1 if backward else 0]
    for tile in range(f["tiles"]):
        tm = tile // f["tiles_n"]
        n0 = (tile - tm * f["tiles_n"]) * block_n
        ow = tm % f["tiles_w"] * box_w
        oh = (tm // f["tiles_w"]) % f["tiles_h"] * box_h
        od = (tm // (f["tiles_w"] * f["tiles_h"])) % f["tiles_d"] * box_d
        img = tm // (f["tiles_w"] * f["tiles_h"] * f["tiles_d"]) * box_n
        acc = torch.zeros(*box, block_n, dtype=torch.float64)
        for step in range(f["taps"] * f["chunks"]):
            tap, c0 = step // f["chunks"], step % f["chunks"] * chunk
            u = tap // f["taps_hw"]
            t, q = divmod(tap - u * f["taps_hw"], f["taps_w"])
            filter_tap = ((f["d0f"] + f["dstep"] * u) * f["R"] + f["r0"] + f["rstep"] * t) * f[
                "S"] + f["s0"] + f["sstep"] * q  # fmt: skip
            dh, dw = f["shift_h"] + t * f["step_h"], f["shift_w"] + q * f["step_w"]
            if f["THREE_D"]:
                dd = f["shift_d"] + u * f["step_d"]
                a = _box(x_views[0], [img, od + dd, oh + dh, ow + dw, c0], [*box, chunk])
            else:
                phase = 0
                if f["STRIDED"]:
                    dh += f["stride_h"] * f["lift"]
                    dw += f["stride_w"] * f["lift"]
                    phase = (dh % f["stride_h"]) * 2 + dw % f["stride_w"]
                    dh, dw = dh // f["stride_h"] - f["lift"], dw // f["stride_w"] - f["lift"]
                a = _box(x_views[phase], [img, oh + dh, ow + dw, c0], [*box, chunk])
            if backward:
                b = _box(w_view, [c0, filter_tap * f["tap_cols"] + n0], [chunk, block_n])
            else:
                b = _box(w_view, [n0, filter_tap * f["tap_cols"] + c0], [block_n, chunk]).T
            acc += a @ b
        # Each consumer's half of the box's pixels (in the box's order), stored as the kernel
        # does: a half box of y_desc at half the images (2-D) or the depth (3-D), else at
        # half the rows; ping-pong, the whole box by the consumer whose turn it is.
        half_box = list(y_desc.block_shape[:-1])
        parts = 1 if f["PINGPONG"] else 2
        assert math.prod(half_box) * parts == math.prod(box)
        halves = acc.reshape(parts, -1, block_n)
        for h in range(parts):
            part = alpha * halves[h].reshape(*half_box, block_n)
            if f["THREE_D"]:
                split = [0, box_d // 2, 0, 0] if box_d > 1 else [0, 0, box_h // 2, 0]
                at = [img, od, oh, ow]
            else:
                split = [box_n // 2, 0, 0] if box_n > 1 else [0, box_h // 2, 0]
                at = [img, oh, ow]
            origin = [a + h * q for a, q in zip(at, split, strict=True)] + [n0]
            if f["BETA_NONZERO"]:
                part += beta * _box(y_view, origin, [*half_box, block_n])
            if f["HAS_BIAS"]:
                part += _box(bias.view(*[1] * len(half_box), -1), [0] * len(half_box) + [n0],
                             [1] * len(half_box) + [block_n])  # fmt: skip
            if f["RELU"]:
                part = part.clamp_min(0)
            ends = [min(o + n, e) for o, n, e in zip(origin, (*half_box, block_n), y_view.shape,
                                                     strict=True)]  # fmt: skip
            y_view[tuple(slice(o, e) for o, e in zip(origin, ends, strict=True))] = part[
                tuple(slice(0, e - o) for o, e in zip(origin, ends, strict=True))
            ].to(y_view.dtype)


@pytest.mark.parametrize(
    "direction,conv",
    [
        ("forward", dict(padding=1)),
        ("forward", dict(stride=2, padding=1)),
        ("forward", dict(stride=(2, 1), padding=2, dilation=2)),
        ("backward_data", dict(padding=1)),
        ("backward_data", dict(stride=2, padding=1)),
        ("backward_data", dict(stride=2)),  # 1x1: three phases no tap reaches
        ("forward", dict(padding=1, math="tf32")),  # float32 data, TF32 products
        ("forward", dict(stride=2, padding=1, math="tf32")),
        # TF32 backward-data: IMPLICIT_PRECOMP_GEMM's filter copy with k innermost.
        ("backward_data", dict(padding=1, math="tf32")),
        ("backward_data", dict(stride=2, padding=1, math="tf32")),
        # Reduced channels not a multiple of 128 bytes: steps of 64-byte rows.
        ("forward", dict(padding=1, channels=96)),
        ("forward", dict(stride=2, padding=1, channels=160)),
        ("backward_data", dict(padding=1, channels=96)),
        ("backward_data", dict(stride=2, padding=1, channels=160)),
        ("forward", dict(padding=1, math="tf32", channels=48)),
        # 256-pixel tiles (16-bit data).
        ("forward", dict(padding=1, pixels=256)),
        ("forward", dict(stride=2, padding=1, pixels=256, channels=96)),
        ("backward_data", dict(stride=2, padding=1, pixels=256)),
        # 3-D at stride 1: depth taps too; padding above the filter's reach, dilation.
        ("forward", dict(padding=1, depth=5)),
        ("forward", dict(padding=(0, 1, 2), dilation=(2, 1, 1), depth=6, pixels=256)),
        ("backward_data", dict(padding=1, depth=5)),
        ("backward_data", dict(padding=(2, 0, 1), depth=4, channels=96)),
        ("forward", dict(padding=1, depth=1)),  # a 1-deep image: one depth tap reaches it
        ("backward_data", dict(padding=1, depth=1, pixels=256)),
        ("forward", dict(padding=1, depth=3, math="tf32")),
        ("backward_data", dict(padding=(1, 0, 1), depth=3, math="tf32")),
        # Tiles 128 channels wide (over the 128 filters of these forward problems).
        ("forward", dict(stride=2, padding=1, width=128)),
        ("forward", dict(padding=1, depth=4, width=128, pixels=256)),
        # Ping-pong: each consumer whole boxes (of one image's rows where the batch is 2).
        ("forward", dict(padding=1, pingpong=True)),
        ("forward", dict(stride=2, padding=1, width=128, pingpong=True)),
        ("backward_data", dict(stride=2, padding=1, pingpong=True)),
        ("backward_data", dict(stride=2, pingpong=True)),
        ("forward", dict(padding=1, depth=5, pingpong=True)),
        ("backward_data", dict(padding=1, channels=96, pingpong=True)),
    ],
)
def test_host_plan_computes_the_convolution(direction, conv, monkeypatch):
    """IMPLICIT_GEMM's Hopper launches (IMPLICIT_PRECOMP_GEMM's, on its filter copy, in TF32
    backward-data), prepared on the CPU with the GPU parts stubbed (the scope check, the
    launch, the device's multiprocessors) and carried out by an emulation of the kernel's
    index arithmetic in float64, give the convolution: the descriptors' views, stride phases,
    tap runs and tile counts the host builds are right."""
    from rtdnn import reference as R
    from rtdnn.algos import ConvTensors
    from rtdnn.algos import implicit_gemm as ig

    launches = []

    def record(fn, grid, slots, num_warps, maxnreg, **fixed):
        return lambda *args: launches.append((fixed, args))

    monkeypatch.setattr(ig, "hopper_unsupported", lambda p: None)
    monkeypatch.setattr(ig, "slot_launch", record)
    monkeypatch.setattr(ig, "multiprocessor_count", lambda device: 132)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    one_by_one = conv == dict(stride=2)
    conv = dict(conv)
    math_mode = conv.pop("math", None)
    reduced = conv.pop("channels", 64)  # C forward, K backward-data
    pixels = conv.pop("pixels", conv_hopper.BLOCK_M)
    width = conv.pop("width", 64)  # the tile's written channels
    depth = conv.pop("depth", None)  # 3-D: images this deep, 3x3x3 filters
    pingpong = conv.pop("pingpong", False)
    dtype = torch.float32 if math_mode == "tf32" else torch.bfloat16
    cl = torch.channels_last_3d if depth else torch.channels_last
    forward = direction == "forward"
    image = (*(depth,) * bool(depth), 9, 10)
    x = torch.randn(2, reduced if forward else 64, *image).to(dtype).to(memory_format=cl)
    k, c = (128, reduced) if forward else (reduced, 64)
    taps = (1, 1) if one_by_one else (3,) * len(image)
    w = (torch.randn(k, c, *taps) / 24).to(dtype).to(memory_format=cl)
    args = dict(stride=1, padding=0, dilation=1, groups=1, mode="cross_correlation")
    p, _ = _problem_for_selection(direction, x, w, math=math_mode, **{**args, **conv})
    if forward:
        p = dataclasses.replace(p, has_bias=True, activation="relu")
    block_k = conv_hopper.chunk(dtype, reduced)
    assert block_k == (128 if reduced % (128 // dtype.itemsize) == 0 else 64) // dtype.itemsize
    tiles = HopperConvTiles(pixels, width, block_k, group_m=1, num_warps=4, num_stages=6,
                            pingpong=pingpong)  # fmt: skip
    copied = not forward and math_mode == "tf32"
    algo = ALGORITHMS["IMPLICIT_PRECOMP_GEMM" if copied else "IMPLICIT_GEMM"]
    if copied:  # the Hopper tiles come first there
        assert isinstance(algo.tile_candidates(p)[0], HopperConvTiles)
    run = algo.prepare(p, tiles)
    workspace = torch.empty(algo.workspace_bytes(p), dtype=torch.uint8)
    y_shape = R.conv_forward(x, w, **conv).shape
    dy = torch.randn(y_shape).to(dtype).to(memory_format=cl)
    bias = torch.randn(w.shape[0]).to(dtype)
    out_shape = y_shape if forward else x.shape
    prior = torch.randn(out_shape).to(dtype).to(memory_format=cl)
    out = prior.clone()
    tensors = ConvTensors(x, w, out, bias) if forward else ConvTensors(out, w, dy)
    run(tensors, workspace, 0.5, -1.5)
    # The filter's rows are the reduced channels only in backward-data as stored.
    reduced_rows = not forward and not copied
    assert launches and all(f["W_REDUCED_ROWS"] == reduced_rows for f, _ in launches)
    assert all(f["tap_cols"] == (w.shape[0] if copied else w.shape[1]) for f, _ in launches)
    for fixed, call in launches:
        _emulate(fixed, call)
    if forward:
        ref = R.conv_forward(x, w, bias, alpha=0.5, beta=-1.5, out=prior, activation="relu",
                             **conv)  # fmt: skip
    else:
        ref = R.conv_backward_data(dy, w, x.shape, alpha=0.5, beta=-1.5, out=prior, **conv)
    assert R.rel_error(out, ref) < 1e-2


def _emulate_filter(fixed: dict, args: tuple) -> None:
    """conv_filter_hopper_kernel's work in float64 on the CPU, from one recorded launch: each
    unit's products over its split of dy's boxes (the loader's index arithmetic); unsplit,
    the epilogue through the filter's strides; split, the partials into the workspace, for
    the split finish (which the test runs in the interpreter)."""
    dy_desc, *reads, dw, ws, alpha, beta = args
    f = fixed
    dy_view = torch.as_strided(dy_desc.base, dy_desc.shape, dy_desc.strides)
    x_views = [torch.as_strided(d.base, d.shape, d.strides) for d in reads]
    box, bc = list(dy_desc.block_shape[:3]), reads[0].block_shape[3]
    # Cooperative: two boxes of dy a step, one for each consumer's half of the unit's filters.
    f_box, halves = dy_desc.block_shape[3], 2 if f["COOPERATIVE"] else 1
    bf = f_box * halves
    K, C, S = f["K"], f["C"], f["S"]
    out = torch.as_strided(dw, (K, C, dw.shape[2], S), (f["sk"], f["sc"], f["sr"], f["ss"]))
    partials: dict[int, dict[int, torch.Tensor]] = {}
    taps = f["units"] // (f["k_tiles"] * f["c_tiles"] * f["splits"])
    for unit in range(f["units"]):
        tap, rest = unit % taps, unit // taps  # taps innermost, splits outermost
        c0 = rest % f["c_tiles"] * bc
        rest = rest // f["c_tiles"]
        k0, split = rest % f["k_tiles"] * bf, rest // f["k_tiles"]
        tile = (tap * f["k_tiles"] + k0 // bf) * f["c_tiles"] + c0 // bc
        r = tap // S
        dh = r * f["dil_h"] - f["pad_h"] + f["stride_h"] * f["lift"]
        dw_ = (tap - r * S) * f["dil_w"] - f["pad_w"] + f["stride_w"] * f["lift"]
        phase = (dh % f["stride_h"]) * 2 + dw_ % f["stride_w"] if f["STRIDED"] else 0
        dh, dw_ = dh // f["stride_h"] - f["lift"], dw_ // f["stride_w"] - f["lift"]
        acc = torch.zeros(bf, bc, dtype=torch.float64)
        first = split * f["per_split"]
        for b in range(first, min(first + f["per_split"], f["boxes"])):
            w0 = b % f["boxes_w"] * box[2]
            h0 = (b // f["boxes_w"]) % f["boxes_h"] * box[1]
            img = b // (f["boxes_w"] * f["boxes_h"]) * box[0]
            x = _box(x_views[phase], [img, h0 + dh, w0 + dw_, c0], [*box, bc]).reshape(-1, bc)
            for half in range(halves):
                at = [img, h0, w0, k0 + half * f_box]
                a = _box(dy_view, at, [*box, f_box]).reshape(-1, f_box)
                acc[half * f_box : (half + 1) * f_box] += a.T @ x
        assert split not in partials.setdefault(tile, {}), "a split computed twice"
        partials[tile][split] = acc
    assert len(partials) * f["splits"] == f["units"]
    for tile, parts in partials.items():
        assert sorted(parts) == list(range(f["splits"]))
        c0 = tile % f["c_tiles"] * bc
        rest = tile // f["c_tiles"]
        k0, tap = rest % f["k_tiles"] * bf, rest // f["k_tiles"]
        k1, c1 = min(k0 + bf, K), min(c0 + bc, C)
        if f["splits"] > 1:  # the partials, in the workspace (taps, splits, K, C)
            planes = ws[: taps * f["splits"] * K * C].view(taps, f["splits"], K, C)
            for q, part in parts.items():
                planes[tap, q, k0:k1, c0:c1] = part[: k1 - k0, : c1 - c0].float()
            continue
        target = out[k0:k1, c0:c1, tap // S, tap % S]
        value = alpha * parts[0][: k1 - k0, : c1 - c0]
        if f["BETA_NONZERO"]:
            value += beta * target.double()
        target.copy_(value.to(dw.dtype))


@pytest.mark.parametrize("algo", ["IMPLICIT_GEMM", "IMPLICIT_GEMM_SPLIT_K"])
@pytest.mark.parametrize(
    "unit", ["ping-pong", "cooperative", "tf32", "tf32-64", "tf32-cooperative"]
)
@pytest.mark.parametrize(
    "x_shape,w_shape,conv",
    [
        ((2, 136, 20, 24), (72, 136, 3, 3), dict(padding=1)),
        ((2, 264, 6, 7), (136, 264, 3, 3), dict(padding=1)),  # two channel tiles of 256
        ((2, 72, 9, 10), (136, 72, 3, 3), dict(stride=2, padding=1)),
        ((3, 64, 7, 6), (64, 64, 1, 1), dict(stride=2)),
        ((1, 64, 11, 9), (64, 64, 3, 3), dict(stride=(2, 1), padding=2, dilation=2)),
        ((2, 64, 1, 1), (64, 64, 3, 3), dict(padding=1)),
        ((2, 64, 5, 9), (64, 64, 1, 7), dict(padding=(0, 3))),  # a 1x7 filter
        ((2, 64, 9, 6), (64, 64, 3, 1), dict(stride=(1, 2), padding=(1, 0))),
    ],
)
def test_host_plan_computes_the_weight_gradient(algo, unit, x_shape, w_shape, conv,
                                                monkeypatch):  # fmt: skip
    """Backward-filter's Hopper launch (IMPLICIT_GEMM unsplit, IMPLICIT_GEMM_SPLIT_K in up to
    four splits within its workspace; ping-pong's 128 x 128 units and cooperative 128 x 256,
    dy in two boxes; float32 in TF32 math, 32 pixels a step, also in 64 x 64 units), prepared
    on the CPU with the GPU parts stubbed and carried out by an emulation of the kernel in
    float64, gives the weight gradient with alpha and beta: descriptors, stride phases, units,
    splits and the filter's strides are right. Tiles wider than the channels (72 and 136 of
    128; 264 in tiles of 128 or 256) and a 1-pixel image included."""
    from rtdnn import reference as R
    from rtdnn.algos import ConvTensors
    from rtdnn.algos import implicit_gemm as ig
    from rtdnn.kernels import conv_hopper_filter as chf

    launches, dy_boxes = [], []

    def record(fn, grid, slots, num_warps, maxnreg, **fixed):
        assert fn is chf.conv_filter_hopper_kernel and grid[0] <= 132

        def emulate(*args):  # when launched: the split finish runs after it
            launches.append(fixed)
            dy_boxes.append(args[0].block_shape)
            _emulate_filter(fixed, args)

        return emulate

    monkeypatch.setattr(ig, "hopper_unsupported", lambda p: None)
    monkeypatch.setattr(ig, "slot_launch", record)
    monkeypatch.setattr(ig, "multiprocessor_count", lambda device: 132)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    # Up to four splits (the interpreter's split count is one on these sizes).
    monkeypatch.setattr(ig.ImplicitGemmSplitK, "splits", lambda self, p: 4)
    cl = torch.channels_last
    dtype = torch.float32 if unit.startswith("tf32") else torch.bfloat16
    x = torch.randn(x_shape).to(dtype).to(memory_format=cl)
    w = torch.randn(w_shape).to(dtype)  # the filter written in its own strides
    args = dict(stride=1, padding=0, dilation=1, groups=1, mode="cross_correlation", math="tf32")
    p, _ = _problem_for_selection("backward_filter", x, w, **{**args, **conv})
    dy = torch.randn(R.conv_forward(x, w, **conv).shape).to(dtype).to(memory_format=cl)
    algorithm = ALGORITHMS[algo]
    channels, pixels, stages = {
        "ping-pong": (chf.BLOCK_C, chf.PIXELS, chf.STAGES),
        "cooperative": (chf.COOPERATIVE_BLOCK_C, chf.PIXELS, chf.COOPERATIVE_STAGES),
        "tf32": (chf.BLOCK_C, chf.TF32_PIXELS, chf.TF32_STAGES),
        "tf32-64": (64, chf.TF32_PIXELS, chf.TF32_STAGES),  # 64 x 64 units
        "tf32-cooperative": (chf.COOPERATIVE_BLOCK_C, chf.TF32_PIXELS, chf.TF32_COOPERATIVE_STAGES),
    }[unit]
    tiles = HopperConvTiles(min(chf.BLOCK_F, channels), channels, pixels, group_m=1,
                            num_warps=4, num_stages=stages)  # fmt: skip
    run = algorithm.prepare(p, tiles)
    workspace = torch.empty(algorithm.workspace_bytes(p), dtype=torch.uint8)
    prior = torch.randn(w_shape).to(dtype)
    out = prior.clone()
    run(ConvTensors(x, out, dy), workspace, 0.5, -1.5)
    assert len(launches) == 1
    fixed = launches[0]
    assert fixed["COOPERATIVE"] == unit.endswith("cooperative")
    assert math.prod(dy_boxes[0][:3]) == pixels
    if algo == "IMPLICIT_GEMM":
        assert fixed["splits"] == 1
    else:
        assert fixed["splits"] <= algorithm.splits(p)
        assert fixed["splits"] > 1 or fixed["boxes"] < 8
        needed = math.prod(w_shape[2:]) * fixed["splits"] * w_shape[0] * w_shape[1] * 4
        assert fixed["splits"] == 1 or workspace.numel() >= needed
    ref = R.conv_backward_filter(x, dy, w_shape, alpha=0.5, beta=-1.5, out=prior, **conv)
    assert R.rel_error(out, ref) < 1e-2


@pytest.mark.parametrize("tiles,boxes,most", [(9, 784, 32), (144, 64, 3), (36, 196, 12),
                                              (1, 1, 32), (2000, 50, 32), (9, 4, 1)])  # fmt: skip
def test_split_plan_covers_every_box(tiles, boxes, most):
    """The weight gradient's split plan: at most `most` splits, each nonempty, together
    covering every box once; a split where one wave of unsplit units would leave most
    multiprocessors idle."""
    from rtdnn.kernels import conv_hopper_filter as chf

    for cooperative in (False, True):
        splits, per, _ = chf.split_plan(tiles, boxes, 132, most, cooperative)
        assert 1 <= splits <= max(1, most) and (splits - 1) * per < boxes <= splits * per
        if tiles * 4 <= 132 and boxes >= 64 and most >= 4:
            assert splits > 1


@pytest.mark.parametrize(
    "channels,kernel,conv,dtype,layout,reason",
    [
        (128, 3, dict(padding=1), torch.bfloat16, "cl", None),
        (128, 3, dict(stride=2, padding=1), torch.float16, "cl", None),
        (128, 1, dict(), torch.bfloat16, "cl", "1x1"),
        (64, 3, dict(padding=1), torch.bfloat16, "cl", None),  # in 64 x 64 units
        (32, 3, dict(padding=1), torch.float32, "cl", "at least 64"),
        (64, 1, dict(stride=2), torch.float32, "cl", None),  # TF32: 1x1 and 64 channels too
        (128, 3, dict(padding=1), torch.float32, "cl", None),  # TF32 (the default math)
        (128, 3, dict(padding=1, math="fp32"), torch.float32, "cl", "TF32"),
        (128, 3, dict(padding=1, groups=2), torch.bfloat16, "cl", "one group"),
        (128, 3, dict(stride=3, padding=1), torch.bfloat16, "cl", "stride 1 or 2"),
        (128, 3, dict(padding=1), torch.bfloat16, "nchw", "channels-last"),
    ],
)
def test_weight_gradient_scope_on_hopper(channels, kernel, conv, dtype, layout, reason,
                                         monkeypatch):  # fmt: skip
    """On a Hopper machine (stubbed: sm_90, compiled kernels) the weight-gradient kernel
    takes ungrouped channels-last layers of 64 filters and channels and more at stride 1 or
    2, in 16-bit data with filters over 1x1, in float32 (TF32 math) 1x1 too; says why not
    elsewhere; and then `auto` no longer sends a late 3x3 weight gradient to GEMM first."""
    from rtdnn.algos import gemm, geometry
    from rtdnn.algos import implicit_gemm as ig

    monkeypatch.setattr(ig, "INTERPRETED", False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *args: (9, 0))
    fmt = torch.channels_last if layout == "cl" else torch.contiguous_format
    groups = conv.get("groups", 1)
    x = torch.randn(2, channels, 9, 9).to(dtype).contiguous(memory_format=fmt)
    w = torch.randn(channels, channels // groups, kernel, kernel).to(dtype)
    args = dict(stride=1, padding=0, dilation=1, groups=1, mode="cross_correlation", math=None)
    p, _ = _problem_for_selection("backward_filter", x, w, **{**args, **conv})
    p = dataclasses.replace(p, device="cuda")
    got = hopper_unsupported(p)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(ig, "multiprocessor_count", lambda index: 132)
    monkeypatch.setattr(geometry, "multiprocessor_count", lambda index: 132)
    if reason is None:
        assert got is None
        candidates = ALGORITHMS["IMPLICIT_GEMM_SPLIT_K"].tile_candidates(p)
        # 128 channels: the ping-pong unit alone (the cooperative one is 256 channels wide),
        # 64 pixels a step (128 bytes of them: 32 in float32); float32 layers of 64 channels
        # in units of 64 x 64.
        side = min(channels, 128)
        assert [(t.block_m, t.block_n) for t in candidates] == [(side, side)]
        assert candidates[0].block_k == 128 // dtype.itemsize
        # A late 3x3 weight gradient (512 filters): GEMM first only without this kernel.
        monkeypatch.setattr(gemm, "device_memory_bytes", lambda index: 80 << 30)
        x = torch.randn(2, 512, 7, 7).to(dtype).contiguous(memory_format=fmt)
        w = torch.randn(512, 512, 3, 3).to(dtype).contiguous(memory_format=fmt)
        late, _ = _problem_for_selection("backward_filter", x, w, **{**args, **conv})
        late = dataclasses.replace(late, device="cuda")
        assert hopper_unsupported(late) is None and not gemm.gemm_preferred(late)
        # Both units there; on this short problem (two images) ping-pong first.
        split_k = ALGORITHMS["IMPLICIT_GEMM_SPLIT_K"]
        assert [t.block_n for t in split_k.tile_candidates(late)] == [128, 256]
        if dtype != torch.float32:  # GEMM comes first for 16-bit late weight gradients
            # where the kernel is not offered: RTDNN_HOPPER_CONV=0 as where it cannot run.
            monkeypatch.setenv(ig.HOPPER_CONV_ENV, "0")
            assert gemm.gemm_preferred(late)
            monkeypatch.delenv(ig.HOPPER_CONV_ENV)
            monkeypatch.setattr(ig, "hopper_unsupported", lambda p: "off")
            assert gemm.gemm_preferred(late)
    else:
        assert got is not None and reason in got, got


@pytest.mark.parametrize(
    "channels,batch,side,first",
    [(512, 64, 28, True), (256, 16, 56, True), (512, 64, 14, True), (512, 64, 7, True),
     (256, 64, 14, True), (512, 1, 28, False), (256, 8, 14, False), (384, 32, 17, False)],
)  # fmt: skip
def test_cooperative_unit_first_on_long_plans(channels, batch, side, first, monkeypatch):
    """IMPLICIT_GEMM_SPLIT_K's weight-gradient units on a 132-multiprocessor Hopper
    (stubbed): the cooperative 128 x 256 unit first for 3x3 layers of long plans (ResNet-50's
    and VGG-16's layers of 256 channels and more), ping-pong's 128 x 128 first on short ones
    (one image, eight of 14x14) and where 256-channel tiles waste more (384), as measured
    on an H200; both offered either way."""
    from rtdnn.algos import geometry
    from rtdnn.algos import implicit_gemm as ig

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(ig, "multiprocessor_count", lambda index: 132)
    monkeypatch.setattr(geometry, "multiprocessor_count", lambda index: 132)
    # Up to 16 splits, as the workspace allows on the GPU (the interpreter's count is one).
    monkeypatch.setattr(ig.ImplicitGemmSplitK, "splits", lambda self, p: 16)
    cl = torch.channels_last
    x = torch.empty(batch, channels, side, side, dtype=torch.bfloat16, memory_format=cl)
    w = torch.empty(channels, channels, 3, 3, dtype=torch.bfloat16, memory_format=cl)
    args = dict(stride=1, padding=1, dilation=1, groups=1, mode="cross_correlation", math=None)
    p, _ = _problem_for_selection("backward_filter", x, w, **args)
    split_k = ALGORITHMS["IMPLICIT_GEMM_SPLIT_K"]
    units = [t.block_n for t in ig._hopper_filter_candidates(p, split_k.splits(p))]
    assert units == ([256, 128] if first else [128, 256])


@pytest.mark.parametrize(
    "filters,channels,dtype,units",
    [
        (64, 64, torch.bfloat16, [(64, 64, 64)]),
        (128, 64, torch.bfloat16, [(128, 64, 64)]),
        (64, 512, torch.bfloat16, [(64, 128, 64)]),  # no cooperative unit: 32 filters a group
        (72, 64, torch.float16, [(128, 64, 64)]),
        (64, 512, torch.float32, [(64, 128, 32)]),
        (512, 512, torch.float32, [(128, 128, 32), (128, 256, 32)]),
    ],
)
def test_weight_gradient_units_by_channels(filters, channels, dtype, units, monkeypatch):
    """The weight-gradient kernel's units: 64 filters or channels wide where the layer has no
    more, 128 otherwise; the cooperative unit only where both warp groups get 64 filters
    (here second: two images make a short plan); 32 pixels a step in float32 (128 bytes),
    64 in 16-bit data."""
    from rtdnn.algos import implicit_gemm as ig

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(ig, "multiprocessor_count", lambda index: 132)
    cl = torch.channels_last
    x = torch.empty(2, channels, 9, 9, dtype=dtype, memory_format=cl)
    w = torch.empty(filters, channels, 3, 3, dtype=dtype, memory_format=cl)
    args = dict(stride=1, padding=1, dilation=1, groups=1, mode="cross_correlation", math=None)
    p, _ = _problem_for_selection("backward_filter", x, w, **args)
    got = [(t.block_m, t.block_n, t.block_k) for t in ig._hopper_filter_candidates(p, 4)]
    assert got == units


@pytest.mark.parametrize(
    "tiles,costs,programs",
    [([196] * 4, [5, 9, 9, 17], 132), ([100] * 4, [9, 17, 17, 33], 132), ([500], [9], 132),
     ([3, 3], [1, 1], 132), ([7, 30, 2], [4, 1, 9], 12), ([13, 5], [2, 3], 6), ([], [], 8)],
)  # fmt: skip
def test_phase_launches_share_the_multiprocessors(tiles, costs, programs):
    """Backward-data's stride phases, launched side by side, take shares of the
    multiprocessors (a program fills one): at least one each, never more than their tiles,
    at most all of them together, and finishing no later than any other split would (checked
    against every split where that is few enough to list)."""
    import itertools

    from rtdnn.algos.geometry import share_programs

    def finish(shares):
        return max(-(-t // s) * c for t, s, c in zip(tiles, shares, costs, strict=True))

    shares = share_programs(tiles, costs, programs)
    assert sum(shares) <= programs
    assert all(1 <= s <= t for s, t in zip(shares, tiles, strict=True))
    if len(tiles) == 1:
        assert shares == [min(tiles[0], programs)]
    if not tiles:
        assert shares == []
        return
    if programs <= 12:
        splits = itertools.product(*(range(1, t + 1) for t in tiles))
        best = min(finish(s) for s in splits if sum(s) <= programs)
        assert finish(shares) == best
    # Never slower than each phase on every multiprocessor, one after another.
    assert finish(shares) <= sum(-(-t // programs) * c for t, c in zip(tiles, costs, strict=True))
