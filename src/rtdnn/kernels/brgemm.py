"""The building block: a batch-reduce GEMM with pluggable operand addressing and epilogue.

    C[b] = act(alpha * sum_t A[b, t] @ B[b, t] + bias + beta * C[b])

Each program computes one BLOCK_M x BLOCK_N tile of C for one batch entry `b`. The reduction
runs over "steps" t; what a step is (a filter tap and a chunk of channels, a chunk of pixels, a
chunk of a plain K dimension) is decided by the addressing functions, which are `@triton.jit`
functions passed in as compile-time arguments:

    A_SETUP(a_geo, b, offs_m)                   -> per-row state, computed once
    A_LOAD(A, a_geo, state, b, t, offs_k, BK)   -> the [BLOCK_M, BLOCK_K] tile of step t
    B_SETUP(b_geo, b, offs_n)                   -> per-column state
    B_LOAD(B, b_geo, state, b, t, offs_k, BK)   -> the [BLOCK_K, BLOCK_N] tile of step t
    C_ADDR(c_geo, b, offs_m, offs_n)            -> (element offsets, mask, channel of each column)

`*_geo` are tuples of integers (sizes and strides) that only the addressing functions read.
They arrive as one tuple `geos` of the distinct geometries, picked by the compile-time indices
A_GEO, B_GEO and C_GEO: a convolution passes its geometry once, not three times, which keeps
the launch cheap (the host-side cost of a launch grows with the number of arguments).
Convolution in every direction, explicit-GEMM convolution and linear layers are all this one
kernel with different addressing (see `conv_addressing.py` and `strided.py`).

Split-K: with SPLITS > 1 the steps of each tile are divided among SPLITS programs which write
float32 partial tiles to a workspace. With FINISH the last of them to finish (see arrival.py)
sums them in a fixed order (deterministic) and applies the epilogue, all in the one launch;
that is one program per tile reading every split's partial tile, which is slow for many
splits, so without FINISH split_finish_kernel does it in a second launch, over small tiles
that every multiprocessor shares (the same order, the same result).

UPCAST is set only under Triton's interpreter (TRITON_INTERPRET=1), whose tl.dot returns
garbage for bfloat16 tiles: the tiles are converted to float32 first, which gives the product
a GPU computes (exact products, float32 accumulation). Compiled kernels get UPCAST=False, a
branch removed at compile time.

PRECISION is tl.dot's input precision ("ieee", "tf32"), or "bf16x3": float32 tiles each split
into a bfloat16 head and the bfloat16 rounding of what is left, multiplied as three bfloat16
products (head x head, head x tail, tail x head; the tail x tail term is dropped). Each product
is then within about 2^-15 of the exact one (3e-6 typical), against TF32's 2^-11, and Hopper's
bfloat16 products, unlike its TF32 ones, read operands of either major order: what TF32 math
mode runs where both operands have the reduced dimension outermost (weight gradients of
channels-last tensors), which TF32 products could only read through 4-byte copies into shared
memory.
"""

import triton
import triton.language as tl

from .arrival import last_to_arrive


@triton.jit
def identity(x):
    return x


@triton.jit
def relu(x):
    # `x < 0` is False for NaN, so NaN passes through as in torch.relu (tl.maximum drops it).
    return tl.where(x < 0.0, 0.0, x)


@triton.jit
def epilogue(
    C,
    offs,
    mask,
    acc,
    alpha,
    beta,
    BIAS,
    chan,
    chan_mask,
    HAS_BIAS: tl.constexpr,
    BETA_NONZERO: tl.constexpr,
    ACTIVATION: tl.constexpr,
):
    """Scale, add bias and the prior output, apply the activation, cast and store."""
    out = acc * alpha
    if HAS_BIAS:
        bias = tl.load(BIAS + chan, mask=chan_mask, other=0.0).to(tl.float32)
        out += bias[None, :]
    if BETA_NONZERO:
        # Read C only when beta != 0: an unset output may hold NaN, and 0 * NaN is NaN.
        out += beta * tl.load(C + offs, mask=mask, other=0.0).to(tl.float32)
    out = ACTIVATION(out)
    tl.store(C + offs, out.to(C.dtype.element_ty), mask=mask)


#: The largest finite bfloat16, (2 - 2^-7) * 2^127.
BF16_MAX = tl.constexpr(3.3895313892515355e38)


@triton.jit
def bf16_split(x):
    """float32 x as head + tail, both bfloat16: head = bf16(x), tail = bf16(x - head). The head
    is taken of x clamped to bfloat16's finite range, so a finite x near float32's largest
    never gets an infinite head (the tail then holds the excess), and an infinite x an infinite
    tail: its products stay infinite, or NaN against a zero, as float32's are."""
    head = tl.clamp(x, -BF16_MAX, BF16_MAX, propagate_nan=tl.PropagateNan.ALL).to(tl.bfloat16)
    return head, (x - head.to(tl.float32)).to(tl.bfloat16)


