"""Compile the warp-specialized Hopper convolution (kernels/conv_hopper.py and, for the
weight gradient, kernels/conv_hopper_filter.py) for sm_90 without a GPU, as the launches of
IMPLICIT_GEMM's Hopper tiles would, and report each variant's spills and shared memory
(Triton's bundled ptxas).

    PYTHONPATH=src python benchmarks/aot_compile_conv_hopper.py
"""

import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sm90_stub import activate, ptxas_log  # noqa: E402

activate()

import torch  # noqa: E402

from rtdnn.kernels import conv_hopper as ch  # noqa: E402
from rtdnn.kernels import conv_hopper_filter as chf  # noqa: E402

# (direction, batch, channels read, channels written, image side, filter, padding, dilation,
# stride)
CASES = [
    ("forward", 64, 256, 256, 14, 3, 1, 1, 2),
    ("forward", 64, 256, 256, 14, 3, 1, 1),
    ("forward", 64, 64, 64, 56, 3, 1, 1),
    ("backward_data", 64, 512, 512, 7, 3, 1, 1),
    ("backward_data", 64, 256, 128, 28, 3, 1, 1, 2),
    ("backward_data", 64, 1024, 512, 28, 1, 0, 1, 2),
    ("backward_data", 16, 128, 64, 224, 3, 1, 1),
    ("forward", 2, 64, 96, 9, 5, 3, 2),
    # Reduced channels not a multiple of 128 bytes: steps of 64-byte rows.
    ("forward", 32, 96, 96, 75, 3, 1, 1, 2),
    ("forward", 32, 288, 384, 35, 3, 0, 1, 2),
    ("backward_data", 32, 160, 96, 28, 3, 1, 1),
]


def report(kernel) -> str:
    """A compiled kernel's shared memory, spills, and whether ptxas serialized its MMAs."""
    log = ptxas_log(kernel)
    spills = re.findall(r"(\d+) bytes spill stores", log)
    serial = "SERIALIZED" if "C7515" in log or "serializ" in log.lower() else ""
    return f"smem={kernel.metadata.shared} spills={spills} {serial}"


def compile_case(
    direction,
    n,
    c_read,
    c_written,
    side,
    r,
    pad,
    dil,
    stride,
    block_n,
    beta,
    bias,
    dtype=torch.bfloat16,
    block_m=ch.BLOCK_M,
    depth=0,
    pingpong=False,
):
    """One launch's compilation; `depth` > 0: a 3-D convolution of images that deep (filter
    r x r x r, stride 1); `pingpong`: each consumer whole tiles in turn."""
    forward = direction == "forward"
    three_d = depth > 0
    out_side = (side + 2 * pad - dil * (r - 1) - 1) // stride + 1
    deep = (depth,) * three_d  # the depth dimension of 3-D images, none in 2-D
    read = torch.empty(n, *deep, side, side, c_read, dtype=dtype)
    written = torch.empty(n, *deep, out_side, out_side, c_written, dtype=dtype)
    k, c = (c_written, c_read) if forward else (c_read, c_written)
    taps = r ** (3 if three_d else 2)
    # Backward-data in float32 reads a filter copy with k innermost as (C, taps x K), its rows
    # the written channels as forward's; in 16 bits the filter as stored, its rows the k.
    reduced_rows = not forward and dtype != torch.float32
    w = torch.empty(c, taps * k, dtype=dtype) if not (forward or reduced_rows) else (
        torch.empty(k, taps * c, dtype=dtype))  # fmt: skip
    first = depth if three_d else n  # boxes of depth x rows x columns in 3-D
    box = ch.least_waste_box(first, out_side, out_side, block_m, halves=not pingpong)
    chunk = ch.chunk(dtype, c_read)  # 64-byte rows where the channels are not 128-byte ones
    w_block = [chunk, block_n] if reduced_rows else [block_n, chunk]
    one = [1] * three_d
    x_desc = ch.descriptor(read, read.shape, read.stride(), [*one, *box, chunk])
    w_desc = ch.descriptor(w, w.shape, w.stride(), w_block)
    y_block = [*one, *(box if pingpong else ch.half_box(box)), block_n]
    y_desc = ch.descriptor(written, written.shape, written.stride(), y_block)
    if forward:
        th = tw = ch.forward_taps(r, pad, dil)
    else:  # phase 1 of dx where stride 2, else phase 0
        th = tw = ch.data_phase_taps(r, pad, dil, stride, stride - 1)
    td = th if three_d else ch.TapRun(0, 0, 1, 0, 0)
    kernel = ch.conv_hopper_kernel.warmup(
        x_desc, x_desc, x_desc, x_desc, w_desc, y_desc, written, 1.0, 0.5, c_written,
        c_read // chunk, td.count * th.count * tw.count,
        k if not (forward or reduced_rows) else c, th.count * tw.count, tw.count,
        td.first, td.step_filter, th.first, tw.first, th.step_filter, tw.step_filter,
        td.shift, th.shift, tw.shift, td.step, th.step, tw.step, stride, stride, pad, r, r,
        1, 1, 1, 1, 1,
        STAGES=ch.stages_for(block_m, block_n, chunk, dtype.itemsize),
        W_REDUCED_ROWS=reduced_rows,
        STRIDED=forward and stride > 1, HAS_BIAS=bias, BETA_NONZERO=beta, RELU=bias,
        CONSUMER_REGS=ch.CONSUMER_REGISTERS, THREE_D=three_d, PINGPONG=pingpong, num_warps=4,
        maxnreg=ch.LAUNCH_REGISTERS, grid=(1,),
    )  # fmt: skip
    return report(kernel)


