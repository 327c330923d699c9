"""CTC loss kernels: the alpha (forward) and beta (backward) recursions in log space, and the
gradient.

The recursions: one program per batch element walks its T_n time steps; the extended label
sequence (blank, l1, blank, l2, ..., blank) of length 2 S_n + 1 lies along a vector of BLOCK_L
lanes. The row stays on chip from step to step; its shifts by one and two lanes are gathers
between lanes (tl.gather), not a round trip through memory. The step's log_probs gather does
not depend on the recursion, so each step loads the next step's while its row is computed.
The forward writes every alpha row; the backward every step's alpha + beta - lp.

The loss is reduced in the alpha launch: the last program to arrive sums the elements' losses in
a fixed order (kernels/arrival.py), so a mean or sum costs no launch of its own and stays
deterministic. The inputs are checked by one small kernel before anything else runs: its
summary of the lengths and of the first bad label is the one value the host reads back.

The gradient is torch's: d loss / d log_probs[t, c] = exp(lp) - exp(lse_{s: l'(s) = c}
(alpha_t(s) + beta_t(s)) + nll - lp), the gradient with respect to the logits of a log_softmax
that produced log_probs, times the incoming gradient. Steps at or after T_n get 0. No step
depends on another, so it runs after the recursion with one program per (step, element).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .arrival import last_to_arrive

NEG_INF = tl.constexpr(float("-inf"))
#: Reductions of the per-element losses, as the kernels' REDUCTION constant.
NONE, SUM, MEAN = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)


@triton.jit
def _lse3(a, b, c):
    m = tl.maximum(tl.maximum(a, b), c)
    safe = tl.where(m == NEG_INF, 0.0, m)
    r = safe + tl.log(tl.exp(a - safe) + tl.exp(b - safe) + tl.exp(c - safe))
    return tl.where(m == NEG_INF, NEG_INF, r)


@triton.jit
def _shifted(v, s, by: tl.constexpr, BLOCK_L: tl.constexpr):
    """v[s + by] for each lane s (clamped into the row; the caller masks the lanes it took
    from outside), exchanged between lanes on chip, not through memory."""
    return tl.gather(v, tl.minimum(tl.maximum(s + by, 0), BLOCK_L - 1), 0)


@triton.jit
def _labels(targets, offsets, tgt_len, n, BLANK, BLOCK_L: tl.constexpr):
    """The extended labels l'(s), whether s is in range, and whether the s - 2 -> s and
    s -> s + 2 transitions (skipping a blank) are allowed."""
    s = tl.arange(0, BLOCK_L)
    Sn = tl.load(tgt_len + n).to(tl.int32)
    off = tl.load(offsets + n)
    L = 2 * Sn + 1
    valid = s < L
    is_lab = (s % 2 == 1) & valid
    k = (s - 1) // 2
    lab = tl.load(targets + off + k, mask=is_lab, other=BLANK).to(tl.int32)
    lab_prev = tl.load(targets + off + k - 1, mask=is_lab & (s >= 3), other=-1).to(tl.int32)
    lab_next = tl.load(targets + off + k + 1, mask=is_lab & (s + 2 < L), other=-1).to(tl.int32)
    skip_in = is_lab & (s >= 3) & (lab != lab_prev)
    skip_out = is_lab & (s + 2 < L) & (lab != lab_next)
    return s, L, valid, lab, skip_in, skip_out


@triton.jit
def ctc_check_kernel(
    targets, n_targets, in_len, in_stride, tgt_len, tgt_stride, lengths, summary, N, S, C,
    BLANK, PADDED: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """One program: what the host must know before it launches the recursions, in one read.

    lengths: int64 (3, N), each element's offset into the flat targets, its input length and
    its target length. summary: int64 (7,), the least and largest input length, the least and
    largest target length, their sum, and the flat position of the first label within the
    target lengths that is not a class other than BLANK (n_targets if none) with its value.
    targets: flat, n_targets labels; padded (PADDED, S per element) or concatenated. Reads
    only within n_targets, whatever the lengths hold (the host refuses bad ones after)."""
    i = tl.arange(0, BLOCK)
    big = tl.full([BLOCK], 2**62, tl.int64)
    least_in, most_in, least_tgt, most_tgt = big, -big, big, -big
    total = tl.zeros([1], tl.int64)
    for n0 in range(0, N, BLOCK):
        n = n0 + i
        inside = n < N
        a = tl.load(in_len + n * in_stride, mask=inside, other=0).to(tl.int64)
        b = tl.load(tgt_len + n * tgt_stride, mask=inside, other=0).to(tl.int64)
        if PADDED:
            offset = n.to(tl.int64) * S
        else:  # concatenated: the exclusive prefix sum of the target lengths
            offset = total + tl.cumsum(b, 0) - b
        tl.store(lengths + n, offset, mask=inside)
        tl.store(lengths + N + n, a, mask=inside)
        tl.store(lengths + 2 * N + n, b, mask=inside)
        least_in = tl.minimum(least_in, tl.where(inside, a, big))
        most_in = tl.maximum(most_in, tl.where(inside, a, -big))
        least_tgt = tl.minimum(least_tgt, tl.where(inside, b, big))
        most_tgt = tl.maximum(most_tgt, tl.where(inside, b, -big))
        total += tl.sum(b, 0)
    first = tl.full([BLOCK], n_targets, tl.int64)
    for p0 in range(0, n_targets, BLOCK):
        p = p0 + i
        if PADDED:  # position s of element p // S, used below its length
            length = tl.load(tgt_len + (p // S) * tgt_stride, mask=p < n_targets, other=0)
            used = (p < n_targets) & (p % S < length)
        else:
            used = (p < n_targets) & (p < total)
        label = tl.load(targets + p, mask=used, other=0)
        bad = used & ((label < 0) | (label >= C) | (label == BLANK))
        first = tl.minimum(first, tl.where(bad, p.to(tl.int64), n_targets))
    first_bad = tl.min(first, 0)
    value = tl.load(
        targets + tl.minimum(first_bad, n_targets - 1), mask=first_bad < n_targets, other=0
    )
    tl.store(summary + 0, tl.min(least_in, 0))
    tl.store(summary + 1, tl.max(most_in, 0))
    tl.store(summary + 2, tl.min(least_tgt, 0))
    tl.store(summary + 3, tl.max(most_tgt, 0))
    tl.store(summary + 4 + tl.arange(0, 1), total)
    tl.store(summary + 5, first_bad)
    tl.store(summary + 6, value.to(tl.int64))


@triton.jit
def ctc_alpha_kernel(
    lp, s_t, s_n, s_c, targets, offsets, in_len, tgt_len, alpha, nll, loss, counter, T, BLANK,
    BLOCK_L: tl.constexpr, REDUCTION: tl.constexpr, ZERO_INFINITY: tl.constexpr,
    BLOCK_N: tl.constexpr,
):  # fmt: skip
    """alpha: float32 (N, T, BLOCK_L) workspace; nll: float32 (N,), -log p(target | input);
    loss: float32, (N,) for NONE (nll, 0 where infinite with ZERO_INFINITY), else one value
    (their SUM or MEAN, torch's: each over its target length, then the batch mean), written
    by the last program to arrive at `counter` (int32, zero)."""
    n = tl.program_id(0)
    s, L, valid, lab, skip_in, _ = _labels(targets, offsets, tgt_len, n, BLANK, BLOCK_L)
    Tn = tl.load(in_len + n).to(tl.int32)
    base = lp + n * s_n + lab * s_c
    row = alpha + n * T * BLOCK_L + s
    a = tl.load(base, mask=valid & (s < 2), other=NEG_INF).to(tl.float32)
    tl.store(row, a)
    x = tl.load(base + s_t, mask=valid & (Tn > 1), other=NEG_INF).to(tl.float32)
    for t in range(1, Tn):
        a1 = tl.where(s >= 1, _shifted(a, s, -1, BLOCK_L), NEG_INF)
        a2 = tl.where(skip_in, _shifted(a, s, -2, BLOCK_L), NEG_INF)
        # The next step's gather, issued before this step's arithmetic.
        x_next = tl.load(base + (t + 1) * s_t, mask=valid & (t + 1 < Tn), other=NEG_INF)
        a = tl.where(valid, _lse3(a, a1, a2) + x, NEG_INF)
        tl.store(row + t * BLOCK_L, a)
        x = x_next.to(tl.float32)
    # a holds the last step's row (step 0's when Tn <= 1).
    ends = tl.where((s == L - 1) | (s == L - 2), a, NEG_INF)
    m = tl.max(ends, 0)
    safe = tl.where(m == NEG_INF, 0.0, m)
    total = tl.where(m == NEG_INF, NEG_INF, safe + tl.log(tl.sum(tl.exp(ends - safe), 0)))
    # No input at all: only the empty target has an alignment (probability 1).
    total = tl.where(Tn == 0, tl.where(L == 1, 0.0, NEG_INF), total)
    tl.store(nll + n, -total)
    if REDUCTION == NONE:
        tl.store(loss + n, _finite_if(-total, ZERO_INFINITY))
    elif last_to_arrive(counter, tl.num_programs(0)):
        N = tl.num_programs(0)
        acc = tl.zeros([BLOCK_N], tl.float32)
        for n0 in range(0, N, BLOCK_N):
            e = n0 + tl.arange(0, BLOCK_N)
            v = _finite_if(tl.load(nll + e, mask=e < N, other=0.0, cache_modifier=".cg"),
                           ZERO_INFINITY)  # fmt: skip
            if REDUCTION == MEAN:
                v = v / tl.maximum(tl.load(tgt_len + e, mask=e < N, other=1), 1).to(tl.float32)
            acc += v
        result = tl.sum(acc, 0)
        if REDUCTION == MEAN:
            result = result / N
        tl.store(loss, result)


@triton.jit
def _finite_if(nll, ZERO_INFINITY: tl.constexpr):
    """zero_infinity: an impossible alignment's infinite loss counts as 0."""
    if ZERO_INFINITY:
        nll = tl.where(nll == float("inf"), 0.0, nll)
    return nll


@triton.jit
def _label_groups(targets, off, s, L, lab, BLOCK_L: tl.constexpr, CHUNK: tl.constexpr):
    """For each label position s (odd s < L): the first position holding the same label
    (`head`) and the next one after s (`nxt`, L after the last), and the largest number of
    positions sharing a label, less one. Once per sequence, over [BLOCK_L, CHUNK] tiles."""
    is_lab = (s % 2 == 1) & (s < L)
    head = s
    nxt = tl.full([BLOCK_L], L, tl.int32)
    count = tl.zeros([BLOCK_L], tl.int32)
    for j0 in range(0, L, CHUNK):
        j = j0 + tl.arange(0, CHUNK)
        j_lab = (j % 2 == 1) & (j < L)
        lab_j = tl.load(targets + off + (j - 1) // 2, mask=j_lab, other=-1).to(tl.int32)
        same = (lab[:, None] == lab_j[None, :]) & is_lab[:, None] & j_lab[None, :]
        jj = tl.broadcast_to(j[None, :], [BLOCK_L, CHUNK])
        head = tl.minimum(head, tl.min(tl.where(same, jj, BLOCK_L), 1))
        later = same & (jj > s[:, None])
        nxt = tl.minimum(nxt, tl.min(tl.where(later, jj, BLOCK_L), 1))
        count += tl.sum(same.to(tl.int32), 1)
    return head, nxt, tl.max(tl.where(is_lab, count, 1), 0) - 1


@triton.jit
def ctc_beta_kernel(
    lp, s_t, s_n, s_c, targets, offsets, in_len, tgt_len, alpha, post, links, heads,
    repeats, T, BLANK, BLOCK_L: tl.constexpr, CHUNK: tl.constexpr,
):  # fmt: skip
    """The beta recursion. post: float32 (N, T, BLOCK_L), each step's q = alpha + beta - lp
    (-inf outside the sequence and where it is NaN); links, heads: int32 (N, BLOCK_L), each
    label position's next position of the same label (L after the last) and its first;
    repeats: int32 (N,), the most positions sharing a label, less one (what the gradient's
    walk along the links needs)."""
    n = tl.program_id(0)
    s, L, valid, lab, skip_in, skip_out = _labels(targets, offsets, tgt_len, n, BLANK, BLOCK_L)
    Tn = tl.load(in_len + n).to(tl.int32)
    off = tl.load(offsets + n)
    head, nxt, most = _label_groups(targets, off, s, L, lab, BLOCK_L, CHUNK)
    tl.store(links + n * BLOCK_L + s, nxt)
    tl.store(heads + n * BLOCK_L + s, head)
    tl.store(repeats + n, most)
    base = lp + n * s_n + lab * s_c
    x = tl.load(base + (Tn - 1) * s_t, mask=valid & (Tn > 0), other=NEG_INF).to(tl.float32)
    b = tl.where(valid & (s >= L - 2), x, NEG_INF)  # the last step's row
    arow = alpha + n * T * BLOCK_L + s
    a = tl.load(arow + (Tn - 1) * BLOCK_L, mask=Tn > 0)
    for i in range(0, Tn):
        t = Tn - 1 - i
        if i > 0:
            b1 = tl.where(s + 1 < L, _shifted(b, s, 1, BLOCK_L), NEG_INF)
            b2 = tl.where(skip_out, _shifted(b, s, 2, BLOCK_L), NEG_INF)
            b = tl.where(valid, _lse3(b, b1, b2) + x, NEG_INF)
        # The next step's loads (log_probs and alpha), issued before this step's arithmetic.
        x_next = tl.load(base + (t - 1) * s_t, mask=valid & (t > 0), other=NEG_INF)
        a_next = tl.load(arow + (t - 1) * BLOCK_L, mask=t > 0)
        q = a + b - x
        tl.store(post + (n * T + t) * BLOCK_L + s, tl.where(valid & (q > NEG_INF), q, NEG_INF))
        x = x_next.to(tl.float32)
        a = a_next


@triton.jit
def ctc_grad_kernel(
    lp, s_t, s_n, s_c, targets, offsets, in_len, tgt_len, post, links, heads, repeats, nll,
    grad_loss, grad_stride, grad, g_t, g_n, g_c, T, C, BLANK, REDUCTION: tl.constexpr,
    ZERO_INFINITY: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """grad (T, N, C): the gradient of the forward's loss (REDUCTION as there) given its
    gradient grad_loss (float32; (N,) with grad_stride for NONE, else one value): one program
    per (step t, element n; program t * N + n), from the beta kernel's post, links, heads
    and repeats.

    The gradient of class c needs the sum over the positions s holding c of alpha_t(s) +
    beta_t(s), in log space. All of a class's positions share log_probs[t, c], so the sum is
    taken over q(s) = alpha + beta - log_probs, whose largest value is the most likely
    position's log posterior (about -nll): exp(q - max q) loses only weights below 1e-38 of
    the largest, whose share of the gradient is as small. The blank's positions are every even
    one (a vector sum); a label's first position walks the links to the others, as many steps
    as the most repeated label has repeats: O(L x repeats) per step, not O(L^2)."""
    N = tl.num_programs(0) // T
    t = tl.program_id(0) // N
    n = tl.program_id(0) % N
    cs = tl.arange(0, BLOCK_C)
    out = grad + t * g_t + n * g_n
    Tn = tl.load(in_len + n).to(tl.int32)
    if t >= Tn:  # steps past this element's input length take no gradient
        zeros = tl.zeros([BLOCK_C], tl.float32).to(grad.dtype.element_ty)
        for c0 in range(0, C, BLOCK_C):
            tl.store(out + (c0 + cs) * g_c, zeros, mask=c0 + cs < C)
    else:
        s, L, valid, lab, _, _ = _labels(targets, offsets, tgt_len, n, BLANK, BLOCK_L)
        g = tl.load(grad_loss + n * grad_stride)
        if REDUCTION == MEAN:
            g = g / (tl.maximum(tl.load(tgt_len + n), 1).to(tl.float32) * N)
        loss = tl.load(nll + n)
        if ZERO_INFINITY:
            g = tl.where(loss == float("inf"), 0.0, g)
        qrow = post + (n * T + t) * BLOCK_L
        q = tl.load(qrow + s)
        m = tl.max(q, 0)
        m = tl.where(m == NEG_INF, 0.0, m)
        w = tl.where(q > NEG_INF, tl.exp(q - m), 0.0)
        is_lab = (s % 2 == 1) & valid
        # Each label's first position sums its group; the blank's sum is every even lane's.
        first = is_lab & (tl.load(heads + n * BLOCK_L + s) == s)
        lrow = links + n * BLOCK_L
        acc = w
        cur = tl.load(lrow + s, mask=first, other=L)
        for _r in range(tl.load(repeats + n)):
            qc = tl.load(qrow + cur, mask=cur < L, other=NEG_INF)
            acc += tl.where(qc > NEG_INF, tl.exp(qc - m), 0.0)
            cur = tl.load(lrow + cur, mask=cur < L, other=L)
        blank_sum = tl.sum(tl.where(s % 2 == 0, w, 0.0), 0)
        group = tl.where(is_lab, acc, blank_sum)
        # The row first, as for a class in no alignment (a sum over no positions: -inf in log
        # space, which with an infinite loss gives NaN, as torch's); then the classes of the
        # target overwrite theirs, each written by one lane (its first position; the blank's
        # by lane 0).
        row_lp = lp + t * s_t + n * s_n
        for c0 in range(0, C, BLOCK_C):
            c = c0 + cs
            v = tl.load(row_lp + c * s_c, mask=c < C, other=0.0).to(tl.float32)
            other = (tl.exp(v) - tl.exp(NEG_INF + loss - v)) * g
            if ZERO_INFINITY:
                other = tl.where(loss == float("inf"), 0.0, other)
            tl.store(out + c * g_c, other.to(grad.dtype.element_ty), mask=c < C)
        tl.debug_barrier()
        x = tl.load(row_lp + lab * s_c, mask=valid, other=NEG_INF).to(tl.float32)
        # exp(lse over the class's positions of alpha + beta, + nll - lp) = group * e^(m + nll);
        # where lp is -inf, torch's formula gives -inf + inf: NaN, and so does this.
        posterior = tl.where(x == NEG_INF, float("nan"), group * tl.exp(m + loss))
        val = (tl.exp(x) - posterior) * g
        if ZERO_INFINITY:
            val = tl.where(loss == float("inf"), 0.0, val)
        tl.store(out + lab * g_c, val.to(grad.dtype.element_ty), mask=first | (s == 0))
