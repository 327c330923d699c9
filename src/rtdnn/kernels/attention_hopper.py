"""Attention forward for Hopper (sm_90), warp-specialized, in Gluon.

Gluon is Triton's lower-level language (`triton.experimental.gluon`, Triton 3.6): layouts,
shared memory, mbarriers, TMA copies and warp-group MMAs are explicit, and a kernel can split
its warps into partitions that run different code. That is what the forward needs on Hopper
and what Triton's scheduler does not give (kernels/attention.py's forward reaches about 500
TFLOP/s at head size 128, where cuDNN reaches 600 and more): the tensor cores idle while the
softmax of a block runs, unless other warps have their matrix products queued.

One program takes a query block of 2 * HALF rows of one batch-head and runs three partitions
(flash-attention 3's structure):

- **load** (one warp): the query block's two halves, then for every key block its K and V
  tiles, by TMA, into a ring of STAGES shared-memory stages. A stage is refilled once both
  consumers have released it (an `empty` mbarrier that counts two arrivals); the TMA's
  completion arrives on the stage's `ready` mbarrier. Rows past the sequence read as zeros.
- **two consumers** (one warp group each, rows [0, HALF) and [HALF, 2 HALF) of the block):
  the online softmax in float32 over the key blocks. Each block's S = Q K^T is issued, then
  P V of the previous block, both asynchronous; the consumer waits for S alone, runs the
  softmax while P V is on the tensor cores, then waits for it and rescales the accumulator.
  The two consumers are independent warp groups, so one's softmax also overlaps the other's
  products. Scores are in the base-2 domain (scale * log2(e) folds into exp2's argument); the
  blocks before `mask_from` (whole blocks below the sequence's end and, causal, before the
  block's first query) skip the masks.

The consumers write their rows of the output through TMA and the base-2 log-sum-exp of each
row, as kernels/attention.py's forward does (the backward reads it unchanged).

Registers: the program has 12 warps (the load warp's group is padded to four); at launch each
thread gets 168 registers (12 x 32 x 168 fills the register file), then the load group gives
its share to the consumers, which run with 240 (no spills at head size 128, sm_90 offline
compile).

Scope (ops/attention.py checks it): 16-bit q, k, v and output with head sizes 64 or 128 whose
tensors a TMA descriptor can address, no attention mask, no dropout, scale > 0, both lengths
at least 1.
"""

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

#: Query rows per consumer warp group (a program takes two groups' rows) and keys per block.
HALF_M = 64
BLOCK_N = 128
STAGES = 2
#: Registers a thread at launch (all 12 warps) and in a consumer partition.
LAUNCH_REGISTERS = 168
CONSUMER_REGISTERS = 240


@gluon.jit
def _wait_block(bars, j):
    """Wait for key block j's stage in a ring of barriers (phase flips on each round)."""
    stages: gl.constexpr = bars.type.shape[0]
    mbarrier.wait(bars.index(j % stages), (j // stages) & 1)


@gluon.jit
def _softmax_block(s, m_i, l_i, qk_scale, j, mask_from, offs_m, Lk, CAUSAL: gl.constexpr,
                   BN: gl.constexpr, s_layout: gl.constexpr):  # fmt: skip
    """The online-softmax step on key block j's raw scores s: (p, alpha, m_new, l_new), p
    relative to the new row maxima m_new (base 2), alpha the factor that rescales what was
    summed before. Blocks from mask_from on hold keys past Lk or (causal) after a query."""
    if j >= mask_from:
        offs_n = j * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))
        keep = gl.expand_dims(offs_n < Lk, 0)
        if CAUSAL:  # torch's is_causal: query i sees keys 0..i
            keep = keep & (gl.expand_dims(offs_n, 0) <= gl.expand_dims(offs_m, 1))
        s = gl.where(keep, s * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1))
        p = gl.exp2(s - gl.expand_dims(m_new, 1))
    else:
        # Every score finite; scale > 0, so the scaled row maximum is the raw one's multiple.
        m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
        p = gl.exp2(s * qk_scale - gl.expand_dims(m_new, 1))
    alpha = gl.exp2(m_i - m_new)
    l_new = l_i * alpha + gl.sum(p, 1)
    return p, alpha, m_new, l_new


