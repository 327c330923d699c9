"""Squeeze-and-excitation blocks on the GPU: rtdnn's one op (rtdnn.nn.SqueezeExcitation) against
the same block in PyTorch (torchvision's forward: pool, two 1x1 convolutions, activations,
multiply), bf16 channels-last at EfficientNet-B0's and MobileNetV3-Large's shapes (batch 128).
Device milliseconds of the forward and of forward + backward, each side's step captured in a
CUDA graph and replayed (so the host's cost is left out), median of 50 replays after warm-up.

    PYTHONPATH=src python benchmarks/probes/se_probe.py [OUT.json]
"""

import json
import sys

import torch

import rtdnn

SHAPES = [  # (C, R, H = W, activation, gate)
    (96, 4, 112, torch.nn.SiLU, torch.nn.Sigmoid),
    (240, 10, 28, torch.nn.SiLU, torch.nn.Sigmoid),
    (672, 28, 14, torch.nn.SiLU, torch.nn.Sigmoid),
    (1152, 48, 7, torch.nn.SiLU, torch.nn.Sigmoid),
    (72, 24, 28, torch.nn.ReLU, torch.nn.Hardsigmoid),
    (480, 120, 14, torch.nn.ReLU, torch.nn.Hardsigmoid),
    (960, 240, 7, torch.nn.ReLU, torch.nn.Hardsigmoid),
]


class TorchBlock(torch.nn.Module):
    def __init__(self, c, r, activation, gate):
        super().__init__()
        self.avgpool = torch.nn.AdaptiveAvgPool2d(1)
        self.fc1, self.fc2 = torch.nn.Conv2d(c, r, 1), torch.nn.Conv2d(r, c, 1)
        self.activation, self.scale_activation = activation(), gate()

    def forward(self, x):
        scale = self.scale_activation(self.fc2(self.activation(self.fc1(self.avgpool(x)))))
        return scale * x


def graphed_ms(step) -> float:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for _ in range(10):
        graph.replay()
    times = []
    for _ in range(50):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def main() -> None:
    torch.backends.cudnn.benchmark = True
    rows = []
    for c, r, hw, act, gate in SHAPES:
        torch.manual_seed(0)
        block = TorchBlock(c, r, act, gate).cuda()
        ours = rtdnn.nn.SqueezeExcitation(c, r, act, gate).cuda()
        ours.load_state_dict(block.state_dict())
        x = torch.randn(128, c, hw, hw, device="cuda", dtype=torch.bfloat16)
        x = x.to(memory_format=torch.channels_last).requires_grad_()
        dy = torch.randn_like(x)
        row = {"shape": f"C{c} R{r} {hw}x{hw}"}
        for name, m in (("pytorch", block), ("rtdnn", ours)):

            def forward(m=m, x=x):
                with torch.no_grad(), torch.autocast("cuda", torch.bfloat16):
                    m(x)

            def train(m=m, x=x, dy=dy):
                with torch.autocast("cuda", torch.bfloat16):
                    y = m(x)
                torch.autograd.grad(y, [x, *m.parameters()], dy)

            row[f"{name}_fwd_ms"] = graphed_ms(forward)
            row[f"{name}_fwd_bwd_ms"] = graphed_ms(train)
        row["fwd_ratio"] = row["pytorch_fwd_ms"] / row["rtdnn_fwd_ms"]
        row["fwd_bwd_ratio"] = row["pytorch_fwd_bwd_ms"] / row["rtdnn_fwd_bwd_ms"]
        print(json.dumps(row), flush=True)
        rows.append(row)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
