"""Training a converted model under torch.nn.parallel.DistributedDataParallel: the per-process
worker and the checks, shared by the CPU (gloo) and GPU (NCCL) tests.

Each process trains two copies of one small model from the same seed, one converted by
rtdnn.convert and one left in torch, each under its own DDP, for a few SGD steps on data that
differs per rank, and saves the gradients it saw. The checks: every rank saw the same
gradients (DDP's all-reduce), and the converted model's equal the torch model's.
"""

import os

# Spawned processes import this module first: the interpreter must be chosen before triton is.
if os.environ.get("RTDNN_GPU_TESTS") != "1":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import socket  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import rtdnn  # noqa: E402
from rtdnn.reference import rel_error  # noqa: E402

WORLD = 2
STEPS = 2


def tiny_model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(4 * 4 * 4, 3),
    )


def _worker(rank: int, port: int, backend: str, out_dir: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group(backend, rank=rank, world_size=WORLD)
    try:
        device = torch.device(f"cuda:{rank}" if backend == "nccl" else "cpu")
        if device.type == "cuda":
            torch.cuda.set_device(device)
            torch.backends.cudnn.allow_tf32 = False
            torch.backends.cuda.matmul.allow_tf32 = False
        torch.manual_seed(0)
        reference = tiny_model().to(device)
        converted, _ = rtdnn.convert(reference)
        ids = [rank] if device.type == "cuda" else None
        result = {}
        for name, model in (("torch", reference), ("rtdnn", converted)):
            ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
            opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
            data = torch.Generator().manual_seed(100 + rank)  # each rank its own batch
            grads = []
            for _ in range(STEPS):
                x = torch.randn(2, 3, 6, 6, generator=data).to(device)
                t = torch.randint(0, 3, (2,), generator=data).to(device)
                opt.zero_grad()
                torch.nn.functional.cross_entropy(ddp(x), t).backward()
                grads.append([p.grad.detach().cpu().clone() for p in model.parameters()])
                opt.step()
            result[name] = grads
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
        # Leave together: a rank that tears gloo down while the other still uses its
        # connection can abort the other process.
        dist.barrier()
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_and_check(backend: str, out_dir: str, tol: float) -> None:
    """Spawn WORLD processes, then check their gradients (see the module doc)."""
    mp.spawn(_worker, args=(free_port(), backend, out_dir), nprocs=WORLD, join=True)
    ranks = [torch.load(os.path.join(out_dir, f"rank{r}.pt")) for r in range(WORLD)]
    for name in ("torch", "rtdnn"):
        for step in range(STEPS):
            for g0, g1 in zip(ranks[0][name][step], ranks[1][name][step], strict=True):
                assert torch.equal(g0, g1), f"{name}: ranks disagree at step {step}"
    for step in range(STEPS):
        ours, theirs = ranks[0]["rtdnn"][step], ranks[0]["torch"][step]
        assert len(ours) == len(theirs) == 4
        for g, g_ref in zip(ours, theirs, strict=True):
            assert g.abs().sum() > 0
            err = rel_error(g, g_ref.double())
            assert err <= tol, f"step {step}: relative error {err:.2e} > {tol:.0e}"
