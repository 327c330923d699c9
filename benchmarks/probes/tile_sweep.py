"""A sweep for the shipped tile table: run a converted model's problems once so that the tile
tuner times each one's candidates and stores its choice in the tuning database that
RTDNN_TUNING_DB names (RTDNN_AUTOTUNE=1: tune even what the shipped table already has).
One eval forward (fused conversion), one training step (forward, loss, backward: every
direction), and one eval forward with the batch norms folded, in bf16 autocast, channels-last;
nothing is timed beyond what the tuner times. tools/ship_tiles.py then writes the database
into the shipped table.

    RTDNN_TUNING_DB=sweep.sqlite3 RTDNN_AUTOTUNE=1 PYTHONPATH=src \
        python benchmarks/probes/tile_sweep.py MODEL [BATCH ...]
(MODEL: a name `rtdnn bench --model` takes; BATCH: default 128.) gpu_sweep.sh runs several.
The tuner's log (each candidate's time, each choice) goes to stderr.
"""

import logging
import sys
import time

import torch

import rtdnn
from rtdnn.bench.model import build


def sweep(name: str, batch: int) -> None:
    torch.manual_seed(0)
    model, size = build(name)
    model = model.cuda().to(memory_format=torch.channels_last)
    x = torch.randn(batch, 3, size, size, device="cuda").to(memory_format=torch.channels_last)
    target = torch.randint(0, 10, (batch,), device="cuda")
    converted, _ = rtdnn.convert(model, fuse=True)
    start = time.perf_counter()
    with torch.autocast("cuda", torch.bfloat16):
        with torch.no_grad():
            converted.eval()(x)
        converted.train()
        loss = rtdnn.nn.CrossEntropyLoss()(converted(x).float(), target)
    loss.backward()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    print(f"{name} batch {batch}: eval and training step tuned in {seconds:.0f} s", flush=True)
    folded, report = rtdnn.convert(model.eval(), fold_batch_norm=True)
    start = time.perf_counter()
    with torch.no_grad(), torch.autocast("cuda", torch.bfloat16):
        folded(x)
    torch.cuda.synchronize()
    print(f"{name} batch {batch}: folded eval ({len(report.folded)} batch norms) tuned in "
          f"{time.perf_counter() - start:.0f} s", flush=True)  # fmt: skip


if __name__ == "__main__":
    logging.basicConfig(format="%(message)s")
    logging.getLogger("rtdnn.tiles").setLevel(logging.DEBUG)
    for b in [int(v) for v in sys.argv[2:]] or [128]:
        sweep(sys.argv[1], b)
