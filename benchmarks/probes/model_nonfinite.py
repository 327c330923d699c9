"""Where a converted model's output stops being finite: runs a torchvision model and its
rtdnn.convert copy on the same input under several settings (autocast dtype, batch,
channels-last, train/eval) and prints, per setting, each side's output difference and the
first leaf module whose output holds a NaN or an infinity, with its input's range.

    PYTHONPATH=src python benchmarks/probes/model_nonfinite.py [MODEL]
"""

import sys

import torch
import torchvision

import rtdnn


def first_nonfinite(model, x, amp):
    found = []

    def hook(name):
        def fn(module, inputs, output):
            out = output[0] if isinstance(output, tuple) else output
            if found or not torch.is_tensor(out) or torch.isfinite(out).all():
                return
            ins = [t for t in inputs if torch.is_tensor(t)]
            rng = [
                (
                    float(t.float().nan_to_num().abs().max()),
                    bool(torch.isfinite(t).all()),
                    t.dtype,
                    tuple(t.shape),
                    t.stride(),
                )
                for t in ins
            ]
            found.append((name, type(module).__name__, rng, out.dtype, tuple(out.shape)))

        return fn

    handles = [
        m.register_forward_hook(hook(n))
        for n, m in model.named_modules()
        if not list(m.children()) or "Attention" in type(m).__name__
    ]
    with torch.no_grad(), torch.autocast("cuda", dtype=amp, enabled=amp is not None):
        y = model(x).float()
    for h in handles:
        h.remove()
    return y, found[:1]


def main() -> None:
    name = sys.argv[1] if len(sys.argv) > 1 else "vit_b_16"
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None).cuda()
    converted, _ = rtdnn.convert(model)
    for amp, batch, cl, train in [
        (torch.bfloat16, 128, True, False),
        (torch.bfloat16, 2, False, False),
        (None, 2, False, False),
        (torch.float16, 2, False, False),
        (torch.bfloat16, 2, False, True),
    ]:
        x = torch.randn(batch, 3, 224, 224, device="cuda")
        if cl:
            x = x.to(memory_format=torch.channels_last)
        model.train(train)
        converted.train(train)
        ref, ref_bad = first_nonfinite(model, x, amp)
        out, bad = first_nonfinite(converted, x, amp)
        diff = float((out - ref).norm() / ref.norm())
        print(
            f"amp={amp} batch={batch} channels_last={cl} train={train}: rel diff {diff:.3g}; "
            f"torch first non-finite {ref_bad}; rtdnn first non-finite {bad}",
            flush=True,
        )


if __name__ == "__main__":
    main()
