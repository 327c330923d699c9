"""Quick GPU check: correctness of every algorithm and direction, and a few timings vs cuDNN."""

import time

import torch
import triton

import rtdnn
from rtdnn import reference as R

torch.manual_seed(0)
dev = "cuda"
print(torch.__version__, triton.__version__, torch.cuda.get_device_name())


def check(shape_x, shape_w, dtype, cl, **kw):
    x = torch.randn(shape_x, device=dev, dtype=dtype)
    w = torch.randn(shape_w, device=dev, dtype=dtype) * 0.1
    if cl:
        x = x.movedim(1, -1).contiguous().movedim(-1, 1)
        w = w.movedim(1, -1).contiguous().movedim(-1, 1)
    tol = {torch.float32: 2e-3, torch.bfloat16: 2e-2, torch.float16: 3e-3}[dtype]
    y = rtdnn.conv_forward(x, w, **kw)
    dy = torch.randn_like(y)
    for algo in ["IMPLICIT_GEMM", "GEMM"]:
        y = rtdnn.conv_forward(x, w, algo=algo, **kw)
        e1 = R.rel_error(y, R.conv_forward(x, w, **kw))
        dx = rtdnn.conv_backward_data(dy, w, x.shape, algo=algo, **kw)
        e2 = R.rel_error(dx, R.conv_backward_data(dy, w, x.shape, **kw))
        dw = rtdnn.conv_backward_filter(x, dy, w.shape, algo=algo, **kw)
        e3 = R.rel_error(dw, R.conv_backward_filter(x, dy, w.shape, **kw))
        ok = max(e1, e2, e3) < tol
        print(
            f"{algo:24s} {dtype} cl={cl} {shape_x} {shape_w} {kw}: {e1:.1e} {e2:.1e} {e3:.1e} {'OK' if ok else 'FAIL'}"
        )
    dw = rtdnn.conv_backward_filter(x, dy, w.shape, algo="IMPLICIT_GEMM_SPLIT_K", **kw)
    e3 = R.rel_error(dw, R.conv_backward_filter(x, dy, w.shape, **kw))
    print(f"{'SPLIT_K':24s} {e3:.1e} {'OK' if e3 < tol else 'FAIL'}")


t0 = time.time()
check((2, 16, 9, 9), (32, 16, 3, 3), torch.bfloat16, True, padding=1)
check((2, 16, 9, 9), (32, 16, 3, 3), torch.float32, False, padding=1, stride=2)
check((2, 8, 5, 6, 7), (8, 2, 3, 3, 3), torch.float16, True, padding=1, groups=4)
check((3, 24, 17), (12, 24, 5), torch.float32, True, padding=3, dilation=2, mode="convolution")
print("checks took", time.time() - t0)

layers = [
    (64, 64, 64, 56, 3, 1, 1),
    (64, 256, 64, 56, 1, 1, 0),
    (64, 128, 128, 28, 3, 1, 1),
    (64, 256, 256, 14, 3, 1, 1),
    (64, 512, 512, 7, 3, 1, 1),
    (64, 3, 64, 224, 7, 2, 3),
]
for dtype in [torch.bfloat16]:
    for n, c, k, hw, r, s, p in layers:
        x = torch.randn(n, c, hw, hw, device=dev, dtype=dtype).to(memory_format=torch.channels_last)
        w = (torch.randn(k, c, r, r, device=dev, dtype=dtype) * 0.05).to(
            memory_format=torch.channels_last
        )
        torch.backends.cudnn.benchmark = True
        y_ref = torch.nn.functional.conv2d(x, w, stride=s, padding=p)
        dy = torch.randn_like(y_ref)
        flops = 2 * n * k * c * r * r * y_ref.shape[2] * y_ref.shape[3]
        res = []
        for name, ours, theirs in [
            (
                "fwd",
                lambda: rtdnn.conv_forward(x, w, stride=s, padding=p),
                lambda: torch.nn.functional.conv2d(x, w, stride=s, padding=p),
            ),
            (
                "bwdd",
                lambda: rtdnn.conv_backward_data(dy, w, x.shape, stride=s, padding=p),
                lambda: torch.ops.aten.convolution_backward(
                    dy, x, w, None, [s, s], [p, p], [1, 1], False, [0, 0], 1, [True, False, False]
                ),
            ),
            (
                "bwdf",
                lambda: rtdnn.conv_backward_filter(x, dy, w.shape, stride=s, padding=p),
                lambda: torch.ops.aten.convolution_backward(
                    dy, x, w, None, [s, s], [p, p], [1, 1], False, [0, 0], 1, [False, True, False]
                ),
            ),
        ]:
            ours()
            t_o = triton.testing.do_bench(ours, warmup=25, rep=100, return_mode="median")
            t_t = triton.testing.do_bench(theirs, warmup=25, rep=100, return_mode="median")
            res.append(f"{name} {t_o:.3f}/{t_t:.3f}ms={t_t / t_o:.2f}x {flops / t_o / 1e9:.0f}TF")
        print(f"n{n} c{c} k{k} hw{hw} r{r} s{s}:", " | ".join(res), flush=True)
