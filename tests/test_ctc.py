"""CTC loss: values and gradients against torch's float64 implementation (every reduction, both
target layouts, lengths as tensors and tuples, repeated labels, impossible alignments), the
nn drop-in and its conversion, and bad input refused before any launch."""

import pytest
import torch
from conftest import assert_close

import rtdnn
import rtdnn.nn as rnn
from rtdnn import reference

T, N, C = 8, 2, 5


def _log_probs(t=T, n=N, c=C, dtype=torch.float32):
    return torch.randn(t, n, c).log_softmax(-1).to(dtype)


# Element 0 repeats a label (2, 2: needs a blank between), element 1 is shorter than S.
PADDED = torch.tensor([[1, 2, 2], [3, 4, 0]])
LENGTHS = (3, 2)


def _check(lp, targets, in_len, tgt_len, reduction="mean", zero_infinity=False, blank=0):
    x = lp.clone().requires_grad_()
    loss = rtdnn.ctc_loss(x, targets, in_len, tgt_len, blank, reduction, zero_infinity)
    x64 = lp.double().requires_grad_()
    ref = reference.ctc_loss(x64, targets, in_len, tgt_len, blank, reduction, zero_infinity)
    assert loss.shape == ref.shape and loss.dtype == lp.dtype
    w = torch.randn(ref.shape, dtype=torch.float64)
    (loss * w.to(lp.dtype)).sum().backward()
    (ref * w).sum().backward()
    return loss.detach(), ref.detach(), x.grad, x64.grad


@pytest.mark.parametrize("reduction", ("mean", "sum", "none"))
@pytest.mark.parametrize("layout", ("padded", "concatenated"))
@pytest.mark.parametrize("as_tensor", (True, False))
def test_values_and_gradients(reduction, layout, as_tensor):
    lp = _log_probs()
    in_len = (8, 6)
    targets = PADDED if layout == "padded" else torch.tensor([1, 2, 2, 3, 4])
    lengths = (torch.tensor(in_len), torch.tensor(LENGTHS)) if as_tensor else (in_len, LENGTHS)
    loss, ref, grad, grad_ref = _check(lp, targets, *lengths, reduction)
    assert_close(loss, ref)
    assert_close(grad, grad_ref)


@pytest.mark.parametrize("reduction", ("mean", "none"))
@pytest.mark.parametrize("zero_infinity", (False, True))
def test_impossible_alignment(reduction, zero_infinity):
    # Element 0: 3 labels with a repeat need 4 steps, it has 3; element 1 is possible.
    lp = _log_probs()
    loss, ref, grad, grad_ref = _check(
        lp, PADDED, (3, 6), LENGTHS, reduction, zero_infinity=zero_infinity
    )
    if reduction == "none":
        assert (loss[0] == 0) if zero_infinity else (loss[0] == float("inf"))
        assert_close(loss[1:], ref[1:])
    else:
        assert torch.equal(loss.isinf(), ref.isinf())
        if zero_infinity:
            assert_close(loss, ref)
    # torch's gradient: NaN at the impossible element's steps (inf - inf), 0 with zero_infinity.
    assert torch.equal(grad.isnan(), grad_ref.isnan())
    assert_close(grad[:, 1], grad_ref[:, 1])
    if zero_infinity:
        assert torch.equal(grad[:, 0], torch.zeros_like(grad[:, 0]))


def test_empty_targets_and_other_blank():
    lp = _log_probs()
    targets = torch.tensor([[1, 2, 3], [0, 0, 0]])
    loss, ref, grad, grad_ref = _check(lp, targets, (7, 5), (3, 0), "none", blank=4)
    assert_close(loss, ref)
    assert_close(grad, grad_ref)


def test_strided_log_probs_and_half_dtype():
    base = torch.randn(T, N, 2 * C).log_softmax(-1)
    lp = base[..., ::2]  # no unit stride
    loss, ref, grad, grad_ref = _check(lp, PADDED, (8, 8), LENGTHS, "sum")
    assert_close(loss, ref)
    assert_close(grad, grad_ref)
    lp16 = _log_probs(dtype=torch.bfloat16)
    loss, ref, grad, grad_ref = _check(lp16, PADDED, (8, 8), LENGTHS, "mean")
    assert_close(loss, ref)
    assert_close(grad, grad_ref)


def test_unbatched():
    lp = torch.randn(T, C).log_softmax(-1)
    for reduction in ("none", "mean"):
        loss, ref, grad, grad_ref = _check(
            lp, torch.tensor([1, 1, 2]), torch.tensor(7), torch.tensor(3), reduction
        )
        assert_close(loss, ref)
        assert_close(grad, grad_ref)