@triton.jit
def mma(a, b, acc, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """acc + a @ b at PRECISION (see the module's docstring)."""
    if PRECISION == "bf16x3":
        a_head, a_tail = bf16_split(a.to(tl.float32))
        b_head, b_tail = bf16_split(b.to(tl.float32))
        if UPCAST:  # the interpreter's bfloat16 products are wrong: the same values in float32
            a_head, a_tail = a_head.to(tl.float32), a_tail.to(tl.float32)
            b_head, b_tail = b_head.to(tl.float32), b_tail.to(tl.float32)
        acc = tl.dot(a_head, b_tail, acc, input_precision="ieee")
        acc = tl.dot(a_tail, b_head, acc, input_precision="ieee")
        return tl.dot(a_head, b_head, acc, input_precision="ieee")
    if UPCAST:
        # Triton's interpreter multiplies bfloat16 tiles wrongly: give it float32 ones.
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, acc, input_precision=PRECISION)


@triton.jit
def tile_coords(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Grouped ordering of tiles so that neighbouring programs share rows of A in L2."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def brgemm_kernel(
    A,
    B,
    C,
    BIAS,
    WS,
    ARRIVALS,
    geos,
    M,
    N,
    STEPS,
    steps_per_split,
    alpha,
    beta,
    A_GEO: tl.constexpr,
    B_GEO: tl.constexpr,
    C_GEO: tl.constexpr,
    A_SETUP: tl.constexpr,
    A_LOAD: tl.constexpr,
    B_SETUP: tl.constexpr,
    B_LOAD: tl.constexpr,
    C_ADDR: tl.constexpr,
    ACTIVATION: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BETA_NONZERO: tl.constexpr,
    SPLITS: tl.constexpr,
    FINISH: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    a_geo = geos[A_GEO]
    b_geo = geos[B_GEO]
    c_geo = geos[C_GEO]
    pid_m, pid_n = tile_coords(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    pid_z = tl.program_id(1)
    batch = pid_z // SPLITS
    split = pid_z % SPLITS

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_state = A_SETUP(a_geo, batch, offs_m)
    b_state = B_SETUP(b_geo, batch, offs_n)

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    t_begin = split * steps_per_split
    t_end = tl.minimum(t_begin + steps_per_split, STEPS)
    for t in range(t_begin, t_end):
        a = A_LOAD(A, a_geo, a_state, batch, t, offs_k, BLOCK_K)
        b = B_LOAD(B, b_geo, b_state, batch, t, offs_k, BLOCK_K)
        acc = mma(a, b, acc, PRECISION, UPCAST)

    if SPLITS == 1:
        offs, mask, chan = C_ADDR(c_geo, batch, offs_m, offs_n)
        epilogue(
            C,
            offs,
            mask,
            acc,
            alpha,
            beta,
            BIAS,
            chan,
            offs_n < N,
            HAS_BIAS,
            BETA_NONZERO,
            ACTIVATION,
        )
    else:
        # Partial sums: WS is float32 [batches, SPLITS, M, N], row-major; ARRIVALS holds one
        # counter per tile of C and batch entry.
        inside = (offs_m < M)[:, None] & (offs_n < N)[None, :]
        # Tile offsets in int64: a workspace can pass 2^31 elements.
        first = (batch * SPLITS).to(tl.int64)  # this batch entry's first partial tile
        tile = WS + offs_m[:, None] * N + offs_n[None, :]
        tl.store(tile + (first + split) * M * N, acc, mask=inside)
        if FINISH:
            counter = ARRIVALS + batch * tl.num_programs(0) + tl.program_id(0)
            if last_to_arrive(counter, SPLITS):
                # Address C before the loop: Triton 3.6 loses a geometry leaf specialized to 1
                # when the geometry is read after a loop it was live across (a GPU compile
                # error).
                offs, mask, chan = C_ADDR(c_geo, batch, offs_m, offs_n)
                total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                for s in range(SPLITS):
                    partial = tile + (first + s) * M * N
                    total += tl.load(partial, mask=inside, other=0.0, cache_modifier=".cg")
                epilogue(
                    C, offs, mask, total, alpha, beta, BIAS, chan, offs_n < N, HAS_BIAS,
                    BETA_NONZERO, ACTIVATION,
                )  # fmt: skip


@triton.jit
def split_finish_kernel(
    WS,
    C,
    BIAS,
    geos,
    M,
    N,
    alpha,
    beta,
    C_GEO: tl.constexpr,
    C_ADDR: tl.constexpr,
    ACTIVATION: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BETA_NONZERO: tl.constexpr,
    SPLITS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """The split-K finish as a launch of its own: C[b] = act(alpha * sum_s WS[b, s] + bias +
    beta * C[b]), WS float32 [batches, SPLITS, M, N], the partial sums added in split order
    (deterministic); one BLOCK_M x BLOCK_N tile of one batch entry per program."""
    c_geo = geos[C_GEO]
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    batch = tl.program_id(2)
    inside = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    # C addressed before the loop, as in brgemm_kernel's finish (a Triton 3.6 compile error).
    offs, mask, chan = C_ADDR(c_geo, batch, offs_m, offs_n)
    first = (batch * SPLITS).to(tl.int64)  # int64: a workspace can pass 2^31 elements
    tile = WS + offs_m[:, None] * N + offs_n[None, :]
    total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for s in range(SPLITS):
        total += tl.load(tile + (first + s) * M * N, mask=inside, other=0.0)
    epilogue(
        C, offs, mask, total, alpha, beta, BIAS, chan, offs_n < N, HAS_BIAS, BETA_NONZERO,
        ACTIVATION,
    )  # fmt: skip
