"""grid_sample's forward kernel over its tile choices (points per program, channels per step,
warps) on the bench's shapes, beside torch's, in one process: which tile the op should take.
    PYTHONPATH=src python benchmarks/probes/grid_sample_sweep.py
"""

import torch
import torch.nn.functional as F
import triton

from rtdnn.bench.grid_sample import make_theta
from rtdnn.core.timing import copy_bandwidth, device_time_ms
from rtdnn.kernels import spatial_transformer as k
from rtdnn.ops import spatial_transformer as st


def run(x, grid, mode, block, block_c, warps):
    N, C = x.shape[:2]
    out_sp = tuple(grid.shape[1:-1])
    y = torch.empty((N, C, *out_sp), dtype=x.dtype, device=x.device).to(
        memory_format=torch.channels_last
        if x.is_contiguous(memory_format=torch.channels_last) and x.dim() == 4
        else torch.contiguous_format
    )
    ID, IH, IW = st._spatial(x.shape[2:])
    _, OH, OW = st._spatial(out_sp)
    P = st._numel(out_sp)

    def call():
        k.grid_sample_kernel[(N, triton.cdiv(P, block))](
            x, grid, y, C, P, OH, OW, ID, IH, IW,
            *st._strides5(x), *st._grid_strides(grid), *st._strides5(y),
            MODE=st.MODES[mode], PADDING=0, ALIGN=False, THREE_D=x.dim() == 5,
            BLOCK=block, BLOCK_C=block_c, num_warps=warps,
        )  # fmt: skip

    return call, y


NCHW_TILES = [(128, 1, 4), (128, 2, 4), (128, 4, 4), (256, 1, 8), (256, 2, 4), (64, 4, 4),
              (64, 8, 4)]  # fmt: skip
NHWC_TILES = [(128, 8, 8), (64, 16, 4), (64, 16, 8), (32, 32, 4), (32, 32, 8), (64, 32, 8),
              (16, 64, 4)]  # fmt: skip


def main():
    copy = copy_bandwidth()
    print(f"copy {copy:.0f} GB/s")
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 64, 128, 128, device="cuda")
    g = F.affine_grid(make_theta(64, 2, gen).cuda(), list(x.shape), align_corners=False)
    x3 = torch.randn(8, 32, 64, 64, 64, device="cuda")
    g3 = F.affine_grid(make_theta(8, 3, gen).cuda(), list(x3.shape), align_corners=False)
    nhwc = x.to(memory_format=torch.channels_last)
    cases = [
        ("bilinear NCHW, rotated", x, g, "bilinear", NCHW_TILES),
        ("nearest NCHW, rotated", x, g, "nearest", NCHW_TILES),
        ("bilinear NHWC, rotated", nhwc, g, "bilinear", NHWC_TILES),
        ("nearest NHWC, rotated", nhwc, g, "nearest", NHWC_TILES),
        ("trilinear, rotated", x3, g3, "bilinear", NCHW_TILES[:5]),
    ]
    for name, x, g, mode, tiles in cases:
        ref = F.grid_sample(x, g, mode=mode, align_corners=False)
        nbytes = 2 * x.numel() * 4 + g.numel() * 4
        torch_ms = device_time_ms(
            lambda x=x, g=g, mode=mode: F.grid_sample(x, g, mode=mode, align_corners=False)
        )
        print(f"{name}: torch {torch_ms:.3f} ms {nbytes / torch_ms / 1e6 / copy * 100:.0f}% copy")
        for block, block_c, warps in tiles:
            call, y = run(x, g, mode, block, block_c, warps)
            call()
            err = ((y - ref).norm() / ref.norm()).item()
            ms = device_time_ms(call)
            print(
                f"  BLOCK {block:3d} BLOCK_C {block_c:2d} warps {warps}: {ms:.3f} ms "
                f"{nbytes / ms / 1e6 / copy * 100:.0f}% copy, "
                f"ratio {torch_ms / ms:.2f}, err {err:.1e}",
                flush=True,
            )


if __name__ == "__main__":
    main()
