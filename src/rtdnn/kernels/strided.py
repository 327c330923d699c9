"""Plain strided-matrix addressing for the batch-reduce GEMM.

A matrix operand is read as M[b, i, row, col] = base[offset + (b // batch_inner) * sb_outer
+ (b % batch_inner) * sb_inner + i * s_i + row * s_row + col * s_col], where i is the reduce
index of the batch-reduce GEMM (A_i, B_i in C = sum_i A_i @ B_i). For A the reduced dim is
`col`, for B it is `row`; a step t covers reduce index i and one BLOCK_K chunk of that dim.
"""

from typing import NamedTuple

import triton
import triton.language as tl


class StridedGeometry(NamedTuple):
    rows: int
    cols: int
    batch_inner: int
    sb_outer: int
    sb_inner: int
    s_i: int
    s_row: int
    s_col: int
    offset: int


@triton.jit
def reduce_step(t, depth, offs_k, BLOCK_K: tl.constexpr):
    """Step t of a reduction over (i, chunks of `depth`) -> (i, indices into the chunk)."""
    chunks = tl.cdiv(depth, BLOCK_K)
    i = t // chunks
    return i, (t - i * chunks) * BLOCK_K + offs_k


@triton.jit
def batch_base(geo, batch):
    outer = batch // geo.batch_inner
    return geo.offset + outer * geo.sb_outer + (batch - outer * geo.batch_inner) * geo.sb_inner


@triton.jit
def strided_a_setup(geo, batch, offs_m):
    return batch_base(geo, batch) + offs_m * geo.s_row, offs_m < geo.rows


@triton.jit
def strided_a_load(A, geo, state, batch, t, offs_k, BLOCK_K: tl.constexpr):
    rows, rows_ok = state
    i, k = reduce_step(t, geo.cols, offs_k, BLOCK_K)
    ptrs = A + i * geo.s_i + rows[:, None] + k[None, :] * geo.s_col
    return tl.load(ptrs, mask=rows_ok[:, None] & (k < geo.cols)[None, :], other=0.0)


@triton.jit
def strided_b_setup(geo, batch, offs_n):
    return batch_base(geo, batch) + offs_n * geo.s_col, offs_n < geo.cols


@triton.jit
def strided_b_load(B, geo, state, batch, t, offs_k, BLOCK_K: tl.constexpr):
    cols, cols_ok = state
    i, k = reduce_step(t, geo.rows, offs_k, BLOCK_K)
    ptrs = B + i * geo.s_i + k[:, None] * geo.s_row + cols[None, :]
    return tl.load(ptrs, mask=(k < geo.rows)[:, None] & cols_ok[None, :], other=0.0)


@triton.jit
def matrix_a_load(A, geo, state, batch, t, offs_k, BLOCK_K: tl.constexpr):
    """strided_a_load of a matrix without a reduce index (s_i unused): step t is the t-th chunk
    of its columns, with no division of t."""
    rows, rows_ok = state
    k = t * BLOCK_K + offs_k
    ptrs = A + rows[:, None] + k[None, :] * geo.s_col
    return tl.load(ptrs, mask=rows_ok[:, None] & (k < geo.cols)[None, :], other=0.0)


@triton.jit
def matrix_b_load(B, geo, state, batch, t, offs_k, BLOCK_K: tl.constexpr):
    """strided_b_load of a matrix without a reduce index: step t is the t-th chunk of rows."""
    cols, cols_ok = state
    k = t * BLOCK_K + offs_k
    ptrs = B + k[:, None] * geo.s_row + cols[None, :]
    return tl.load(ptrs, mask=(k < geo.rows)[:, None] & cols_ok[None, :], other=0.0)


@triton.jit
def strided_c_addr(geo, batch, offs_m, offs_n):
    rows = batch_base(geo, batch) + offs_m * geo.s_row
    mask = (offs_m < geo.rows)[:, None] & (offs_n < geo.cols)[None, :]
    return rows[:, None] + (offs_n * geo.s_col)[None, :], mask, offs_n
