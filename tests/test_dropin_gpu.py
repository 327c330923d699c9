"""A model converted by rtdnn.convert trains under DistributedDataParallel with NCCL on two
GPUs: every rank sees the same gradients, equal to the unconverted model's (strict float32).
Run with RTDNN_GPU_TESTS=1 on a machine with at least two CUDA GPUs."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from _ddp import run_and_check
from conftest import gpu_only

pytestmark = gpu_only(
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs"),
    pytest.mark.skipif(not dist.is_nccl_available(), reason="torch built without NCCL"),
)


def test_converted_model_trains_under_ddp_with_nccl(tmp_path):
    run_and_check("nccl", str(tmp_path), tol=1e-5)
