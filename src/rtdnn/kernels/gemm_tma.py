"""The building block's Hopper path for plain matrices: a persistent GEMM whose operands arrive
through TMA tensor descriptors.

    C = act(alpha * A @ B + bias + beta * C)

A plain matrix (a linear layer's activations and weights; a 1x1, stride-1 convolution's
channels-last pixels and filter) needs no per-element addresses: a host-side tensor descriptor
names its base, shape and strides once, and each step asks the copy engine for a box of it.
The engine fills the parts of a box outside the matrix with zeros, so the edges need no masks
either. Without addresses and masks a step is little more than its copies and the warp-group
MMA, which the pointer path (brgemm_kernel with strided addressing) cannot reach: on an H200
this kernel ran 0.83 to 0.98 of cuBLAS's speed on ViT and ResNet-50 shapes where the pointer
path ran 0.30 to 0.94 (benchmarks/probes/plain_gemm_probe.py).

A is M x K, stored so (A_T false) or transposed (A_T: a K x M matrix, e.g. dy for a weight
gradient dy^T @ x); B is K x N, stored so or transposed (B_T: an N x K matrix, e.g. a linear
layer's weight). Either way each operand's last dimension must be contiguous and its other
stride a multiple of 16 bytes, and its base 16-byte aligned (the copy engine's rules).

Persistent: NUM_PROGRAMS programs (one per multiprocessor at most) walk the output tiles in
grouped order, so each program's next tile's loads overlap its current tile's epilogue (the
loops are flattened into one software pipeline).

Split-K (SPLITS > 1, for short outputs over long reductions such as weight gradients, and to
even out the last wave of tiles): the jobs are (split, tile) pairs; each writes a float32
partial tile to WS, and brgemm.split_finish_kernel, a second launch, adds them in a fixed order
(deterministic) and applies the epilogue, over small tiles on every multiprocessor. (A finish
in the same launch by the last split of a tile to arrive, as brgemm_kernel can do, is one
program per tile: at 32 splits it took longer than the GEMM.) The output goes through pointer
stores (any strides, masked edges).
"""

import triton
import triton.language as tl

from .brgemm import epilogue, tile_coords


@triton.jit
def gemm_tma_kernel(
    A,
    B,
    C,
    BIAS,
    WS,
    M,
    N,
    K,
    stride_cm,
    stride_cn,
    alpha,
    beta,
    A_T: tl.constexpr,
    B_T: tl.constexpr,
    ACTIVATION: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BETA_NONZERO: tl.constexpr,
    SPLITS: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(k_tiles, SPLITS)
    for job in tl.range(tl.program_id(0), tiles * SPLITS, NUM_PROGRAMS, flatten=True):
        tile = job % tiles
        split = job // tiles
        pid_m, pid_n = tile_coords(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        k_begin = split * per_split
        k_end = tl.minimum(k_begin + per_split, k_tiles)
        for ki in range(k_begin, k_end):
            off_k = ki * BLOCK_K
            if A_T:
                a = A.load([off_k, off_m]).T
            else:
                a = A.load([off_m, off_k])
            if B_T:
                b = B.load([off_n, off_k]).T
            else:
                b = B.load([off_k, off_n])
            if UPCAST:
                # Triton's interpreter multiplies bfloat16 tiles wrongly: give it float32 ones.
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b, acc, input_precision=PRECISION)

        offs_m = off_m + tl.arange(0, BLOCK_M)
        offs_n = off_n + tl.arange(0, BLOCK_N)
        inside = (offs_m < M)[:, None] & (offs_n < N)[None, :]
        offs = offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
        if SPLITS == 1:
            epilogue(
                C, offs, inside, acc, alpha, beta, BIAS, offs_n, offs_n < N, HAS_BIAS,
                BETA_NONZERO, ACTIVATION,
            )  # fmt: skip
        else:
            # WS is float32 [SPLITS, M, N], row-major; int64 offsets: it can pass 2^31 elements.
            partial = WS + offs_m[:, None] * N + offs_n[None, :]
            tl.store(partial + split.to(tl.int64) * M * N, acc, mask=inside)
