"""TF32 convolution with its operands stored so that the reduced dimension is contiguous
(K-major), against the channels-last layout the suites use, beside cuDNN in one process.

Hopper's TF32 tensor-core products read both operands K-major from shared memory. A
channels-last filter is K-major for forward (reduced over c) but not for backward-data
(reduced over k); backward-filter reduces over pixels, which neither channels-last x nor dy
has innermost. Triton then fills shared memory with 4-byte copies instead of 16-byte ones. This
probe measures what K-major operands would give, per layer, with the tile tuner on:

    backward_data:   the filter as given (channels-last) / the filter with k innermost
    backward_filter: x and dy as given (channels-last) / x and dy with the pixels innermost

    PYTHONPATH=src python benchmarks/probes/tf32_operand_layout.py [SUITE] [--layers a,b]
"""

import argparse

import torch

import rtdnn
from rtdnn import reference as R
from rtdnn.bench.conv import layer_calls, load_suite
from rtdnn.core.timing import device_time_ms


def k_innermost(w: torch.Tensor) -> torch.Tensor:
    """w (K, C, *R) stored with K innermost, then C, then the taps (the same values)."""
    nd = w.dim()
    order = [*range(2, nd), 1, 0]  # outermost first
    stored = w.permute(*order).contiguous()
    return stored.permute(*[order.index(d) for d in range(nd)])


def pixels_innermost(t: torch.Tensor) -> torch.Tensor:
    """t (N, C, *S) stored as (C, N, *S) contiguous: each channel's pixels in one run."""
    stored = t.transpose(0, 1).contiguous()
    return stored.transpose(0, 1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("suite", nargs="?", default="resnet50")
    parser.add_argument("--layers", default=None)
    parser.add_argument("--directions", default="backward_data,backward_filter")
    args = parser.parse_args()
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = True
    wanted = args.layers.split(",") if args.layers else None
    for direction in args.directions.split(","):
        print(f"\n{args.suite} {direction} TF32 (ms; ratio = cuDNN / rtdnn)", flush=True)
        print("| layer | cuDNN | as given | ratio | K-major | ratio | gain |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for layer in load_suite(args.suite):
            if wanted and layer["name"] not in wanted:
                continue
            c = layer_calls(layer, direction, torch.float32, None)
            ref = c.expected.double().cpu()
            base = device_time_ms(c.theirs)
            if direction == "backward_data":
                variants = [(c.dy, c.w), (c.dy, k_innermost(c.w))]

                def call(dy, w, c=c):
                    return rtdnn.conv_backward_data(
                        dy, w, c.x.shape, math="tf32", algo="IMPLICIT_GEMM", **c.args
                    )
            else:
                variants = [(c.x, c.dy), (pixels_innermost(c.x), pixels_innermost(c.dy))]

                def call(x, dy, c=c):
                    return rtdnn.conv_backward_filter(
                        x, dy, c.w.shape, math="tf32", algo="IMPLICIT_GEMM_SPLIT_K", **c.args
                    )

            times = []
            for a, b in variants:
                err = R.rel_error(call(a, b), ref)
                ms = device_time_ms(lambda a=a, b=b: call(a, b))  # noqa: B023
                times.append(ms)
                if err > 5e-3:
                    print(f"  {layer['name']}: rel err {err:.1e}", flush=True)
            print(
                f"| {layer['name']} | {base:.3f} | {times[0]:.3f} | {base / times[0]:.2f} | "
                f"{times[1]:.3f} | {base / times[1]:.2f} | {times[0] / times[1]:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
