#!/usr/bin/env bash
# ncu profiles of DIRECT (and the grouped GEMM path) on a few suite layers, plus the SASS
# opcode histogram of each compiled DIRECT kernel. Results under $OUT.
set -u
export OUT=${OUT:-gpu-results} PYTHONPATH=src RTDNN_AUTOTUNE=0 PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=/tmp/tcache
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
SECTIONS="--section SpeedOfLight --section ComputeWorkloadAnalysis --section InstructionStats --section WarpStateStats --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy --section SchedulerStats"
prof() {  # suite layer direction algo kernel-regex skip
  echo "=== $*" >> "$OUT/ncu.txt"
  timeout 120 ncu --kernel-name "regex:$5" --launch-skip "$6" --launch-count 1 $SECTIONS \
    python3 benchmarks/probes/direct_profile.py "$1" "$2" "$3" "$4" 3 >> "$OUT/ncu.txt" 2>&1
}
prof depthwise convnext.dw96.56.k7 forward DIRECT direct_forward 2
prof depthwise effb0.dw32.112.k3 forward DIRECT direct_forward 2
prof depthwise convnext.dw96.56.k7 backward_filter DIRECT direct_filter_rows 1
prof depthwise effb0.dw144.56.k5.s2 backward_data DIRECT direct_backward_data 1
prof grouped resnext50.g128.56 forward IMPLICIT_GEMM brgemm 2
echo "== ncu done"
python3 - <<'PY' > "$OUT/sass.txt" 2>&1
import collections, glob, json, os, re, subprocess
for path in sorted(glob.glob("/tmp/tcache/*/*.cubin")):
    name = os.path.basename(path)[:-6]
    meta = json.load(open(path[:-6] + ".json"))
    sass = subprocess.run(["cuobjdump", "-sass", path], capture_output=True, text=True).stdout
    ops = collections.Counter(m.group(1) for m in re.finditer(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", sass))
    print(f"## {name} regs={meta.get('n_regs')} spills={meta.get('n_spills')} shared={meta.get('shared')} warps={meta.get('num_warps')} consts={ {k: v for k, v in meta.get('constants', {}).items()} if isinstance(meta.get('constants'), dict) else ''}")
    print("  total", sum(ops.values()), " ".join(f"{k}:{v}" for k, v in ops.most_common(40)))
PY
grep -E "^=== |Duration|Memory Throughput|DRAM Throughput|L1/TEX Hit|Compute \(SM\) Throughput|Executed Ipc A|Issue Slots Busy|Registers Per|Achieved Occupancy|No Eligible|Warp Cycles Per Issued|Stall" "$OUT/ncu.txt" | head -120
head -c 6000 "$OUT/sass.txt"
