"""`rtdnn bench` with IMPLICIT_GEMM_SPLIT_K's split count as before 2026-11-29
(cdiv(parallel slots, output tiles), at most MAX_SPLITS), to set against a run of the
current count (whole waves) on the same GPU:

    PYTHONPATH=src python benchmarks/probes/split_ab.py old|new BENCH_ARGS...

Only the count is put back: backward-data's skinny layers still take split-K first
(split_k_preferred), as they did not before 25ff1d6, so compare backward-filter runs.
"""

import math
import sys

from rtdnn import cli
from rtdnn.algos import gemm
from rtdnn.algos import implicit_gemm as ig
from rtdnn.core import Direction, cdiv


def cdiv_split_count(p) -> int:
    depth = ig.gemm_shape(p)[2]
    if p.direction != Direction.BACKWARD_FILTER and not ig.packed(p):
        depth *= math.prod(p.kernel)
    most = max(1, depth // (16 * 64 if p.device == "cuda" else 32))
    return max(1, min(cdiv(ig.parallel_slots(p.device), ig._output_tiles(p)), most, ig.MAX_SPLITS))


if __name__ == "__main__":
    if sys.argv[1] == "old":
        ig.split_count = gemm.split_count = cdiv_split_count
    sys.exit(cli.main(sys.argv[2:]))
