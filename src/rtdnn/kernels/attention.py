"""Fused scaled-dot-product attention (flash-attention style), forward and backward.

Tensors are addressed as (batch, head, row, column) with any strides; a stride of 0 broadcasts
(the mask over batch and heads). Query head h reads key/value head h // GROUP (grouped-query
attention). The score matrix is never materialised: the forward streams key blocks through an
online softmax in float32 and saves, per query row, the log-sum-exp (base 2, scores already
scaled by log2(e)); the backward recomputes each score block from it.

Scores are kept in the base-2 domain (exp2 is what the hardware has; the interpreter has no
libdevice). A row whose keys are all masked has no finite score: it outputs zeros and its
saved log-sum-exp is +inf, so the backward's probabilities there are exp2(-inf) = 0, which is
what torch gives for such rows.

Dropout (DROPOUT): element (i, j) of the probabilities of batch-head bh is kept where
tl.rand(seed + bh, i * Lk + j) >= p_drop and then scaled by 1 / (1 - p_drop), as flash
attention does: the row normalizer uses the probabilities before dropout, and the backward
draws the same mask again from the seed (dS = P * (Z dP - delta), Z the scaled keep mask).

UPCAST (interpreter only) converts 16-bit tiles to float32 before tl.dot, whose bfloat16
product is wrong under Triton's interpreter (see brgemm.py).
"""

import triton
import triton.language as tl


