"""Host microseconds of one ViT-B/16 encoder block and of its parts (multi-head attention,
Linear, LayerNorm, GELU, and the plain ops under them), torchvision's beside its rtdnn
conversion, on one image (197 tokens) so that the GPU waits on the host; then a Python
profile of the converted block's training step. See host_timing.host_us for how the host's
own cost is separated from GPU time.
    PYTHONPATH=src python benchmarks/probes/vit_block_host.py [PROFILE_PATH]
"""

import sys

import torch
from host_timing import forward_only, host_us, train_step
from torchvision.models.vision_transformer import EncoderBlock

import rtdnn
from rtdnn import ops

dev = "cuda"
torch.manual_seed(0)
block = EncoderBlock(12, 768, 3072, 0.0, 0.0).to(dev)
ours, _ = rtdnn.convert(block)
x = torch.randn(1, 197, 768, device=dev, requires_grad=True)
xb = x.detach().bfloat16()


def module_pairs():
    """(name, torch module, rtdnn module) for the block's parts."""
    yield "block", block, ours
    yield "attention", block.self_attention, ours.self_attention
    yield "linear 768->3072", block.mlp[0], ours.mlp[0]
    yield "layer norm", block.ln_1, ours.ln_1
    yield "gelu", block.mlp[1], ours.mlp[1]


def mha(m):
    def call(t):
        return m(t, t, t, need_weights=False)[0]

    return call


w = torch.randn(3072, 768, device=dev, dtype=torch.bfloat16)
bias = torch.randn(3072, device=dev, dtype=torch.bfloat16)
dy = torch.randn(197, 3072, device=dev, dtype=torch.bfloat16)
xr = xb.view(197, 768)
q = torch.randn(1, 12, 197, 64, device=dev, dtype=torch.bfloat16)
out, lse = ops.attention.attention_forward(q, q, q, None, False, 0.125, False)
rows = []
for name, theirs, mine in module_pairs():
    if name == "attention":
        theirs, mine = mha(theirs), mha(mine)
    rows += [
        (f"torch {name} train step", train_step(theirs, x)),
        (f"rtdnn {name} train step", train_step(mine, x)),
        (f"torch {name} forward (grad)", forward_only(theirs, x)),
        (f"rtdnn {name} forward (grad)", forward_only(mine, x)),
    ]
rows += [
    ("torch F.linear", lambda: torch.nn.functional.linear(xr, w, bias)),
    ("rtdnn ops.linear", lambda: ops.linear(xr, w, bias)),
    ("torch mm (backward data)", lambda: dy @ w),
    ("rtdnn ops.linear_backward_data", lambda: ops.linear_backward_data(dy, w)),
    ("torch mm (backward weight)", lambda: dy.t() @ xr),
    ("rtdnn ops.linear_backward_weight", lambda: ops.linear_backward_weight(xr, dy)),
    ("torch sum (backward bias)", lambda: dy.sum(0)),
    ("rtdnn ops.linear_backward_bias", lambda: ops.linear_backward_bias(dy)),
    ("rtdnn attention_forward op", lambda: ops.attention.attention_forward(
        q, q, q, None, False, 0.125, False)),
    ("rtdnn attention_backward op", lambda: ops.attention.attention_backward(
        q, q, q, q, out, lse, None, False, 0.125, False)),
    ("torch.empty", lambda: torch.empty(64, device=dev)),
]  # fmt: skip
for name, fn in rows:
    try:
        host, gpu = host_us(fn, calls=50, reps=10)
        print(f"{name:40s} {host:8.1f} us  (GPU span {gpu:7.1f} us)", flush=True)
    except Exception as e:  # one broken row must not hide the others
        print(f"{name:40s} failed: {type(e).__name__}: {e}", flush=True)

if len(sys.argv) > 1:
    import cProfile
    import pstats

    step = train_step(ours, x)
    for _ in range(20):
        step()
    torch.cuda.synchronize()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(300):
        step()
    pr.disable()
    with open(sys.argv[1], "w") as f:
        st = pstats.Stats(pr, stream=f)
        st.sort_stats("tottime").print_stats(60)
        st.sort_stats("cumulative").print_stats(80)
