"""kernels/fast_div: division by a run-time divisor as a multiply-high, against Python's."""

import pytest
import torch
import triton
import triton.language as tl

from rtdnn.kernels.fast_div import div_mod, divider


@triton.jit
def _div_mod_kernel(N, Q, R, d, size, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    n = tl.load(N + offs, mask=offs < size)
    q, r = div_mod(n, divider(d))
    tl.store(Q + offs, q, mask=offs < size)
    tl.store(R + offs, r, mask=offs < size)


@pytest.mark.parametrize("d", [1, 2, 3, 7, 9, 56, 64, 100, 12345, 2**24 + 1, 2**30 + 7, 2**31 - 1])
def test_div_mod_matches_python(d):
    g = torch.Generator().manual_seed(d)
    edges = [0, 1, d - 1, d, 2**31 - 1, 2**31 - 2, 2**31 - 1 - (2**31 - 1) % d]
    edges += [2 * d - 1, 2 * d] if 2 * d < 2**31 else []
    n = torch.cat([torch.tensor(edges), torch.randint(0, 2**31 - 1, (500,), generator=g)]).to(
        torch.int32
    )
    q, r = torch.full_like(n, -1), torch.full_like(n, -1)
    _div_mod_kernel[(triton.cdiv(n.numel(), 256),)](n, q, r, d, n.numel(), BLOCK=256)
    assert torch.equal(q, n // d)
    assert torch.equal(r, n % d)