def test_module_and_convert():
    lp = _log_probs()
    model = torch.nn.CTCLoss(blank=0, reduction="sum", zero_infinity=True)
    converted, report = rtdnn.convert(model)
    assert report.replaced == [("", "CTCLoss")]
    assert isinstance(converted, rnn.CTCLoss)
    x = lp.clone().requires_grad_()
    loss = converted(x, PADDED, (8, 2), LENGTHS)  # element 1 impossible: zeroed
    loss.backward()
    x64 = lp.double().requires_grad_()
    ref = torch.nn.CTCLoss(reduction="sum", zero_infinity=True)(x64, PADDED, (8, 2), LENGTHS)
    ref.backward()
    assert_close(loss.detach(), ref.detach())
    assert_close(x.grad, x64.grad)


# -- bad input: refused before any launch -----------------------------------------------


@pytest.mark.parametrize(
    "change,name",
    [
        (dict(targets=torch.tensor([[1, 0, 2], [3, 4, 0]])), "targets"),  # blank in length
        (dict(targets=torch.tensor([[1, 5, 2], [3, 4, 0]])), "targets"),  # >= C
        (dict(targets=torch.tensor([[1, -1, 2], [3, 4, 0]])), "targets"),
        (dict(targets=torch.tensor([1, 2, 2, 3, 0], dtype=torch.int32)), "targets"),  # 1-D
        (dict(input_lengths=(9, 6)), "input_lengths"),
        (dict(input_lengths=(-1, 6)), "input_lengths"),
        (dict(input_lengths=(8,)), "input_lengths"),
        (dict(target_lengths=(4, 2)), "target_lengths"),
        (dict(target_lengths=(-1, 2)), "target_lengths"),
        (dict(log_probs=torch.randn(T, N, C, 1)), "log_probs.dim"),
        (dict(targets=torch.tensor([[1.0, 2.0, 2.0], [3.0, 4.0, 0.0]])), "targets.dtype"),
        (dict(targets=torch.tensor([1, 2, 2, 3])), "targets.shape"),  # 4 < 3 + 2 labels
        (dict(blank=5), "blank"),
        (dict(reduction="avg"), "reduction"),
        (dict(zero_infinity=1), "zero_infinity"),
    ],
)
@pytest.mark.parametrize("checked_on", ("host", "device"))
def test_bad_input(change, name, checked_on, monkeypatch):
    from rtdnn.ops import ctc

    if checked_on == "device":  # as when targets or lengths are on a GPU
        monkeypatch.setattr(ctc, "_summary_on_host", ctc._summary_on_device)

    def no_launch(*args, **kwargs):
        raise AssertionError("a kernel ran on bad input")

    monkeypatch.setattr(ctc, "ctc_forward", no_launch)
    args = (
        dict(log_probs=_log_probs(), targets=PADDED, input_lengths=(8, 6), target_lengths=LENGTHS)
        | change
    )
    with pytest.raises(rtdnn.BadParamError, match=name):
        rtdnn.ctc_loss(**args)


def test_padding_beyond_the_length_is_ignored():
    targets = torch.tensor([[1, 2, 2], [3, 4, 0]])  # the 0 (blank) is padding of element 1
    lp = _log_probs()
    loss, ref, _, _ = _check(lp, targets, (8, 6), LENGTHS, "none")
    assert_close(loss, ref)


def test_zero_input_lengths():
    # No input: the empty target costs 0, any other is impossible (inf; NaN gradient: none).
    lp = _log_probs(n=3)
    targets = torch.tensor([[1, 2], [3, 3], [1, 0]])
    loss, ref, grad, grad_ref = _check(lp, targets, (0, 5, 0), (0, 2, 1), "none")
    assert torch.equal(loss.isinf(), ref.isinf()) and loss[0] == 0
    assert_close(loss[1:2], ref[1:2])
    assert torch.equal(grad.isnan(), grad_ref.isnan())
    assert_close(grad.nan_to_num(0.0), grad_ref.nan_to_num(0.0))


def test_long_target_spans_several_label_chunks():
    # 2 S + 1 = 19 extended labels: the backward's per-label sums run over two chunks.
    lp = _log_probs(t=20, n=1)
    targets = torch.tensor([[1, 2, 2, 3, 1, 4, 4, 2, 1]])
    loss, ref, grad, grad_ref = _check(lp, targets, (20,), (9,), "sum")
    assert_close(loss, ref)
    assert_close(grad, grad_ref)


def test_custom_op_passes_opcheck():
    """Schema, fake kernel and autograd registration hold (what torch.compile relies on)."""
    from rtdnn.autograd import ctc as ag
    from rtdnn.ops import ctc

    lp = torch.randn(5, 2, 4).log_softmax(-1).requires_grad_()
    args = ctc.prepare(lp, torch.tensor([[1, 2], [3, 3]]), (5, 5), (2, 2), 0)[:5]
    for reduction in ("mean", "none"):
        torch.library.opcheck(ag.ctc_loss_forward.op, (*args, 0, 2, reduction, False))


