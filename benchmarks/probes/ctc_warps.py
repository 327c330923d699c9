"""How many warps the CTC recursions should run with: the alpha and beta kernels of the
`rtdnn bench --op ctc` cases timed alone at 1, 2, 4 and 8 warps (device time, median).

    PYTHONPATH=src python benchmarks/probes/ctc_warps.py
"""

import functools

import torch
import triton

from rtdnn.bench.ctc import cases, make_inputs
from rtdnn.kernels.ctc import ctc_alpha_kernel, ctc_beta_kernel
from rtdnn.ops import ctc


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    for case in cases():
        inputs = make_inputs(case, gen)
        lp, flat, offsets, in_len, tgt_len, max_target, _ = ctc.prepare(
            inputs.log_probs.detach(), inputs.targets, inputs.input_lengths,
            inputs.target_lengths, 0,
        )  # fmt: skip
        T, N, C = lp.shape
        block_l = triton.next_power_of_2(2 * max_target + 1)
        alpha = torch.empty((N, T, block_l), device=lp.device)
        post, nll = torch.empty_like(alpha), torch.empty((N,), device=lp.device)
        links = torch.empty((N, block_l), dtype=torch.int32, device=lp.device)
        heads, repeats = (
            torch.empty_like(links),
            torch.empty((N,), dtype=torch.int32, device=lp.device),
        )
        labels = (flat, offsets, in_len, tgt_len)
        line = [case.name]
        for warps in (1, 2, 4, 8):
            alpha_run = functools.partial(
                ctc_alpha_kernel[(N,)], lp, *lp.stride(), *labels, alpha, nll, T, 0,
                BLOCK_L=block_l, num_warps=warps,
            )  # fmt: skip
            beta_run = functools.partial(
                ctc_beta_kernel[(N,)], lp, *lp.stride(), *labels, alpha, post, links, heads,
                repeats, T, 0, BLOCK_L=block_l, CHUNK=min(16, block_l), num_warps=warps,
            )  # fmt: skip
            a = triton.testing.do_bench(alpha_run, return_mode="median")
            b = triton.testing.do_bench(beta_run, return_mode="median")
            line.append(f"w{warps}: alpha {a * 1e3:7.1f} us beta {b * 1e3:7.1f} us")
        print(" | ".join(line), flush=True)


if __name__ == "__main__":
    main()
