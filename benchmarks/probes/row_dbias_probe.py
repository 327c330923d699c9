"""Which row-kernel tiles give a wrong layer-norm dbias on the GPU (a probe, not a test).
PYTHONPATH=src python benchmarks/probes/row_dbias_probe.py
"""

import dataclasses

import torch

from rtdnn import ops
from rtdnn import reference as R
from rtdnn.algos import norm as engine

default = engine.GPU_POLICY
for dtype in (torch.float32, torch.bfloat16):
    for d in (768, 1024, 1536, 2048):
        for pack in (1024, 2048, 4096, 8192):
            engine.GPU_POLICY = dataclasses.replace(default, row_pack=pack, row_pack_16bit=pack)
            engine.clear_plans()
            torch.manual_seed(0)
            x = torch.randn(256, d, device="cuda", dtype=dtype) + 1.0
            dy = torch.randn_like(x)
            w = torch.randn(d, device="cuda", dtype=dtype)
            b = torch.randn(d, device="cuda", dtype=dtype)
            _, mean, rstd = ops.layer_norm_forward(x, d, w, b)
            dx, dw, db = ops.layer_norm_backward(dy, x, d, mean, rstd, w)
            want = R.layer_norm_backward(dy, x, d, mean, rstd, w)
            got = (dx, dw, db)
            pairs = zip(got, want, strict=True)
            errs = [float((a.double().cpu() - r.cpu()).norm() / r.cpu().norm()) for a, r in pairs]
            t = engine.row_tiles(
                engine.geometry(x.shape, (0,), [x.stride()] * 4),
                x.element_size(),
                engine.GPU_POLICY,
            )
            bad = errs[2] > 1e-2 or errs[1] > 1e-2
            print(f"{str(dtype):15s} d={d:5d} pack={pack:5d} tile={t.block_r}x{t.block_k} "
                  f"warps={t.num_warps} dx={errs[0]:.1e} dw={errs[1]:.1e} db={errs[2]:.1e}"
                  f"{'  WRONG' if bad else ''}", flush=True)  # fmt: skip
engine.GPU_POLICY = default