@gluon.jit
def _load_partition(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_ready, k_empty,
                    v_ready, v_empty, b, h, hk, off_m, n_blocks):  # fmt: skip
    """The load partition: both halves of the query block, then each key block's K and V into
    the ring as the consumers free its stages (an empty barrier passes at once on the first
    round: mbarriers start with phase 1 complete)."""
    half: gl.constexpr = q_desc.block_type.shape[2]
    bn: gl.constexpr = k_desc.block_type.shape[2]
    stages: gl.constexpr = k_smem.type.shape[0]
    mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [b, h, off_m, 0], q_bar, q_smem.index(0))
    tma.async_copy_global_to_shared(q_desc, [b, h, off_m + half, 0], q_bar, q_smem.index(1))
    for j in range(n_blocks):
        stage = j % stages
        phase = (j // stages) & 1
        mbarrier.wait(k_empty.index(stage), phase ^ 1)
        mbarrier.expect(k_ready.index(stage), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(
            k_desc, [b, hk, j * bn, 0], k_ready.index(stage), k_smem.index(stage)
        )
        mbarrier.wait(v_empty.index(stage), phase ^ 1)
        mbarrier.expect(v_ready.index(stage), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(
            v_desc, [b, hk, j * bn, 0], v_ready.index(stage), v_smem.index(stage)
        )


@gluon.jit
def _consumer(
    half: gl.constexpr, q_smem, k_smem, v_smem, o_smem, q_bar, k_ready, k_empty, v_ready,
    v_empty, o_desc, LSE, qk_scale, b, h, bh, off_m, Lq, Lk, n_blocks, mask_from,
    CAUSAL: gl.constexpr,
):  # fmt: skip
    """One consumer warp group: rows half * HALF on of the query block, over every key block
    the load partition brings; writes those rows of the output and their lse."""
    HALF: gl.constexpr = q_smem.type.shape[3]
    D: gl.constexpr = q_smem.type.shape[4]
    BN: gl.constexpr = k_smem.type.shape[3]
    DV: gl.constexpr = v_smem.type.shape[4]
    dtype: gl.constexpr = q_smem.dtype
    warps: gl.constexpr = gl.num_warps()
    # Accumulators in the warp-group MMA's register layout; P feeds the second product from
    # registers (its layout is the accumulator's, repacked to 16 bits).
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[warps, 1], instr_shape=[16, BN, 16]
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[warps, 1], instr_shape=[16, DV, 16]
    )
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    rows_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    rows_o: gl.constexpr = gl.SliceLayout(1, o_layout)

    row0 = off_m + half * HALF
    offs_m = row0 + gl.arange(0, HALF, layout=rows_s)
    q = q_smem.index(half).reshape([HALF, D])
    zero_s = gl.zeros([HALF, BN], gl.float32, s_layout)
    m_i = gl.full([HALF], float("-inf"), gl.float32, rows_s)
    l_i = gl.zeros([HALF], gl.float32, rows_s)
    o = gl.zeros([HALF, DV], gl.float32, o_layout)

    mbarrier.wait(q_bar, 0)
    _wait_block(k_ready, 0)
    s = warpgroup_mma(q, k_smem.index(0).reshape([BN, D]).permute((1, 0)), zero_s,
                      use_acc=False, is_async=True)  # fmt: skip
    s = warpgroup_mma_wait(0, deps=(s,))
    mbarrier.arrive(k_empty.index(0), count=1)
    p, alpha, m_i, l_i = _softmax_block(
        s, m_i, l_i, qk_scale, 0, mask_from, offs_m, Lk, CAUSAL, BN, s_layout
    )
    p = gl.convert_layout(p.to(dtype), p_layout)
    stages: gl.constexpr = k_smem.type.shape[0]
    for j in range(1, n_blocks):
        _wait_block(k_ready, j)
        k = k_smem.index(j % stages).reshape([BN, D]).permute((1, 0))
        s = warpgroup_mma(q, k, zero_s, use_acc=False, is_async=True)
        _wait_block(v_ready, j - 1)
        v = v_smem.index((j - 1) % stages).reshape([BN, DV])
        o = warpgroup_mma(p, v, o, is_async=True)
        s = warpgroup_mma_wait(1, deps=(s,))  # S_j is in; P_{j-1} V_{j-1} may still run
        mbarrier.arrive(k_empty.index(j % stages), count=1)
        p_new, alpha, m_i, l_i = _softmax_block(
            s, m_i, l_i, qk_scale, j, mask_from, offs_m, Lk, CAUSAL, BN, s_layout
        )
        o, p = warpgroup_mma_wait(0, deps=(o, p))
        mbarrier.arrive(v_empty.index((j - 1) % stages), count=1)
        o = o * gl.expand_dims(gl.convert_layout(alpha, rows_o), 1)
        p = gl.convert_layout(p_new.to(dtype), p_layout)
    last = (n_blocks - 1) % stages
    _wait_block(v_ready, n_blocks - 1)
    o = warpgroup_mma(p, v_smem.index(last).reshape([BN, DV]), o, is_async=True)
    o = warpgroup_mma_wait(0, deps=(o,))
    mbarrier.arrive(v_empty.index(last), count=1)

    o = o / gl.expand_dims(gl.convert_layout(l_i, rows_o), 1)
    out = o_smem.index(half)
    out.reshape([HALF, DV]).store(o.to(dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [b, h, row0, 0], out)
    gl.store(LSE + bh * Lq + offs_m, m_i + gl.log2(l_i), mask=offs_m < Lq)
    tma.store_wait(0)


# Constant arguments reach a partition through warp_specialize as run-time values, so these
# two give the consumer its CAUSAL as a literal.
@gluon.jit
def _consumer_causal(
    half: gl.constexpr, q_smem, k_smem, v_smem, o_smem, q_bar, k_ready, k_empty, v_ready,
    v_empty, o_desc, LSE, qk_scale, b, h, bh, off_m, Lq, Lk, n_blocks, mask_from,
):  # fmt: skip
    _consumer(
        half, q_smem, k_smem, v_smem, o_smem, q_bar, k_ready, k_empty, v_ready, v_empty, o_desc,
        LSE, qk_scale, b, h, bh, off_m, Lq, Lk, n_blocks, mask_from, True,
    )  # fmt: skip


@gluon.jit
def _consumer_full(
    half: gl.constexpr, q_smem, k_smem, v_smem, o_smem, q_bar, k_ready, k_empty, v_ready,
    v_empty, o_desc, LSE, qk_scale, b, h, bh, off_m, Lq, Lk, n_blocks, mask_from,
):  # fmt: skip
    _consumer(
        half, q_smem, k_smem, v_smem, o_smem, q_bar, k_ready, k_empty, v_ready, v_empty, o_desc,
        LSE, qk_scale, b, h, bh, off_m, Lq, Lk, n_blocks, mask_from, False,
    )  # fmt: skip


@gluon.jit
def attention_forward_hopper_kernel(
    q_desc, k_desc, v_desc, o_desc, LSE, sm_scale, H, Lq, Lk, GROUP,
    CAUSAL: gl.constexpr, STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr,
):  # fmt: skip
    """Grid (cdiv(Lq, 2 * HALF), batch * H); num_warps = 4 (the first consumer; the second
    and the load warp are added). q_desc and o_desc: descriptors of the (B, H, L, E) query and
    output in [1, 1, HALF, E] blocks; k_desc, v_desc: of the keys and values (B, H / GROUP, L,
    E) in [1, 1, BN, E] blocks. LSE: contiguous (B, H, Lq) float32. sm_scale > 0."""
    HALF: gl.constexpr = q_desc.block_type.shape[2]
    BN: gl.constexpr = k_desc.block_type.shape[2]
    dtype: gl.constexpr = q_desc.dtype
    pid_m = gl.program_id(0)
    if CAUSAL:  # a query block's work grows along the sequence: longest first
        pid_m = gl.num_programs(0) - 1 - pid_m
    bh = gl.program_id(1)
    b = bh // H
    h = bh % H
    hk = h // GROUP
    off_m = pid_m * 2 * HALF
    qk_scale = sm_scale * 1.4426950408889634  # log2(e): scores in the base-2 domain

    q_smem = gl.allocate_shared_memory(dtype, [2] + q_desc.block_type.shape, q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    o_smem = gl.allocate_shared_memory(dtype, [2] + o_desc.block_type.shape, o_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)  # one arrival per consumer
        mbarrier.init(v_empty.index(i), count=2)

    n_end = Lk
    mask_from = Lk // BN  # the blocks before it hold keys below Lk only
    if CAUSAL:
        n_end = gl.minimum(Lk, off_m + 2 * HALF)
        mask_from = gl.minimum(mask_from, (off_m + 1) // BN)
    n_blocks = gl.cdiv(n_end, BN)

    consumer = (
        q_smem, k_smem, v_smem, o_smem, q_bar, k_ready, k_empty, v_ready, v_empty, o_desc, LSE,
        qk_scale, b, h, bh, off_m, Lq, Lk, n_blocks, mask_from,
    )  # fmt: skip
    loader = (
        q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty,
        b, h, hk, off_m, n_blocks,
    )  # fmt: skip
    if CAUSAL:
        gl.warp_specialize(
            [(_consumer_causal, (0,) + consumer), (_consumer_causal, (1,) + consumer),
             (_load_partition, loader)],
            [4, 1],
            [CONSUMER_REGS, 24],
        )  # fmt: skip
    else:
        gl.warp_specialize(
            [(_consumer_full, (0,) + consumer), (_consumer_full, (1,) + consumer),
             (_load_partition, loader)],
            [4, 1],
            [CONSUMER_REGS, 24],
        )  # fmt: skip


_GLUON_DTYPES = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}
#: (rows, E, dtype) -> the shared-memory layout of a block (5 us to make, 0.1 to look up).
_layouts: dict[tuple, gl.NVMMASharedLayout] = {}


def descriptor(t: torch.Tensor, rows: int) -> TensorDescriptor:
    """A TMA descriptor of the 16-bit (B, H, L, E) tensor t in [1, 1, rows, E] blocks."""
    block = [1, 1, rows, t.shape[-1]]
    key = (rows, t.shape[-1], t.dtype)
    layout = _layouts.get(key)
    if layout is None:
        layout = _layouts[key] = gl.NVMMASharedLayout.get_default_for(block, _GLUON_DTYPES[t.dtype])
    return TensorDescriptor(t, list(t.shape), list(t.stride()), block, layout)
