"""On the CPU, rtdnn's public API prints none of Triton's interpreter NumPy warnings (masked-off
lanes' overflows and invalid values, the deprecated array-to-scalar conversions), even with every
warning turned on; the filters in force outside a call are left as they were, and other code's
interpreted kernels still warn."""

import warnings

import torch
import triton
import triton.language as tl

import rtdnn
import rtdnn.nn as rnn
from rtdnn.bench.selfcheck import run_all


def _format(log) -> str:
    return "\n".join(f"{w.category.__name__} {w.filename}:{w.lineno}: {w.message}" for w in log)


def test_public_api_records_no_warning():
    """The self-check calls every primitive family forward and backward, each checked."""
    with warnings.catch_warnings(record=True) as log:
        warnings.simplefilter("always")
        results = run_all()
    assert results and all(ok for _, _, ok in results), [r for r in results if not r[2]]
    assert not log, _format(log)


def test_modules_and_autograd_record_no_warning():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        rnn.Conv2d(3, 8, 3, padding=1),
        rnn.BatchNorm2d(8),
        rnn.ReLU(),
        rnn.MaxPool2d(2),
        torch.nn.Flatten(),
        rnn.Linear(8 * 2 * 2, 4),
        rnn.LogSoftmax(dim=1),
    )
    x = torch.randn(2, 3, 4, 4)
    with warnings.catch_warnings(record=True) as log:
        warnings.simplefilter("always")
        loss = rnn.CrossEntropyLoss()(model(x), torch.tensor([1, 3]))
        loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None for p in model.parameters())
    assert not log, _format(log)


def test_filters_outside_a_call_are_unchanged():
    before = list(warnings.filters)
    rtdnn.softmax_forward(torch.randn(2, 5, 3), algo="log")
    assert warnings.filters == before


@triton.jit
def _log_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(y_ptr + offs, tl.log(x), mask=offs < n)


def test_other_interpreted_kernels_still_warn():
    """Only rtdnn's own kernels are silenced: a kernel defined elsewhere (here) keeps NumPy's
    warning about the log of its masked-off zeros."""
    x = torch.rand(3) + 1.0
    y = torch.empty(3)
    with warnings.catch_warnings(record=True) as log:
        warnings.simplefilter("always")
        _log_kernel[(1,)](x, y, 3, BLOCK=16)
    torch.testing.assert_close(y, torch.log(x))
    assert any(issubclass(w.category, RuntimeWarning) for w in log), _format(log)