@triton.jit
def _scores(
    q,
    k,
    offs_m,
    offs_n,
    M,
    Lq,
    Lk,
    sm_scale,
    m_base,
    stride_mm,
    stride_mn,
    HAS_MASK: tl.constexpr,
    CAUSAL: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """One (BLOCK_M, BLOCK_N) block of scores in the base-2 domain: (q k^T * scale + mask) *
    log2(e), -inf where the key is out of range, masked out or (causal) after the query."""
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * sm_scale
    valid = (offs_m[:, None] < Lq) & (offs_n[None, :] < Lk)
    if HAS_MASK:
        bias = tl.load(
            M + m_base + offs_m[:, None] * stride_mm + offs_n[None, :] * stride_mn,
            mask=valid,
            other=0.0,
        )
        s = s + bias.to(tl.float32)
    s = s * 1.4426950408889634  # log2(e)
    keep = offs_n[None, :] < Lk
    if CAUSAL:
        # torch's is_causal: top-left aligned, query i sees keys 0..i.
        keep = keep & (offs_n[None, :] <= offs_m[:, None])
    return tl.where(keep, s, float("-inf"))


@triton.jit
def _keep_at(seed, bh, counters, p_drop):
    """The dropout multiplier at the elements numbered `counters` (i * Lk + j for element
    (i, j), in any arrangement: the draw depends on the number only) of batch-head bh:
    1 / (1 - p_drop) where the element is kept, 0 where it is dropped."""
    u = tl.rand(seed + bh, counters)
    return tl.where(u >= p_drop, 1.0 / (1.0 - p_drop), 0.0)


@triton.jit
def _keep_scale(seed, bh, offs_m, offs_n, Lk, p_drop):
    """The dropout multiplier of one (BLOCK_M, BLOCK_N) block (see _keep_at)."""
    return _keep_at(seed, bh, offs_m[:, None] * Lk + offs_n[None, :], p_drop)


@triton.jit
def attention_dropout_keep_kernel(
    KEEP, seed, p_drop, H, Lq, Lk, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
):
    """Grid (cdiv(Lq, BLOCK_M), cdiv(Lk, BLOCK_N), batch * H): the keep mask (int8, contiguous
    (B, H, Lq, Lk)) that the attention kernels draw for this seed and probability."""
    bh = tl.program_id(2)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    keep = _keep_scale(seed, bh, offs_m, offs_n, Lk, p_drop) > 0.0
    ok = (offs_m < Lq)[:, None] & (offs_n < Lk)[None, :]
    ptrs = KEEP + bh.to(tl.int64) * Lq * Lk + offs_m[:, None] * Lk + offs_n[None, :]
    tl.store(ptrs, keep.to(tl.int8), mask=ok)


@triton.jit
def _heads(bh, H, GROUP):
    """(batch, query head, key/value head) of row bh = batch * H + head."""
    h = bh % H
    return bh // H, h, h // GROUP


# How many heads' blocks a causal grid interleaves (see _block_and_row).
CAUSAL_CHUNK = tl.constexpr(8)


@triton.jit
def _block_and_row(CAUSAL: tl.constexpr, LONGEST_LAST: tl.constexpr):
    """(block, row) of this program in a grid (blocks, rows): the block along the sequence and
    the row of batch x heads it works on.

    Without a causal mask every block has the same work and programs take them in grid order:
    the programs running at once share a head, whose keys and values stay in L2. With one, a
    block's work grows along the sequence (LONGEST_LAST: query blocks, which see more keys
    further down; otherwise key blocks, seen by fewer queries), and a grid that ends on long
    blocks leaves most multiprocessors idle while they finish. So programs walk chunks of
    CAUSAL_CHUNK rows, each chunk's blocks longest first and its rows side by side: every
    chunk ends on short blocks, and the programs running at once still cover few heads."""
    blocks = tl.num_programs(0)
    if not CAUSAL:
        return tl.program_id(0), tl.program_id(1)
    rows = tl.num_programs(1)
    pid = tl.program_id(1) * blocks + tl.program_id(0)
    chunk = pid // (CAUSAL_CHUNK * blocks)
    first = chunk * CAUSAL_CHUNK
    width = tl.minimum(CAUSAL_CHUNK, rows - first)
    rank = pid - first * blocks
    block = rank // width
    if LONGEST_LAST:
        block = blocks - 1 - block
    return block, first + rank % width


@triton.jit
def _load_tile(ptr, rows, cols, n_rows, n_cols, stride_r, stride_c, UPCAST: tl.constexpr):
    """The (len(rows), len(cols)) tile of the matrix at ptr, zero outside n_rows x n_cols;
    float32 if UPCAST."""
    t = tl.load(
        ptr + rows[:, None] * stride_r + cols[None, :] * stride_c,
        mask=(rows < n_rows)[:, None] & (cols[None, :] < n_cols),
        other=0.0,
    )
    if UPCAST:
        t = t.to(tl.float32)
    return t


@triton.jit
def _store_tile(ptr, tile, rows, cols, n_rows, n_cols, stride_r, stride_c):
    """Store tile, in ptr's dtype, where _load_tile would read it."""
    tl.store(
        ptr + rows[:, None] * stride_r + cols[None, :] * stride_c,
        tile.to(ptr.dtype.element_ty),
        mask=(rows < n_rows)[:, None] & (cols[None, :] < n_cols),
    )


@triton.jit
def _key_end(pid_m, Lk, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr):
    """Where query block pid_m's loop over keys ends: Lk or, causal, one past the block's last
    row (later keys are masked for every row of the block)."""
    n_end = Lk
    if CAUSAL:
        n_end = tl.minimum(Lk, (pid_m + 1) * BLOCK_M)
    return n_end


@triton.jit
def _forward_blocks(
    acc, l_i, m_i, q, K, V, lo, hi, b, hk, bh, offs_m, M, m_base, sm_scale, qk_scale, p_drop,
    seed, Lq, Lk, D, DV, skb, skh, skn, skd, svb, svh, svn, svd, smm, smn,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, EDGE: tl.constexpr,
    HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr,
    NEG_SCALE: tl.constexpr, TMA: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """The forward's online softmax over key blocks [lo, hi) (lo a multiple of BLOCK_N).

    EDGE blocks may hold keys past Lk or (causal) after some query of the block and go through
    _scores' masks. The others, the bulk of the work, hold none of those: without an attention
    mask their scores skip every mask, and the scale and log2(e) fold into the exponent's
    multiply-add (exp2(qk * qk_scale - m)), which matters because the softmax's few float32
    operations per score compete with the tensor cores for the loop's time."""
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    if not TMA:
        k_base = K + b * skb + hk * skh
        v_base = V + b * svb + hk * svh
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        if TMA:  # keys past Lk read as zeros, filled in by the hardware
            k = K.load([b, hk, start_n, 0]).reshape(BLOCK_N, BLOCK_D)
        else:
            k = _load_tile(k_base, offs_n, offs_d, Lk, D, skn, skd, UPCAST)
        if EDGE or HAS_MASK:
            s = _scores(
                q, k, offs_m, offs_n, M, Lq, Lk, sm_scale, m_base, smm, smn,
                HAS_MASK, CAUSAL, PRECISION,
            )  # fmt: skip
            m_new = tl.maximum(m_i, tl.max(s, 1))
            # A row with no finite score yet subtracts 0, not -inf (-inf - -inf is NaN).
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp2(s - m_safe[:, None])
        else:
            # Every score here is finite, so is every row's maximum (the row sees key 0 or
            # an earlier block). The scaled scores' row maximum is the unscaled ones' maximum
            # (minimum, for a negative scale) times the scale.
            qk = tl.dot(q, tl.trans(k), input_precision=PRECISION)
            if NEG_SCALE:
                m_new = tl.maximum(m_i, tl.min(qk, 1) * qk_scale)
            else:
                m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            m_safe = m_new
            p = tl.exp2(qk * qk_scale - m_new[:, None])
        alpha = tl.exp2(m_i - m_safe)
        acc = acc * alpha[:, None]
        if TMA:
            v = V.load([b, hk, start_n, 0]).reshape(BLOCK_N, BLOCK_DV)
        else:
            v = _load_tile(v_base, offs_n, offs_dv, Lk, DV, svn, svd, UPCAST)
        # The row sums take every probability, the values only the kept ones (dropout).
        l_i = l_i * alpha + tl.sum(p, 1)
        if DROPOUT:
            p = p * _keep_scale(seed, bh, offs_m, offs_n, Lk, p_drop)
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def attention_forward_kernel(
    Q,
    K,
    V,
    OUT,
    LSE,
    M,
    sm_scale,
    p_drop,
    seed,
    H,
    Lq,
    Lk,
    D,
    DV,
    GROUP,
    sqb, sqh, sqm, sqd,
    skb, skh, skn, skd,
    svb, svh, svn, svd,
    sob, soh, som, sod,
    smb, smh, smm, smn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    HAS_MASK: tl.constexpr,
    CAUSAL: tl.constexpr,
    DROPOUT: tl.constexpr,
    NEG_SCALE: tl.constexpr,
    TMA: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    """Grid (cdiv(Lq, BLOCK_M), batch * H). OUT: (B, H, Lq, DV); LSE: contiguous (B, H, Lq)
    float32. NEG_SCALE: sm_scale < 0.

    TMA: Q, K, V and OUT are host-side tensor descriptors of the (B, H, L, E) tensors with
    [1, 1, rows, BLOCK_D or BLOCK_DV] blocks (their strides are then unused): tiles come from
    the tensor memory accelerator straight into shared memory, where the tensor cores read
    them, with no address arithmetic or masks per element; rows and columns outside a head's
    tensor read as zeros and are not written. Otherwise they are pointers, with any strides."""
    pid_m, bh = _block_and_row(CAUSAL, True)
    b, h, hk = _heads(bh, H, GROUP)
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    if TMA:
        q = Q.load([b, h, start_m, 0]).reshape(BLOCK_M, BLOCK_D)
    else:
        q = _load_tile(
            Q + b * sqb + h * sqh, offs_m, tl.arange(0, BLOCK_D), Lq, D, sqm, sqd, UPCAST
        )
    m_base = b * smb + h * smh
    qk_scale = sm_scale * 1.4426950408889634  # log2(e): scores in the base-2 domain

    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_DV), tl.float32)
    # Keys [0, n_full) are whole blocks before Lk and (causal) before the block's first query.
    n_full = Lk
    if CAUSAL:
        n_full = tl.minimum(Lk, start_m)
    n_full = n_full // BLOCK_N * BLOCK_N
    acc, l_i, m_i = _forward_blocks(
        acc, l_i, m_i, q, K, V, 0, n_full, b, hk, bh, offs_m, M, m_base, sm_scale, qk_scale,
        p_drop, seed, Lq, Lk, D, DV, skb, skh, skn, skd, svb, svh, svn, svd, smm, smn,
        BLOCK_N, BLOCK_D, BLOCK_DV, False, HAS_MASK, CAUSAL, DROPOUT, NEG_SCALE, TMA, UPCAST,
        PRECISION,
    )  # fmt: skip
    # The rest: the partial last block, and (causal) the blocks on the diagonal.
    acc, l_i, m_i = _forward_blocks(
        acc, l_i, m_i, q, K, V, n_full, _key_end(pid_m, Lk, BLOCK_M, CAUSAL), b, hk, bh, offs_m,
        M, m_base, sm_scale, qk_scale, p_drop, seed, Lq, Lk, D, DV, skb, skh, skn, skd, svb,
        svh, svn, svd, smm, smn, BLOCK_N, BLOCK_D, BLOCK_DV, True, HAS_MASK, CAUSAL, DROPOUT,
        NEG_SCALE, TMA, UPCAST, PRECISION,
    )  # fmt: skip

    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    if TMA:
        OUT.store([b, h, start_m, 0], out.to(OUT.dtype).reshape(1, 1, BLOCK_M, BLOCK_DV))
    else:
        offs_dv = tl.arange(0, BLOCK_DV)
        _store_tile(OUT + b * sob + h * soh, out, offs_m, offs_dv, Lq, DV, som, sod)
    lse = tl.where(empty, float("inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))
    tl.store(LSE + bh * Lq + offs_m, lse, mask=offs_m < Lq)


# The backward: a preprocessing kernel for delta, then dK and dV per key block (looping over
# query blocks) and dQ per query block (looping over key blocks). Each recomputes the
# probabilities P = exp2(S - lse) of its blocks; the two passes keep every gradient a plain
# sum in one program (deterministic, no atomics) at the price of computing Q K^T and dO V^T
# twice.


@triton.jit
def attention_backward_delta_kernel(
    OUT, DO, DELTA, H, Lq, DV, sob, soh, som, sod, sdob, sdoh, sdom, sdod,
    BLOCK_M: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    """Grid (cdiv(Lq, BLOCK_M), batch * H): delta_i = sum_j dO_ij O_ij (= sum_j P_ij dP_ij, what
    dS = P (dP - delta) subtracts), float32, contiguous (B, H, Lq). One pass over O and dO, where
    the same sum in torch (two conversions, a product, a reduction) makes several."""
    bh = tl.program_id(1)
    b, h, _ = _heads(bh, H, 1)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_dv = tl.arange(0, BLOCK_DV)
    o = _load_tile(OUT + b * sob + h * soh, offs_m, offs_dv, Lq, DV, som, sod, True)
    do = _load_tile(DO + b * sdob + h * sdoh, offs_m, offs_dv, Lq, DV, sdom, sdod, True)
    tl.store(DELTA + bh * Lq + offs_m, tl.sum(o * do, 1), mask=offs_m < Lq)


@triton.jit
def _dkdv_blocks(
    dk, dv, k, v, Q, DO, LSE, DELTA, M, lo, hi, b, h, bh, offs_n, m_base, sm_scale, qk_scale,
    p_drop, seed, Lq, Lk, D, DV, sqb, sqh, sqm, sqd, sdob, sdoh, sdom, sdod, smm, smn,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    DIAGONAL: tl.constexpr, HAS_MASK: tl.constexpr, DROPOUT: tl.constexpr, TMA: tl.constexpr,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """Add the query blocks [lo, hi) of query head h (lo a multiple of BLOCK_M) to one key
    block's dK and dV (both unscaled).

    Everything is computed transposed, keys along the rows: P^T = exp2(K Q^T * scale - lse),
    dV += P^T dO, dP^T = V dO^T, dS^T = P^T (dP^T - delta), dK += dS^T Q. The matrices made in
    registers (P^T, dS^T) are then the left operands of the next products, which Hopper's MMA
    reads from registers as they are, and the transposed operands (Q^T, dO^T) come from
    memory, where a transpose is only another way of reading shared memory. The untransposed
    form needs P and dS transposed in registers, a round trip through shared memory per block.

    No mask for sequence ends: query rows past Lq read lse = +inf and so have P = 0, and key
    rows past Lk only make rows of dK and dV that are never stored. DIAGONAL blocks (causal)
    hold keys after some of their queries and zero those probabilities; the others, the bulk
    of the work, skip the mask, and the scale and log2(e) fold into exp2's multiply-add."""
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    if not TMA:
        q_base = Q + b * sqb + h * sqh
        do_base = DO + b * sdob + h * sdoh
    for start_m in range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        offs_m = start_m + tl.arange(0, BLOCK_M)
        row_ok = offs_m < Lq
        if TMA:
            q = Q.load([b, h, start_m, 0]).reshape(BLOCK_M, BLOCK_D)
        else:
            q = _load_tile(q_base, offs_m, offs_d, Lq, D, sqm, sqd, UPCAST)
        lse = tl.load(LSE + bh * Lq + offs_m, mask=row_ok, other=float("inf"))
        qk_t = tl.dot(k, tl.trans(q), input_precision=PRECISION)
        if HAS_MASK:
            bias = tl.load(
                M + m_base + offs_m[None, :] * smm + offs_n[:, None] * smn,
                mask=row_ok[None, :] & (offs_n[:, None] < Lk),
                other=0.0,
            )
            s_t = (qk_t * sm_scale + bias.to(tl.float32)) * 1.4426950408889634
            p_t = tl.exp2(s_t - lse[None, :])
        else:
            p_t = tl.exp2(qk_t * qk_scale - lse[None, :])
        if DIAGONAL:  # torch's is_causal: query i sees keys 0..i
            p_t = tl.where(offs_n[:, None] <= offs_m[None, :], p_t, 0.0)
        if TMA:
            do = DO.load([b, h, start_m, 0]).reshape(BLOCK_M, BLOCK_DV)
        else:
            do = _load_tile(do_base, offs_m, offs_dv, Lq, DV, sdom, sdod, UPCAST)
        delta = tl.load(DELTA + bh * Lq + offs_m, mask=row_ok, other=0.0)
        # dV's product before dP's: the order changes sm_90's register allocation, and the
        # other one spills far more in some float32 cases.
        if DROPOUT:
            z_t = _keep_at(seed, bh, offs_m[None, :] * Lk + offs_n[:, None], p_drop)
            dv = tl.dot((p_t * z_t).to(do.dtype), do, dv, input_precision=PRECISION)
            dp_t = tl.dot(v, tl.trans(do), input_precision=PRECISION) * z_t
        else:
            dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=PRECISION)
            dp_t = tl.dot(v, tl.trans(do), input_precision=PRECISION)
        ds_t = p_t * (dp_t - delta[None, :])
        dk = tl.dot(ds_t.to(q.dtype), q, dk, input_precision=PRECISION)
    return dk, dv


@triton.jit
def attention_backward_dkdv_kernel(
    Q,
    K,
    V,
    DO,
    LSE,
    DELTA,
    DK,
    DV_OUT,
    M,
    sm_scale,
    p_drop,
    seed,
    H,
    Lq,
    Lk,
    D,
    DV,
    GROUP,
    HEADS,
    sqb, sqh, sqm, sqd,
    skb, skh, skn, skd,
    svb, svh, svn, svd,
    sdob, sdoh, sdom, sdod,
    smb, smh, smm, smn,
    sdkb, sdkh, sdkn, sdkd,
    sdvb, sdvh, sdvn, sdvd,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    HAS_MASK: tl.constexpr,
    CAUSAL: tl.constexpr,
    DROPOUT: tl.constexpr,
    TMA: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
    SPLIT_DIAGONAL: tl.constexpr,
):  # fmt: skip
    """Grid (cdiv(Lk, BLOCK_N), batch * H // HEADS), in _block_and_row's order: dK and dV of
    one key block, summed over HEADS consecutive query heads, written to head
    (row % (H // HEADS)) of DK and
    DV_OUT in their dtype. HEADS = GROUP sums a key/value head's whole group in one program
    (in a fixed order: deterministic, and no per-query-head buffer to add up afterwards);
    HEADS = 1 leaves that sum to the caller.

    TMA: Q, K, V and DO are tensor descriptors with [1, 1, BLOCK_M or BLOCK_N, BLOCK_D or
    BLOCK_DV] blocks (see attention_forward_kernel); otherwise pointers with any strides."""
    pid_n, row = _block_and_row(CAUSAL, False)
    n_out = H // HEADS
    b = row // n_out
    out_head = row % n_out
    h0 = out_head * HEADS
    hk = h0 // GROUP
    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    if TMA:
        k = K.load([b, hk, start_n, 0]).reshape(BLOCK_N, BLOCK_D)
        v = V.load([b, hk, start_n, 0]).reshape(BLOCK_N, BLOCK_DV)
    else:
        k = _load_tile(K + b * skb + hk * skh, offs_n, offs_d, Lk, D, skn, skd, UPCAST)
        v = _load_tile(V + b * svb + hk * svh, offs_n, offs_dv, Lk, DV, svn, svd, UPCAST)
    qk_scale = sm_scale * 1.4426950408889634  # log2(e): scores in the base-2 domain

    # Causal: queries before the key block see none of it; those in [m_begin, m_full) see
    # part of it (the diagonal); from m_full on, all of it. SPLIT_DIAGONAL runs those apart,
    # so that only the diagonal's blocks pay for the mask; otherwise one loop masks every
    # block (see _backward_config).
    m_begin = 0
    m_full = 0
    if CAUSAL:
        m_begin = start_n // BLOCK_M * BLOCK_M
        m_full = m_begin
        if SPLIT_DIAGONAL:
            m_full = tl.minimum((start_n + BLOCK_N - 1 + BLOCK_M - 1) // BLOCK_M * BLOCK_M, Lq)
    dk = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    dv = tl.zeros((BLOCK_N, BLOCK_DV), tl.float32)
    for i in range(HEADS):
        h = h0 + i
        bh = b * H + h
        m_base = b * smb + h * smh
        if CAUSAL and SPLIT_DIAGONAL:
            dk, dv = _dkdv_blocks(
                dk, dv, k, v, Q, DO, LSE, DELTA, M, m_begin, m_full, b, h, bh, offs_n,
                m_base, sm_scale, qk_scale, p_drop, seed, Lq, Lk, D, DV, sqb, sqh, sqm, sqd,
                sdob, sdoh, sdom, sdod, smm, smn, BLOCK_M, BLOCK_D, BLOCK_DV, True, HAS_MASK,
                DROPOUT, TMA, UPCAST, PRECISION,
            )  # fmt: skip
        dk, dv = _dkdv_blocks(
            dk, dv, k, v, Q, DO, LSE, DELTA, M, m_full, Lq, b, h, bh, offs_n, m_base,
            sm_scale, qk_scale, p_drop, seed, Lq, Lk, D, DV, sqb, sqh, sqm, sqd, sdob, sdoh,
            sdom, sdod, smm, smn, BLOCK_M, BLOCK_D, BLOCK_DV, CAUSAL and not SPLIT_DIAGONAL,
            HAS_MASK, DROPOUT, TMA, UPCAST, PRECISION,
        )  # fmt: skip
    dk = dk * sm_scale
    _store_tile(DK + b * sdkb + out_head * sdkh, dk, offs_n, offs_d, Lk, D, sdkn, sdkd)
    _store_tile(DV_OUT + b * sdvb + out_head * sdvh, dv, offs_n, offs_dv, Lk, DV, sdvn, sdvd)


@triton.jit
def _dq_blocks(
    dq, q, do, lse, delta, K, V, M, lo, hi, b, hk, bh, offs_m, m_base, sm_scale, qk_scale,
    p_drop, seed, Lq, Lk, D, DV, skb, skh, skn, skd, svb, svh, svn, svd, smm, smn,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, EDGE: tl.constexpr,
    HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr, TMA: tl.constexpr,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """Add the key blocks [lo, hi) (lo a multiple of BLOCK_N) to one query block's dQ
    (unscaled): P = exp2(Q K^T * scale - lse), dS = P (dO V^T - delta), dQ += dS K.

    EDGE blocks may hold keys past Lk or (causal) after some query of the block, whose
    probabilities are zeroed: keys past Lk read as zeros, but their exp2(-lse) could overflow
    and, times a zero key, make NaN. The others skip the masks and fold the scale and log2(e)
    into exp2's multiply-add, as in the forward."""
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    if not TMA:
        k_base = K + b * skb + hk * skh
        v_base = V + b * svb + hk * svh
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        if TMA:
            k = K.load([b, hk, start_n, 0]).reshape(BLOCK_N, BLOCK_D)
        else:
            k = _load_tile(k_base, offs_n, offs_d, Lk, D, skn, skd, UPCAST)
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        if HAS_MASK:
            bias = tl.load(
                M + m_base + offs_m[:, None] * smm + offs_n[None, :] * smn,
                mask=(offs_m[:, None] < Lq) & (offs_n[None, :] < Lk),
                other=0.0,
            )
            s = (qk * sm_scale + bias.to(tl.float32)) * 1.4426950408889634
            p = tl.exp2(s - lse[:, None])
        else:
            p = tl.exp2(qk * qk_scale - lse[:, None])
        if EDGE:
            keep = offs_n[None, :] < Lk
            if CAUSAL:
                keep = keep & (offs_n[None, :] <= offs_m[:, None])
            p = tl.where(keep, p, 0.0)
        if TMA:
            v = V.load([b, hk, start_n, 0]).reshape(BLOCK_N, BLOCK_DV)
        else:
            v = _load_tile(v_base, offs_n, offs_dv, Lk, DV, svn, svd, UPCAST)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        if DROPOUT:
            dp = dp * _keep_at(seed, bh, offs_m[:, None] * Lk + offs_n[None, :], p_drop)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=PRECISION)
    return dq


@triton.jit
def attention_backward_dq_kernel(
    Q,
    K,
    V,
    DO,
    LSE,
    DELTA,
    DQ,
    M,
    sm_scale,
    p_drop,
    seed,
    H,
    Lq,
    Lk,
    D,
    DV,
    GROUP,
    sqb, sqh, sqm, sqd,
    skb, skh, skn, skd,
    svb, svh, svn, svd,
    sdob, sdoh, sdom, sdod,
    smb, smh, smm, smn,
    sdqb, sdqh, sdqm, sdqd,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    HAS_MASK: tl.constexpr,
    CAUSAL: tl.constexpr,
    DROPOUT: tl.constexpr,
    TMA: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    """Grid (cdiv(Lq, BLOCK_M), batch * H): dQ of one query block, in DQ's dtype. TMA: Q, K, V
    and DO are tensor descriptors (see attention_backward_dkdv_kernel)."""
    pid_m, bh = _block_and_row(CAUSAL, True)
    b, h, hk = _heads(bh, H, GROUP)
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    row_ok = offs_m < Lq
    if TMA:
        q = Q.load([b, h, start_m, 0]).reshape(BLOCK_M, BLOCK_D)
        do = DO.load([b, h, start_m, 0]).reshape(BLOCK_M, BLOCK_DV)
    else:
        offs_d = tl.arange(0, BLOCK_D)
        offs_dv = tl.arange(0, BLOCK_DV)
        q = _load_tile(Q + b * sqb + h * sqh, offs_m, offs_d, Lq, D, sqm, sqd, UPCAST)
        do = _load_tile(DO + b * sdob + h * sdoh, offs_m, offs_dv, Lq, DV, sdom, sdod, UPCAST)
    # Rows past Lq: lse = +inf, so P = 0 there (and nothing is stored).
    lse = tl.load(LSE + bh * Lq + offs_m, mask=row_ok, other=float("inf"))
    delta = tl.load(DELTA + bh * Lq + offs_m, mask=row_ok, other=0.0)
    m_base = b * smb + h * smh
    qk_scale = sm_scale * 1.4426950408889634

    # Keys [0, n_full) are whole blocks before Lk and (causal) at or before the block's first
    # query, which every row of the block sees.
    n_full = Lk
    if CAUSAL:
        n_full = tl.minimum(Lk, start_m + 1)
    n_full = n_full // BLOCK_N * BLOCK_N
    dq = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    dq = _dq_blocks(
        dq, q, do, lse, delta, K, V, M, 0, n_full, b, hk, bh, offs_m, m_base, sm_scale,
        qk_scale, p_drop, seed, Lq, Lk, D, DV, skb, skh, skn, skd, svb, svh, svn, svd, smm,
        smn, BLOCK_N, BLOCK_D, BLOCK_DV, False, HAS_MASK, CAUSAL, DROPOUT, TMA, UPCAST, PRECISION,
    )  # fmt: skip
    dq = _dq_blocks(
        dq, q, do, lse, delta, K, V, M, n_full, _key_end(pid_m, Lk, BLOCK_M, CAUSAL), b, hk,
        bh, offs_m, m_base, sm_scale, qk_scale, p_drop, seed, Lq, Lk, D, DV, skb, skh, skn,
        skd, svb, svh, svn, svd, smm, smn, BLOCK_N, BLOCK_D, BLOCK_DV, True, HAS_MASK, CAUSAL,
        DROPOUT, TMA, UPCAST, PRECISION,
    )  # fmt: skip
    dq = dq * sm_scale
    offs_d = tl.arange(0, BLOCK_D)
    _store_tile(DQ + b * sdqb + h * sdqh, dq, offs_m, offs_d, Lq, D, sdqm, sdqd)
