"""`rtdnn bench --model` smoke run without a GPU: conversion, inference and a training step of
the small CNN through the interpreter, and the converted output against PyTorch's."""

from __future__ import annotations

import pytest
import torch


@pytest.mark.slow
def test_model_bench_smoke(tmp_path, monkeypatch):
    """One smoke run (each run takes minutes in the interpreter) checks the eager, folded and
    compiled rows: each side compiled and timed in both kinds of step (through aot_eager here:
    Inductor's CPU compilation takes minutes), and one side whose compilation fails reported
    without stopping the run."""
    import rtdnn.bench.model as M

    real = torch.compile

    def broken(*args):
        raise RuntimeError("no compiler here")

    def compile_or_fail(net, mode=None):  # the converted model (traced by fx) fails
        return (
            broken
            if type(net).__module__.startswith("torch.fx")
            else real(net, backend="aot_eager")
        )

    monkeypatch.setattr(torch, "compile", compile_or_fail)
    result = M.run_model("small", out_dir=str(tmp_path), compile_mode="default")
    assert result["output_rel_diff"] < 1e-5
    assert result["replaced"]["Conv2d"] == 3 and result["replaced"]["BatchNorm2d"] == 3
    assert result["rtdnn_training_img_s"] > 0 and result["pytorch_training_img_s"] > 0
    # Inference with the batch norms folded, both sides: the stem's and the residual block's
    # first (its second feeds the residual add).
    assert result["folded"] == 2 and "folded_error" not in result
    folded = [result[f"{side}_folded_inference_img_s"] for side in ("rtdnn", "pytorch")]
    assert min(folded) > 0
    assert (
        "| inference, batch norms folded into convolutions (2) |"
        in (tmp_path / "model_small.md").read_text()
    )
    assert (tmp_path / "model_small.json").exists() and (tmp_path / "model_small.md").exists()
    for kind in ("inference", "training"):
        assert result[f"pytorch_compiled_{kind}_img_s"] > 0
        assert result[f"pytorch_compile_{kind}_s"] > 0
        assert "no compiler here" in result[f"rtdnn_compile_{kind}_error"]
        assert f"rtdnn_compiled_{kind}_img_s" not in result
    assert "rtdnn training under torch.compile failed: RuntimeError: no compiler here" in (
        M.markdown(result)
    )
    assert M.category("cudnn::bn_fw_tr_1C11_kernel_NHWC") == "normalization"
    assert M.category("brgemm_kernel") == "convolution"
    assert M.category("max_pool_forward_nhwc") == "pooling"
    assert M.category("vectorized_elementwise_kernel") == "activation"
    assert not torch.cuda.is_available() or result["training_ratio"] > 0


def test_model_names_and_direct_kernels_counted_as_convolution():
    from rtdnn.bench.model import MODELS, build, category

    assert {"efficientnet_b0", "mobilenet_v3_large", "convnext_tiny", "vit_b_16"} <= set(MODELS)
    for kernel in ("direct_forward_kernel", "depthwise_rows_kernel", "pack_filter_kernel"):
        assert category(kernel) == "convolution"
    assert category("attention_forward_kernel") == "attention"
    assert category("cudnn_generated_fort_native_sdpa_sm90") == "attention"
    with pytest.raises(ValueError, match="convnext_tiny"):
        build("vgg11")


def test_markdown_names_the_compile_rows_and_first_call_seconds():
    """A GPU run with compile_mode: the torch.compile rows sit under the eager and graph rows,
    named by mode, with their ratios and each side's seconds of first calls."""
    from rtdnn.bench.model import markdown

    r = {"model": "resnet50", "batch": 128, "dtype": "bf16", "device": "NVIDIA H100",
         "output_rel_diff": 1e-3, "compile_mode": "reduce-overhead"}  # fmt: skip
    for i, kind in enumerate(("inference", "training", "compiled_inference", "compiled_training")):
        r[f"pytorch_{kind}_img_s"], r[f"rtdnn_{kind}_img_s"] = 100.0 + i, 150.0 + i
    for side in ("pytorch", "rtdnn"):
        r[f"{side}_compile_inference_s"], r[f"{side}_compile_training_s"] = 12.0, 40.0
    lines = markdown(r).splitlines()
    assert "| inference, torch.compile (reduce-overhead) | 102.0 | 152.0 | 1.49 |" in lines
    assert "| training, torch.compile (reduce-overhead) | 103.0 | 153.0 | 1.49 |" in lines
    assert "| inference, CUDA graph | capture failed | capture failed | |" in lines
    assert any("rtdnn training 40 s" in line for line in lines)
    assert not any("calling thread" in line for line in lines)  # not measured: no row
    r["pytorch_calling_thread_training_img_s"] = 100.0
    r["rtdnn_calling_thread_training_img_s"] = 120.0
    lines = markdown(r).splitlines()
    assert "| training, backward on the calling thread | 100.0 | 120.0 | 1.20 |" in lines
    del r["compile_mode"]
    assert not any("torch.compile" in line for line in markdown(r).splitlines())