# (batch, channels in, filters, image side, filter, padding, stride, splits)
FILTER_CASES = [
    (64, 256, 256, 14, 3, 1, 1, 3),
    (64, 256, 256, 14, 3, 1, 1, 1),
    (64, 128, 128, 56, 3, 1, 2, 14),
    (64, 1024, 2048, 14, 1, 0, 2, 2),
]


def compile_filter_case(n, c, k, side, r, pad, stride, splits, beta, cooperative,
                        dtype=torch.bfloat16):  # fmt: skip
    out_side = (side + 2 * pad - (r - 1) - 1) // stride + 1
    x = torch.empty(n, side, side, c, dtype=dtype)
    dy = torch.empty(n, out_side, out_side, k, dtype=dtype)
    dw = torch.empty(k, r, r, c, dtype=dtype)
    ws = torch.empty(r * r, splits, k, c, dtype=torch.float32)
    tf32 = dtype == torch.float32
    box = ch.least_waste_box(n, out_side, out_side, chf.TF32_PIXELS if tf32 else chf.PIXELS)
    # Units of 64 filters or channels where the layer has no more.
    f_box = min(chf.BLOCK_F, max(k, 64)) // (2 if cooperative else 1)
    block_c, stages = (
        (chf.COOPERATIVE_BLOCK_C, chf.TF32_COOPERATIVE_STAGES if tf32 else chf.COOPERATIVE_STAGES)
        if cooperative
        else (min(chf.BLOCK_C, max(c, 64)), chf.TF32_STAGES if tf32 else chf.STAGES)
    )  # fmt: skip
    dy_desc = ch.descriptor(dy, dy.shape, dy.stride(), [*box, f_box])
    x_desc = ch.descriptor(x, x.shape, x.stride(), [*box, block_c])
    sk, sr, ss, sc = dw.stride()
    kernel = chf.conv_filter_hopper_kernel.warmup(
        dy_desc, x_desc, x_desc, x_desc, x_desc, dw, ws, 1.0, 0.5, 64, 2, 2, splits,
        4, 8, 4, 1, pad, pad, 1, 1, stride, stride, pad, r, k, c, sk, sc, sr, ss,
        STAGES=stages, COOPERATIVE=cooperative, STRIDED=stride > 1, BETA_NONZERO=beta,
        CONSUMER_REGS=chf.CONSUMER_REGISTERS, num_warps=4, maxnreg=chf.LAUNCH_REGISTERS,
        grid=(1,),
    )  # fmt: skip
    return report(kernel)


if __name__ == "__main__":
    if sys.argv[1:] == ["pingpong"]:  # the ping-pong tiles only
        for case in CASES:
            case = case if len(case) == 9 else (*case, 1)
            for block_n in (128, 64):
                for beta, bias in ((False, False), (True, True)):
                    print(case, f"ping-pong BN={block_n} beta={beta} bias+relu={bias}:",
                          compile_case(*case, block_n, beta, bias, pingpong=True),
                          flush=True)  # fmt: skip
        case = ("forward", 4, 64, 128, 28, 3, 1, 1, 1)
        print(case, "ping-pong 3-D depth 16 BN=128 beta+bias+relu:",
              compile_case(*case, 128, True, True, depth=16, pingpong=True))  # fmt: skip
        sys.exit()
    for case in FILTER_CASES:
        for cooperative in (False, True):
            for beta in (False, True):
                print("backward_filter", case, f"cooperative={cooperative} beta={beta}:",
                      compile_filter_case(*case, beta, cooperative), flush=True)  # fmt: skip
    for case in [*FILTER_CASES, (64, 64, 64, 56, 3, 1, 1, 4), (64, 64, 256, 56, 1, 0, 1, 1)]:
        for beta in (False, True):  # float32 in TF32 math: ping-pong units, 64 x 64 too
            print("backward_filter", case, f"float32 beta={beta}:",
                  compile_filter_case(*case, beta, False, torch.float32), flush=True)  # fmt: skip
            if min(case[1], case[2]) >= 256:  # and cooperative ones
                done = compile_filter_case(*case, beta, True, torch.float32)
                print("backward_filter", case, f"float32 cooperative beta={beta}:", done)
    for case in CASES[:5]:  # float32 in TF32 math: forward, backward-data on the filter copy
        case = case if len(case) == 9 else (*case, 1)
        for block_n in (128, 64):
            print(case, f"float32 BN={block_n} beta+bias+relu:",
                  compile_case(*case, block_n, True, True, torch.float32), flush=True)  # fmt: skip
    for direction, channels, depth in (("forward", 64, 16), ("backward_data", 96, 8)):
        case = (direction, 4, channels, 128, 28, 3, 1, 1, 1)  # 3-D, 3x3x3, stride 1
        for block_m in (ch.BLOCK_M, ch.BLOCK_M_WIDE):
            for block_n in (128, 64):
                print(case, f"3-D depth {depth} BM={block_m} BN={block_n} beta+bias+relu:",
                      compile_case(*case, block_n, True, True, block_m=block_m, depth=depth),
                      flush=True)  # fmt: skip
        print(
            case,
            f"3-D depth {depth} float32 BN=128 beta+bias+relu:",
            compile_case(*case, 128, True, True, torch.float32, depth=depth),
            flush=True,
        )
    for case in CASES:
        case = case if len(case) == 9 else (*case, 1)
        for block_m in (ch.BLOCK_M, ch.BLOCK_M_WIDE):
            for block_n in (128, 64):
                for beta, bias in ((False, False), (True, True)):
                    print(case, f"BM={block_m} BN={block_n} beta={beta} bias+relu={bias}:",
                          compile_case(*case, block_n, beta, bias, block_m=block_m),
                          flush=True)  # fmt: skip
