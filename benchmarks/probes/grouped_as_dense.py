"""Grouped convolutions with few channels per group run as grouped convolutions of wider
"super-groups" (S channels, a block-diagonal filter with zeros between the groups), through
the GEMM algorithms, beside DIRECT and cuDNN: whether the inflated FLOPs (S / channels per
group) cost less than the narrow groups do. The grouped suite, bf16, channels-last.
    PYTHONPATH=src python benchmarks/probes/grouped_as_dense.py [LAYER_PREFIX]
WIDTHS (default "16 32 64 128") sets the super-group widths tried, DIRECTIONS the directions;
with RTDNN_TMA=1 the tile tuner also tries the TMA kernels (kernels/conv_tma.py). PACK_BELOW
overrides algos.implicit_gemm.PACK_BELOW: at 128, the wide layers' forward and backward-filter
fold the filter taps into one reduction or column index (each tile then reads dy for several
taps, not once per tap), which is how DIRECT's "gemm" tiles could take the filter gradient.
"""

import os
import sys

import torch

from rtdnn import ops
from rtdnn.bench.conv import layer_calls, load_suite
from rtdnn.core.timing import device_time_ms

WIDTHS = [int(w) for w in os.environ.get("WIDTHS", "16 32 64 128").split()]
if "PACK_BELOW" in os.environ:
    import rtdnn.algos.implicit_gemm as implicit_gemm

    implicit_gemm.PACK_BELOW = int(os.environ["PACK_BELOW"])
DIRECTIONS = os.environ.get("DIRECTIONS", "forward backward_data backward_filter").split()


def widen(w: torch.Tensor, groups: int, width: int) -> torch.Tensor:
    """(K, C/groups, R, S) -> (K, width, R, S): each filter placed at its group's channels
    within its super-group of `width` channels, zeros elsewhere."""
    k, cpg = w.shape[:2]
    per = width // cpg  # groups per super-group
    g = torch.arange(k, device=w.device) // (k // groups)
    wide = w.new_zeros((k, width, *w.shape[2:]))
    idx = (g % per)[:, None] * cpg + torch.arange(cpg, device=w.device)[None, :]
    wide.scatter_(1, idx[:, :, None, None].expand(-1, -1, *w.shape[2:]), w)
    return wide.movedim(1, -1).contiguous().movedim(-1, 1)


def call(direction: str, x, wide, dy, args: dict, algo: str):
    """The direction's rtdnn call on the widened problem."""
    if direction == "forward":
        return lambda: ops.conv_forward(x, wide, **args, algo=algo)
    if direction == "backward_data":
        return lambda: ops.conv_backward_data(dy, wide, x.shape, **args, algo=algo)
    return lambda: ops.conv_backward_filter(x, dy, wide.shape, **args, algo=algo)


def narrow(dw: torch.Tensor, groups: int, cpg: int) -> torch.Tensor:
    """widen's inverse on a filter gradient: each filter's own group's channels."""
    k, width = dw.shape[:2]
    g = torch.arange(k, device=dw.device) // (k // groups)
    idx = (g % (width // cpg))[:, None] * cpg + torch.arange(cpg, device=dw.device)
    return dw.gather(1, idx[:, :, None, None].expand(-1, -1, *dw.shape[2:]))


def main() -> None:
    prefix = sys.argv[1] if len(sys.argv) > 1 else ""
    for layer in load_suite("grouped"):
        if not layer["name"].startswith(prefix):
            continue
        groups, c = layer["groups"], layer["c"]
        cpg = c // groups
        for direction in DIRECTIONS:
            calls = layer_calls(layer, direction, torch.bfloat16, None)
            x, w, dy = calls.x, calls.w, calls.dy
            cudnn = device_time_ms(calls.theirs) * 1e3
            auto = device_time_ms(calls.ours) * 1e3
            line = f"{layer['name']:24s} {direction:15s} cudnn {cudnn:7.1f} us  auto {auto:7.1f}"
            ref = calls.expected.float()
            for width in WIDTHS:
                if width < cpg or c % width:
                    continue
                wide = widen(w, groups, width)
                args = dict(calls.args, groups=c // width)
                algos = ["IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM"]
                if direction == "backward_filter":
                    algos.append("IMPLICIT_GEMM_SPLIT_K")
                for algo in algos:
                    fn = call(direction, x, wide, dy, args, algo)
                    try:
                        out = fn()
                        if direction == "backward_filter":
                            out = narrow(out, groups, cpg)
                        err = ((out.float() - ref).norm() / ref.norm()).item()
                        us = device_time_ms(fn) * 1e3
                        line += f" | S{width} {algo[:14]} {us:7.1f} us "
                        line += f"({cudnn / us:.2f}x, err {err:.0e})"
                    except Exception as e:  # noqa: BLE001
                        line += f" | S{width} {algo[:14]} failed: {str(e)[:60]}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
