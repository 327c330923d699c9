"""An experiment for the dense convolution on Hopper: the implicit GEMM warp-specialized in
Gluon, as the attention forward (kernels/attention_hopper.py). The pointer path's main loop
spends about 200 instructions a step on addresses and masks around 4 to 8 warp-group MMAs
(BENCHMARKS.md, "Where convolution falls short"); here a load partition of four warps does
that work (cp.async gathers of the input window, zero-filled outside the image, and a TMA
load of the filter tile) into a ring of shared-memory stages, while two consumer warp groups
only issue MMAs. A second design had no gather at all: one load warp brings, per step, a TMA
box of the input (the tile's output pixels as [images, rows, columns] shifted by the filter
tap, zeros outside the image from the hardware) that the MMAs read from shared memory as a
[pixels, channels] matrix. It became IMPLICIT_GEMM's kernel on Hopper
(src/rtdnn/kernels/conv_hopper.py), timed here as "rtdnn ms"; its probe versions (up to
b1d3ff7) looked slow because their output was allocated NCHW and converted, a transposing
copy inside every timed call (BENCHMARKS.md, "Convolution on Hopper: a warp-specialized
kernel").

Forward, stride 1, dilation 1, one group, channels-last 16-bit x (N, H, W, C) and filter
(K, R, S, C), C a multiple of BLOCK_K; y (N, OH, OW, K) channels-last.

    PYTHONPATH=src python benchmarks/probes/conv_gluon_probe.py compile   (no GPU: sm_90 PTX)
    PYTHONPATH=src python benchmarks/probes/conv_gluon_probe.py OUT_DIR   (GPU: check + time)
    PYTHONPATH=src ncu ... python benchmarks/probes/conv_gluon_probe.py profile LAYER VARIANT
    PYTHONPATH=src ncu ... python benchmarks/probes/conv_gluon_probe.py profile-cudnn LAYER
"""

from __future__ import annotations

import sys

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

#: Registers a thread: at launch (all warps) and per worker partition, by loader warps.
REGISTERS = {
    4: dict(maxnreg=168, CONSUMER_REGS=232, LOADER_REGS=80),
    8: dict(maxnreg=128, CONSUMER_REGS=160, LOADER_REGS=96),
}


