#!/usr/bin/env bash
# ncu and the split-count sweep of backward-filter (filter_split_probe.py). Results under $OUT.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
timeout 300 python benchmarks/probes/filter_split_probe.py resnet50 l1.0.conv2,l1.x.conv1,l2.x.conv2,l3.x.conv2,l4.x.conv2 0,4,8,16,32 2>&1 | tee $OUT/split.txt
SECTIONS="--section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy"
for L in l1.0.conv2 l1.x.conv1; do
echo "=== $L" >> $OUT/ncu.txt
RTDNN_AUTOTUNE=0 timeout 100 ncu --kernel-name regex:brgemm --launch-skip 2 --launch-count 1 $SECTIONS python benchmarks/probes/direct_profile.py resnet50 $L backward_filter IMPLICIT_GEMM_SPLIT_K 3 >> $OUT/ncu.txt 2>&1
done
grep -E "^=== |Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Grid Size|Block Size|Stall|L2 Hit" $OUT/ncu.txt | head -60
