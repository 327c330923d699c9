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
def _keep_scale(seed, bh, offs_m, offs_n, Lk, p_drop):
    """The dropout multiplier of one (BLOCK_M, BLOCK_N) block: 1 / (1 - p_drop) where the
    element is kept, 0 where it is dropped."""
    u = tl.rand(seed + bh, offs_m[:, None] * Lk + offs_n[None, :])
    return tl.where(u >= p_drop, 1.0 / (1.0 - p_drop), 0.0)


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
def _heads(H, GROUP):
    """(batch * H + head, batch, query head, key/value head) of this program, whose grid axis 1
    runs over batch * H."""
    bh = tl.program_id(1)
    h = bh % H
    return bh, bh // H, h, h // GROUP


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
    pid_m = tl.program_id(0)
    if CAUSAL:  # blocks further down see more keys: start those first, end on short ones
        pid_m = tl.num_programs(0) - 1 - pid_m
    bh, b, h, hk = _heads(H, GROUP)
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
    sqb, sqh, sqm, sqd,
    skb, skh, skn, skd,
    svb, svh, svn, svd,
    sdob, sdoh, sdom, sdod,
    smb, smh, smm, smn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    HAS_MASK: tl.constexpr,
    CAUSAL: tl.constexpr,
    DROPOUT: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    """Grid (cdiv(Lk, BLOCK_N), batch * H): dK and dV of one key block for one query head,
    float32, contiguous (B, H, Lk, D) and (B, H, Lk, DV); the caller sums a group's heads."""
    pid_n = tl.program_id(0)
    bh, b, h, hk = _heads(H, GROUP)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)

    k = _load_tile(K + b * skb + hk * skh, offs_n, offs_d, Lk, D, skn, skd, UPCAST)
    v = _load_tile(V + b * svb + hk * svh, offs_n, offs_dv, Lk, DV, svn, svd, UPCAST)
    q_base = Q + b * sqb + h * sqh
    do_base = DO + b * sdob + h * sdoh
    m_base = b * smb + h * smh

    dk = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    dv = tl.zeros((BLOCK_N, BLOCK_DV), tl.float32)
    m_begin = 0
    if CAUSAL:
        m_begin = (pid_n * BLOCK_N) // BLOCK_M * BLOCK_M  # earlier queries see none of these keys
    for start_m in range(m_begin, Lq, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        row_ok = offs_m < Lq
        q = _load_tile(q_base, offs_m, offs_d, Lq, D, sqm, sqd, UPCAST)
        do = _load_tile(do_base, offs_m, offs_dv, Lq, DV, sdom, sdod, UPCAST)
        lse = tl.load(LSE + bh * Lq + offs_m, mask=row_ok, other=float("inf"))
        delta = tl.load(DELTA + bh * Lq + offs_m, mask=row_ok, other=0.0)
        s = _scores(
            q, k, offs_m, offs_n, M, Lq, Lk, sm_scale, m_base, smm, smn,
            HAS_MASK, CAUSAL, PRECISION,
        )  # fmt: skip
        p = tl.exp2(s - lse[:, None])
        # dV's dot before dP's: the order changes sm_90's register allocation, and the other
        # one spills far more in some float32 cases.
        if DROPOUT:
            z = _keep_scale(seed, bh, offs_m, offs_n, Lk, p_drop)
            dv = tl.dot(tl.trans((p * z).to(do.dtype)), do, dv, input_precision=PRECISION)
            dp = tl.dot(do, tl.trans(v), input_precision=PRECISION) * z
        else:
            dv = tl.dot(tl.trans(p.to(do.dtype)), do, dv, input_precision=PRECISION)
            dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        dk = tl.dot(tl.trans(ds.to(q.dtype)), q, dk, input_precision=PRECISION)
    dk = dk * sm_scale

    col_ok = offs_n < Lk
    out = bh * Lk * D + offs_n[:, None] * D + offs_d[None, :]
    tl.store(DK + out, dk, mask=col_ok[:, None] & (offs_d[None, :] < D))
    out = bh * Lk * DV + offs_n[:, None] * DV + offs_dv[None, :]
    tl.store(DV_OUT + out, dv, mask=col_ok[:, None] & (offs_dv[None, :] < DV))


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
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    """Grid (cdiv(Lq, BLOCK_M), batch * H): dQ of one query block, in DQ's dtype."""
    pid_m = tl.program_id(0)
    bh, b, h, hk = _heads(H, GROUP)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    row_ok = offs_m < Lq

    q = _load_tile(Q + b * sqb + h * sqh, offs_m, offs_d, Lq, D, sqm, sqd, UPCAST)
    do = _load_tile(DO + b * sdob + h * sdoh, offs_m, offs_dv, Lq, DV, sdom, sdod, UPCAST)
    lse = tl.load(LSE + bh * Lq + offs_m, mask=row_ok, other=float("inf"))
    delta = tl.load(DELTA + bh * Lq + offs_m, mask=row_ok, other=0.0)
    k_base = K + b * skb + hk * skh
    v_base = V + b * svb + hk * svh
    m_base = b * smb + h * smh

    dq = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    for start_n in range(0, _key_end(pid_m, Lk, BLOCK_M, CAUSAL), BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = _load_tile(k_base, offs_n, offs_d, Lk, D, skn, skd, UPCAST)
        v = _load_tile(v_base, offs_n, offs_dv, Lk, DV, svn, svd, UPCAST)
        s = _scores(
            q, k, offs_m, offs_n, M, Lq, Lk, sm_scale, m_base, smm, smn,
            HAS_MASK, CAUSAL, PRECISION,
        )  # fmt: skip
        p = tl.exp2(s - lse[:, None])
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        if DROPOUT:
            dp = dp * _keep_scale(seed, bh, offs_m, offs_n, Lk, p_drop)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=PRECISION)
    dq = dq * sm_scale
    _store_tile(DQ + b * sdqb + h * sdqh, dq, offs_m, offs_d, Lq, D, sdqm, sdqd)
