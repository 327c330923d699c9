"""`rtdnn demo`: train a LeNet-style CNN built only from rtdnn modules on the handwritten
digits that ship with scikit-learn (1,797 8x8 images, no download), then report test accuracy.

On a GPU it trains for a fixed number of epochs in seconds. Without one it runs through Triton's
interpreter on a time budget (a few minutes) and says so; the accuracy it reaches is printed.
"""

from __future__ import annotations

import time

import torch

from . import nn as rnn


def lenet(classes: int = 10, width: int = 16) -> torch.nn.Module:
    """Two conv-ReLU-maxpool stages and two linear layers, for 1 x 8 x 8 inputs."""
    return torch.nn.Sequential(
        rnn.Conv2d(1, width // 2, 3, padding=1),
        rnn.ReLU(),
        rnn.MaxPool2d(2),
        rnn.Conv2d(width // 2, width, 3, padding=1),
        rnn.ReLU(),
        rnn.MaxPool2d(2),
        torch.nn.Flatten(),
        rnn.Linear(width * 2 * 2, 64),
        rnn.ReLU(),
        rnn.Linear(64, classes),
    )


def load_digits(device: torch.device, seed: int = 0):
    """(train_x, train_y, test_x, test_y): a fixed 80/20 split, pixels scaled to [0, 1]."""
    try:
        from sklearn.datasets import load_digits as sk_load_digits
    except ImportError as e:
        raise SystemExit(
            "rtdnn demo needs scikit-learn for its data set: pip install 'rtdnn[demo]'"
        ) from e
    data = sk_load_digits()
    x = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(data.target, dtype=torch.int64)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    x, y = x[order].to(device), y[order].to(device)
    split = int(0.8 * len(y))
    return x[:split], y[:split], x[split:], y[split:]


def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 256) -> float:
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(y), batch):
            correct += (model(x[i : i + batch]).argmax(1) == y[i : i + batch]).sum().item()
    model.train()
    return correct / len(y)


def train(
    epochs: int | None = None,
    budget_s: float | None = None,
    batch: int | None = None,
    lr: float = 1e-2,
    plot: str | None = None,
    seed: int = 0,
) -> dict:
    """Train and evaluate; returns accuracy, steps, seconds and the loss curve."""
    from tqdm import tqdm

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    if epochs is None:
        epochs = 20 if cuda else 6
    if batch is None:
        batch = 64 if cuda else 32
    if budget_s is None and not cuda:
        budget_s = 200.0
    torch.manual_seed(seed)
    train_x, train_y, test_x, test_y = load_digits(device, seed)
    model = lenet(width=32 if cuda else 16).to(device)
    loss_fn = rnn.CrossEntropyLoss()
    # Adam reaches a good accuracy in the few dozen steps the interpreter has time for.
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    steps_per_epoch = -(-len(train_y) // batch)
    losses: list[float] = []
    start = time.perf_counter()
    stopped_early = False
    with tqdm(total=epochs * steps_per_epoch, unit="step", desc="training") as bar:
        for epoch in range(epochs):
            order = torch.randperm(len(train_y), device=device)
            for i in range(0, len(train_y), batch):
                idx = order[i : i + batch]
                loss = loss_fn(model(train_x[idx]), train_y[idx])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                losses.append(loss.item())
                bar.update(1)
                bar.set_postfix(epoch=epoch, loss=f"{losses[-1]:.3f}", refresh=False)
                if budget_s is not None and time.perf_counter() - start > budget_s:
                    stopped_early = True
                    break
            if stopped_early:
                break
    seconds = time.perf_counter() - start
    acc = accuracy(model, test_x, test_y)
    if plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.plot(losses)
        ax.set_xlabel("step")
        ax.set_ylabel("cross-entropy")
        ax.set_title(f"rtdnn demo: test accuracy {acc:.1%}")
        fig.tight_layout()
        fig.savefig(plot, dpi=120)
    return {
        "device": torch.cuda.get_device_name() if cuda else "cpu (Triton interpreter)",
        "accuracy": acc,
        "steps": len(losses),
        "epochs_planned": epochs,
        "seconds": seconds,
        "stopped_at_budget": stopped_early,
        "losses": losses,
    }
