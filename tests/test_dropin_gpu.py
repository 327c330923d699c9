"""A model converted by rtdnn.convert trains under DistributedDataParallel with NCCL on two
GPUs: every rank sees the same gradients, equal to the unconverted model's (strict float32).
Run with RTDNN_GPU_TESTS=1 on a machine with at least two CUDA GPUs."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from _ddp import run_and_check

pytestmark = [
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs"),
    pytest.mark.skipif(
        os.environ.get("TRITON_INTERPRET") == "1", reason="kernels are interpreted: see README"
    ),
    pytest.mark.skipif(not dist.is_nccl_available(), reason="torch built without NCCL"),
    pytest.mark.gpu,
]


def test_converted_model_trains_under_ddp_with_nccl(tmp_path):
    run_and_check("nccl", str(tmp_path), tol=1e-5)