@pytest.mark.parametrize(
    "targets",
    ([2, 1, 2, 2, 3, 2, 1], [4, 4, 4, 4], [1, 2, 3, 4, 1, 2, 3]),
    ids=("one-label-often", "all-the-same", "no-neighbours-repeated"),
)
def test_labels_repeated_many_times(targets):
    """The backward sums each label's positions along links between them: labels repeated
    up to the whole target, next to each other or apart."""
    lp = _log_probs(t=20, n=2, c=5)
    tgt = torch.tensor([targets, targets[::-1]])
    loss, ref, grad, grad_ref = _check(lp, tgt, (20, 17), (len(targets), len(targets) - 1), "sum")
    assert_close(loss, ref)
    assert_close(grad, grad_ref)


def test_log_prob_of_minus_infinity_gives_torchs_gradient():
    """A class with probability 0 at a step: torch's gradient formula gives NaN there (-inf +
    inf), for a class of the target and for one outside it alike; rtdnn gives the same NaNs
    and torch's values everywhere else."""
    lp = _log_probs(t=10, n=1, c=5)
    lp[3, 0, 2] = float("-inf")  # class 2 (in the target) at step 3
    lp[5, 0, 4] = float("-inf")  # class 4 (not in it)
    target = torch.tensor([[1, 2, 3]])
    x = lp.clone().requires_grad_()
    rtdnn.ctc_loss(x, target, (10,), (3,), reduction="sum").backward()
    x64 = lp.double().requires_grad_()
    torch.nn.functional.ctc_loss(x64, target, (10,), (3,), reduction="sum").backward()
    assert torch.equal(x.grad.isnan(), x64.grad.isnan())
    finite = ~x64.grad.isnan()
    assert_close(x.grad[finite], x64.grad[finite])


def test_backward_twice_gives_the_same_gradient():
    """The backward reads the forward's saved alpha and must leave it as it was."""
    torch.manual_seed(3)
    lp = torch.randn(12, 2, 6).log_softmax(2).requires_grad_()
    targets = torch.tensor([[1, 1, 2, 3], [4, 5, 0, 0]])
    loss = rtdnn.ctc_loss(lp, targets, (12, 9), (4, 2))
    (first,) = torch.autograd.grad(loss, lp, retain_graph=True)
    (second,) = torch.autograd.grad(loss, lp)
    assert torch.equal(first, second)
    lp64 = lp.detach().double().requires_grad_()
    want = torch.nn.functional.ctc_loss(lp64, targets, (12, 9), (4, 2))
    (ref,) = torch.autograd.grad(want, lp64)
    assert reference.rel_error(first, ref) < 1e-5


def test_strided_targets():
    """Targets as a strided view (every other column of a wider tensor): read through their
    strides, not as if contiguous."""
    wide = torch.randint(1, C, (N, 6), generator=torch.Generator().manual_seed(3))
    lp = _log_probs()
    loss, ref, grad, grad_ref = _check(lp, wide[:, ::2], (8, 6), LENGTHS, "none")
    assert_close(loss, ref)
    assert_close(grad, grad_ref)


@pytest.mark.parametrize("layout", ("padded", "concatenated"))
@pytest.mark.parametrize("dtype", (torch.int32, torch.int64))
def test_check_kernel_agrees_with_the_host(layout, dtype):
    """The kernel that checks targets and lengths on a GPU: the same offsets, lengths and
    summary as the host's check, for good and bad labels, lengths out of range and lengths
    read through strides."""
    from rtdnn.ops import ctc

    gen = torch.Generator().manual_seed(5)
    n, width, classes = 9, 7, 6
    for trial in range(4):
        tgt_len = torch.randint(0, width + 1, (n,), generator=gen)
        in_len = torch.randint(0, 30, (2 * n,), generator=gen)[::2]  # strided
        if trial == 1:
            tgt_len[3], in_len[4] = -2, -1
        if trial == 2:
            tgt_len[5] = width + 3
        padded = torch.randint(1, classes, (n, width), generator=gen)
        if trial == 3:
            padded[6, int(tgt_len[6]) - 1 if tgt_len[6] > 0 else 0] = 0  # the blank
            padded[2, width - 1] = classes  # padding or a label past the classes
        if layout == "padded":
            flat, w = padded.reshape(-1).to(dtype), width
        else:
            flat = torch.cat([padded[i, : max(int(k), 0)] for i, k in enumerate(tgt_len)])
            flat, w = flat.to(dtype), 0
        want = ctc._summary_on_host(flat, in_len, tgt_len.to(dtype), w, classes, 0)
        got = ctc._summary_on_device(flat, in_len, tgt_len.to(dtype), w, classes, 0)
        assert got[1] == want[1], (trial, got[1], want[1])
        if min(want[1][:4]) >= 0:  # offsets are only read once the lengths pass
            assert torch.equal(got[0], want[0])


@pytest.mark.parametrize("reduction", ("mean", "sum", "none"))
def test_values_with_the_check_on_the_device(reduction, monkeypatch):
    from rtdnn.ops import ctc

    monkeypatch.setattr(ctc, "_summary_on_host", ctc._summary_on_device)
    lengths = torch.tensor([8, 6]), torch.tensor(LENGTHS)
    loss, ref, grad, grad_ref = _check(_log_probs(), PADDED, *lengths, reduction)
    assert_close(loss, ref)
    assert_close(grad, grad_ref)