@gluon.jit
def _loader(x_ptr, w_desc, a_smem, b_smem, ready, empty, M, H, W, C, OH, OW, pad_h, pad_w, S,
            steps, tiles, tiles_n):  # fmt: skip
    """Load partition: for each of this program's tiles, step t reads filter tap t // (C /
    BLOCK_K) and channel chunk t % (C / BLOCK_K): the input rows that tap links to the tile's
    output pixels (cp.async, zeros outside the image) and the filter tile (TMA). It runs
    ahead into the next tile as soon as stages free up."""
    BLOCK_M: gl.constexpr = a_smem.type.shape[1]
    BLOCK_K: gl.constexpr = a_smem.type.shape[2]
    BLOCK_N: gl.constexpr = b_smem.type.shape[1]
    STAGES: gl.constexpr = a_smem.type.shape[0]
    warps: gl.constexpr = gl.num_warps()
    # 8 channels (16 bytes) a thread, a warp 4 rows x 64 channels.
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 * 8 // BLOCK_K, BLOCK_K // 8],
                                            [warps, 1], [1, 0])  # fmt: skip
    cols = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, layout))
    chunks = C // BLOCK_K
    it = 0
    for tile in range(gl.program_id(0), tiles, gl.num_programs(0)):
        m0 = tile // tiles_n * BLOCK_M
        n0 = tile % tiles_n * BLOCK_N
        rows = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, layout))
        ow = rows % OW
        t = rows // OW
        oh = t % OH
        n = t // OH
        row_ok = rows < M
        base = (n * H + oh - pad_h) * W + ow - pad_w  # input pixel of tap (0, 0)
        for step in range(steps):
            stage = it % STAGES
            mbarrier.wait(empty.index(stage), ((it // STAGES) & 1) ^ 1)
            tap = step // chunks
            c0 = (step - tap * chunks) * BLOCK_K
            r = tap // S
            s = tap - r * S
            ih = oh + r - pad_h
            iw = ow + s - pad_w
            ok = row_ok & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
            offs = (base + r * W + s) * C + c0
            ptrs = x_ptr + gl.expand_dims(offs, 1) + gl.expand_dims(cols, 0)
            async_copy.async_copy_global_to_shared(a_smem.index(stage), ptrs,
                                                   mask=gl.expand_dims(ok, 1))  # fmt: skip
            async_copy.mbarrier_arrive(ready.index(stage), increment_count=False)
            mbarrier.expect(ready.index(stage), w_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(w_desc, [n0, tap * C + c0], ready.index(stage),
                                            b_smem.index(stage))  # fmt: skip
            it += 1


@gluon.jit
def _consumer(half: gl.constexpr, a_smem, b_smem, c_smem, ready, empty, y_desc, steps, tiles,
              tiles_n):  # fmt: skip
    """One consumer warp group: rows half * BLOCK_M / 2 on of each tile, MMAs only; one step's
    product stays in flight while the next is issued. A tile's store overlaps the next
    tile's products."""
    BLOCK_M: gl.constexpr = a_smem.type.shape[1]
    BLOCK_N: gl.constexpr = b_smem.type.shape[1]
    STAGES: gl.constexpr = a_smem.type.shape[0]
    HALF: gl.constexpr = BLOCK_M // 2
    warps: gl.constexpr = gl.num_warps()
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[warps, 1], instr_shape=[16, BLOCK_N, 16]
    )
    out = c_smem.index(half)
    it = 0
    for tile in range(gl.program_id(0), tiles, gl.num_programs(0)):
        m0 = tile // tiles_n * BLOCK_M
        n0 = tile % tiles_n * BLOCK_N
        acc = gl.zeros([HALF, BLOCK_N], gl.float32, acc_layout)
        for step in range(steps):
            stage = it % STAGES
            mbarrier.wait(ready.index(stage), (it // STAGES) & 1)
            a = a_smem.index(stage).slice(half * HALF, HALF)
            acc = warpgroup_mma(a, b_smem.index(stage).permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma_wait(1, deps=(acc,))
            mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES), count=1, pred=step > 0)
            it += 1
        acc = warpgroup_mma_wait(0, deps=(acc,))
        mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES), count=1)
        tma.store_wait(0)  # the previous tile's store has read the buffer
        out.store(acc.to(y_desc.dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(y_desc, [m0 + half * HALF, n0], out)
    tma.store_wait(0)


@gluon.jit
def conv_forward_ws_kernel(
    x_ptr, w_desc, y_desc, M, H, W, C, OH, OW, pad_h, pad_w, R, S, tiles_n,
    BLOCK_M: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr,
    LOADERS: gl.constexpr, CONSUMER_REGS: gl.constexpr, LOADER_REGS: gl.constexpr,
):  # fmt: skip
    """Grid (programs,): each program takes tiles pid, pid + programs, ... of the
    cdiv(M, BLOCK_M) x tiles_n tiles (the column tile fastest, so that consecutive tiles read
    the same input rows). num_warps 4 (a consumer; the second and the loader are workers).
    w_desc: the filter as a (K, R*S*C) matrix in [BLOCK_N, BLOCK_K] blocks; y_desc: y as an
    (M, K) matrix in [BLOCK_M / 2, BLOCK_N] blocks."""
    dtype: gl.constexpr = w_desc.dtype
    a_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_K], dtype)
    a_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, BLOCK_K], a_layout)
    b_smem = gl.allocate_shared_memory(dtype, [STAGES] + w_desc.block_type.shape, w_desc.layout)
    c_smem = gl.allocate_shared_memory(dtype, [2] + y_desc.block_type.shape, y_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        # The loader's threads each arrive when their copies land, and its TMA's arrival.
        mbarrier.init(ready.index(i), count=32 * LOADERS + 1)
        mbarrier.init(empty.index(i), count=2)
    steps = R * S * (C // BLOCK_K)
    tiles = gl.cdiv(M, BLOCK_M) * tiles_n
    consumer = (a_smem, b_smem, c_smem, ready, empty, y_desc, steps, tiles, tiles_n)
    gl.warp_specialize(
        [(_consumer, (0,) + consumer), (_consumer, (1,) + consumer),
         (_loader, (x_ptr, w_desc, a_smem, b_smem, ready, empty, M, H, W, C, OH, OW,
                    pad_h, pad_w, S, steps, tiles, tiles_n))],
        [4, LOADERS],
        [CONSUMER_REGS, LOADER_REGS],
    )  # fmt: skip


def _gl_dtype(t: torch.Tensor):
    return gl.bfloat16 if t.dtype == torch.bfloat16 else gl.float16


def conv_forward_ws(x, w, padding, block_n=128, stages=4, loaders=4, persistent=True,
                    block_m=128, block_k=64):  # fmt: skip
    """y = conv2d(x, w, padding) (stride 1) through the warp-specialized kernel: one program
    a multiprocessor looping over tiles (persistent), or one a tile."""
    n, c, h, wd = x.shape
    k, _, r, s = w.shape
    oh, ow = h + 2 * padding - r + 1, wd + 2 * padding - s + 1
    # Allocated channels-last as such: .to(memory_format=...) of an NCHW tensor would add a
    # transposing copy of the output to every timed call.
    y = torch.empty(n, oh, ow, k, dtype=x.dtype, device=x.device).permute(0, 3, 1, 2)
    m = n * oh * ow
    w2 = w.permute(0, 2, 3, 1).reshape(k, r * s * c)  # a channels-last filter: a view
    wl = gl.NVMMASharedLayout.get_default_for([block_n, block_k], _gl_dtype(x))
    yl = gl.NVMMASharedLayout.get_default_for([block_m // 2, block_n], _gl_dtype(x))
    w_desc = TensorDescriptor(w2, list(w2.shape), list(w2.stride()), [block_n, block_k], wl)
    y2 = y.permute(0, 2, 3, 1).reshape(m, k)
    y_desc = TensorDescriptor(y2, [m, k], list(y2.stride()), [block_m // 2, block_n], yl)
    tiles_n = triton.cdiv(k, block_n)
    tiles = triton.cdiv(m, block_m) * tiles_n
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    grid = (min(tiles, sms) if persistent else tiles,)
    conv_forward_ws_kernel[grid](
        x, w_desc, y_desc, m, h, wd, c, oh, ow, padding, padding, r, s, tiles_n,
        BLOCK_M=block_m, BLOCK_K=block_k, STAGES=stages, LOADERS=loaders,
        **REGISTERS[loaders], num_warps=4,
    )  # fmt: skip
    return y


def compile_offline() -> None:
    import os
    import re

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from sm90_stub import activate, ptxas_log

    activate()
    for bn, stages, loaders, _ in VARIANTS:
        k, c, bm, bk = 256, 256, 128, 64
        x = torch.empty(2, 14, 14, c, dtype=torch.bfloat16)
        w2 = torch.empty(k, 9 * c, dtype=torch.bfloat16)
        y2 = torch.empty(2 * 196, k, dtype=torch.bfloat16)
        wl = gl.NVMMASharedLayout.get_default_for([bn, bk], gl.bfloat16)
        yl = gl.NVMMASharedLayout.get_default_for([bm // 2, bn], gl.bfloat16)
        w_desc = TensorDescriptor(w2, list(w2.shape), list(w2.stride()), [bn, bk], wl)
        y_desc = TensorDescriptor(y2, list(y2.shape), list(y2.stride()), [bm // 2, bn], yl)
        kernel = conv_forward_ws_kernel.warmup(
            x, w_desc, y_desc, 392, 14, 14, c, 14, 14, 1, 1, 3, 3, k // bn, BLOCK_M=bm, BLOCK_K=bk,
            STAGES=stages, LOADERS=loaders, **REGISTERS[loaders], num_warps=4, grid=(1,),
        )  # fmt: skip
        log = ptxas_log(kernel)
        regs = re.findall(r"Used (\d+) registers", log)
        spills = re.findall(r"(\d+) bytes spill stores", log)
        smem = kernel.metadata.shared
        print(f"BN={bn} stages={stages} loaders={loaders}: regs={regs} spill={spills} smem={smem}")
        warn = [line for line in log.splitlines() if "arn" in line]
        if warn:
            print("  ", warn[:3])


# (name, batch, channels in = out, image side): ResNet-50's 3x3 layers at batch 64, and VGG-16's.
LAYERS = [
    ("l1.x.conv2", 64, 64, 56), ("l2.x.conv2", 64, 128, 28), ("l3.x.conv2", 64, 256, 14),
    ("l4.x.conv2", 64, 512, 7), ("vgg conv256_56", 16, 256, 56), ("vgg conv512_28", 16, 512, 28),
]  # fmt: skip
# (BLOCK_N (at most the layer's channels), STAGES, loader warps, persistent)
VARIANTS = [(128, 4, 8, False), (128, 4, 8, True), (128, 4, 4, True), (256, 3, 4, True)]


def _variants() -> list[tuple[str, object]]:
    """(label, conv(x, w, padding, bn)) for the timing table: the gather kernel's variants
    (the TMA-per-tap design is the product's kernel, timed as "rtdnn ms")."""
    return [
        (f"gather n{bn} s{stages} l{loaders}{' p' if persistent else ''}",
         lambda x, w, c, v=(bn, stages, loaders, persistent): conv_forward_ws(
             x, w, 1, min(v[0], c), v[1], v[2], v[3]))
        for bn, stages, loaders, persistent in VARIANTS
    ]  # fmt: skip


def gpu(out_dir: str) -> None:
    """Each layer: correctness against cuDNN, then times of cuDNN, rtdnn's shipped forward and
    each variant (median device time of CUDA-graph replays, L2 flushed), TFLOP/s."""
    import os

    os.makedirs(out_dir, exist_ok=True)
    md = open(os.path.join(out_dir, "conv_gluon_probe.md"), "w")

    def log(msg):
        print(msg, flush=True)
        md.write(msg + "\n")
        md.flush()

    torch.backends.cudnn.benchmark = True
    log(f"{torch.cuda.get_device_name()}, bf16, channels-last, 3x3 stride 1 padding 1")
    names = " | ".join(label for label, _ in _variants())
    log(f"| layer | cuDNN ms | rtdnn ms | {names} | best TFLOP/s | best / cuDNN | err |")
    log("|---|---:|---:|" + "---:|" * len(_variants()) + "---:|---:|---|")
    torch.manual_seed(0)
    for layer in LAYERS:
        time_layer(*layer, log)


def time_layer(name: str, n: int, c: int, side: int, log) -> None:
    """One layer's row: cuDNN, rtdnn's shipped forward, each variant."""
    import torch.nn.functional as F

    import rtdnn
    from rtdnn.core.timing import device_time_ms

    x = torch.randn(n, c, side, side, device="cuda", dtype=torch.bfloat16)
    x = x.to(memory_format=torch.channels_last)
    w = (torch.randn(c, c, 3, 3, device="cuda") / (3 * c**0.5)).to(torch.bfloat16)
    w = w.to(memory_format=torch.channels_last)
    flops = 2 * n * side * side * c * c * 9
    ref = F.conv2d(x, w, padding=1)
    times = [device_time_ms(lambda: F.conv2d(x, w, padding=1), graph=True)]
    times.append(device_time_ms(lambda: rtdnn.ops.conv_forward(x, w, padding=1), graph=True))
    errs = []
    for label, conv in _variants():
        try:
            y = conv(x, w, c)
            torch.cuda.synchronize()
            errs.append(((y.float() - ref.float()).norm() / ref.float().norm()).item())
            times.append(device_time_ms(lambda conv=conv: conv(x, w, c), graph=True))
        except Exception as ex:  # noqa: BLE001
            log(f"{name} {label} FAILED {type(ex).__name__}: {ex}"[:300])
            errs.append(float("nan"))
            times.append(float("inf"))
    best = min(times[2:])
    log(f"| {name} | " + " | ".join(f"{t:.4f}" for t in times)
        + f" | {flops / best / 1e9:.0f} | {times[0] / best:.2f} | "
        + " ".join(f"{e:.1e}" for e in errs) + " |")  # fmt: skip


def profile_one(layer: int, variant: int) -> None:
    """One call of LAYERS[layer] with VARIANTS[variant], for ncu."""
    _, n, c, side = LAYERS[layer]
    bn, stages, loaders, persistent = VARIANTS[variant]
    x = torch.randn(n, c, side, side, device="cuda", dtype=torch.bfloat16)
    x = x.to(memory_format=torch.channels_last)
    w = torch.randn(c, c, 3, 3, device="cuda", dtype=torch.bfloat16)
    w = w.to(memory_format=torch.channels_last)
    conv_forward_ws(x, w, 1, min(bn, c), stages, loaders, persistent)
    torch.cuda.synchronize()


if __name__ == "__main__":
    if sys.argv[1:] == ["compile"]:
        compile_offline()
    elif sys.argv[1] == "profile":  # profile LAYER VARIANT
        profile_one(int(sys.argv[2]), int(sys.argv[3]))
    elif sys.argv[1] == "profile-cudnn":  # profile-cudnn LAYER: cuDNN's heuristic choice
        import torch.nn.functional as F

        _, n, c, side = LAYERS[int(sys.argv[2])]
        x = torch.randn(n, c, side, side, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(c, c, 3, 3, device="cuda", dtype=torch.bfloat16)
        cl = torch.channels_last
        F.conv2d(x.to(memory_format=cl), w.to(memory_format=cl), padding=1)
        torch.cuda.synchronize()
    else:
        gpu(sys.argv[1])
