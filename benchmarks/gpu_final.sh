#!/usr/bin/env bash
# One device call: the GPU test modules, host overhead, the whole-model benchmark, the
# memory-bound benchmarks and the demo. Choose with STAGES (default: all of them, in this order;
# STAGES=microbatch runs mu-cuDNN's micro-batching experiment, see its case below).
# Everything lands under $OUT as it finishes, so a time-out keeps what was done. Not in the
# default STAGES: suites (every convolution suite in bf16, fp16 and TF32 beside cuDNN), models
# (EfficientNet-B0, MobileNet-V3, ConvNeXt-T), algos (every algorithm forced, strict float32),
# families (attention, RNN, CTC, grid_sample beside torch), each minutes long, tma (the
# TMA kernels) and plain (the TMA GEMM of plain matrices, split-K's finish, the resnet50
# suite). The ops stage runs the memory-bound primitives and normalization.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src RTDNN_GPU_TESTS=1
STAGES=${STAGES:-"tests overhead model ops demo"}
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
for stage in $STAGES; do
  start=$(date +%s)
  case $stage in
    tests)  # tile autotuning off: the tests check results, and compile time is the cost here
      # Every GPU module (TEST_FILES to choose); the drop-in module needs two GPUs.
      files=${TEST_FILES:-$(ls tests/test_*_gpu.py | grep -v dropin)}
      # failure_log writes each failure to $OUT/failures.txt at once: a run cut off by
      # TEST_LIMIT prints no summary. -v names every test as it finishes.
      FAILURE_LOG="$OUT/failures.txt" RTDNN_AUTOTUNE=0 timeout "${TEST_LIMIT:-300}" \
        python3 -m pytest -v -rf -n 14 -p no:cacheprovider -p benchmarks.failure_log $files > "$OUT/tests.log" 2>&1
      grep -E "passed|failed|^FAILED" "$OUT/tests.log" | tail -12 | cut -c1-300
      grep -c PASSED "$OUT/tests.log"; grep "^FAILED" "$OUT/failures.txt" 2>/dev/null ;;
    overhead)
      timeout 120 python3 benchmarks/probes/overhead.py > "$OUT/overhead.txt" 2>&1
      head -20 "$OUT/overhead.txt" ;;
    model)  # heuristic tiles unless MODEL_AUTOTUNE=1: tuning 160 layers' tiles takes minutes
      RTDNN_AUTOTUNE=${MODEL_AUTOTUNE:-0} timeout "${MODEL_LIMIT:-300}" python3 -m rtdnn.cli bench --model resnet50 --out "$OUT" \
        > "$OUT/model.log" 2>&1
      grep -E "^\|" "$OUT/model.log" ;;
    suites)  # convolution suites beside cuDNN, every direction: SUITES x DTYPES, each capped
      for suite in ${SUITES:-resnet50 vgg16 alexnet deepbench_train}; do
        for dtype in ${DTYPES:-bf16 fp16 float32}; do
          timeout "${SUITE_LIMIT:-200}" python3 -m rtdnn.cli bench --suite "$suite" \
            --dtype "$dtype" --out "$OUT" > "$OUT/suite_${suite}_$dtype.log" 2>&1
          echo "$suite $dtype: exit $?"; grep -iE "geomean" "$OUT/suite_${suite}_$dtype.log" | head -3
        done
      done ;;
    models)  # whole models beside PyTorch eager (compiling their layers takes minutes)
      for model in ${MODELS:-efficientnet_b0 mobilenet_v3_large convnext_tiny}; do
        RTDNN_AUTOTUNE=${MODEL_AUTOTUNE:-0} timeout "${MODEL_LIMIT:-300}" python3 -m rtdnn.cli \
          bench --model "$model" --out "$OUT" > "$OUT/model_$model.log" 2>&1
        echo "$model: exit $?"; grep -E "^\|" "$OUT/model_$model.log"
      done ;;
    algos)  # every convolution algorithm forced, strict float32, beside cuDNN (TF32 off):
      # ALGO_SUITES each capped at ALGO_LIMIT seconds (large_kernels is FFT's home ground)
      for suite in ${ALGO_SUITES:-large_kernels resnet50 vgg16}; do
        RTDNN_AUTOTUNE=0 timeout "${ALGO_LIMIT:-240}" python3 -m rtdnn.cli bench --algo all \
          --math fp32 --dtype float32 --suite "$suite" --out "$OUT" > "$OUT/algos_$suite.log" 2>&1
        echo "$suite: exit $?"; grep -E "^\| " "$OUT/algos_$suite.log" | tail -30 | cut -c1-200
      done ;;
    families)  # rnn, ctc, grid_sample and attention beside torch, each capped
      for op in ${FAMILIES:-attention rnn ctc grid_sample}; do
        timeout "${FAMILY_LIMIT:-300}" python3 -m rtdnn.cli bench --op "$op" --out "$OUT" \
          > "$OUT/bench_$op.log" 2>&1
        echo "$op: exit $?"; grep -E "^\|" "$OUT/bench_$op.log" | cut -c1-200
      done ;;
    plain)  # the TMA GEMM of plain matrices and split-K's second-launch finish: their GPU
      # tests, the plain-GEMM probe (every TMA tile beside cuBLAS), the resnet50 suite in each
      # direction (PLAIN_DIRECTIONS), and GEMM forced on it (the 1x1 stride-2 projections'
      # candidate: im2col of every other pixel, then the TMA GEMM)
      RTDNN_AUTOTUNE=0 timeout 150 python3 -m pytest -q -n 8 -p no:cacheprovider \
        tests/test_gemm_tma_gpu.py tests/test_split_finish_gpu.py > "$OUT/plain_tests.log" 2>&1
      grep -E " passed| failed|^FAILED" "$OUT/plain_tests.log" | tail -6 | cut -c1-300
      timeout "${PROBE_LIMIT:-200}" python3 benchmarks/probes/plain_gemm_probe.py \
        "$OUT/plain_gemm.txt" > "$OUT/plain_gemm.log" 2>&1
      sed -n '/^best ratio/,$p' "$OUT/plain_gemm.txt" | grep -v cublas
      for d in ${PLAIN_DIRECTIONS:-backward_filter forward backward_data}; do
        timeout "${SUITE_LIMIT:-200}" python3 -m rtdnn.cli bench --suite resnet50 --dtype bf16 \
          --direction "$d" --out "$OUT/$d" > "$OUT/suite_resnet50_$d.log" 2>&1
        echo "resnet50 $d: exit $?"; grep -iE "geomean" "$OUT/suite_resnet50_$d.log" | head -2
      done
      RTDNN_AUTOTUNE=0 timeout "${ALGO_LIMIT:-240}" python3 -m rtdnn.cli bench --algo GEMM \
        --suite resnet50 --out "$OUT/algo_gemm" > "$OUT/algo_gemm.log" 2>&1
      grep -E "down|conv1 " "$OUT/algo_gemm.log" | cut -c1-200 ;;
    tma)  # the experimental TMA forward: its GPU tests, then its tiles beside the pointer
      # path's and cuDNN on the resnet50 suite's stride-1 layers (benchmarks/probes/tma_probe.py)
      RTDNN_AUTOTUNE=0 timeout "${TMA_TEST_LIMIT:-200}" python3 -m pytest -v -rf -n 8 \
        -p no:cacheprovider tests/test_conv_tma_gpu.py > "$OUT/tma_tests.log" 2>&1
      grep -E " passed| failed|^FAILED" "$OUT/tma_tests.log" | tail -6 | cut -c1-300
      timeout "${TMA_LIMIT:-300}" python3 benchmarks/probes/tma_probe.py resnet50 \
        > "$OUT/tma_probe.txt" 2>&1
      tail -40 "$OUT/tma_probe.txt" ;;
    ops)
      timeout "${BENCH_LIMIT:-240}" python3 -m rtdnn.cli bench --op "${OPS:-all}" --out "$OUT" \
        > "$OUT/bench_ops.log" 2>&1
      grep -E "^\|" "$OUT/bench_ops.log" | cut -c1-160 | head -80 ;;
    demo)
      timeout 90 python3 -m rtdnn.cli demo > "$OUT/demo.log" 2>&1
      tail -c 300 "$OUT/demo.log" ;;
    microbatch)  # mu-cuDNN's experiment, not in the default STAGES: measuring every algorithm at
      # every micro-batch size is its cost, and policy all at AlexNet's batch of 256 is 256 sizes
      # a convolution, so MB_POLICIES leaves it out unless asked (undivided,powerOfTwo,all).
      # Measurements go to a tuning database under bench-results/, kept on a warm machine: a
      # suite cut off by MB_LIMIT resumes where it stopped when the stage runs again.
      mkdir -p bench-results
      for suite in ${MB_SUITES:-alexnet resnet18 resnet50}; do
        RTDNN_TUNING_DB=${MB_DB:-$PWD/bench-results/tuning_microbatch.sqlite3} \
          RTDNN_AUTOTUNE=${MB_AUTOTUNE:-0} timeout "${MB_LIMIT:-500}" python3 -m rtdnn.cli bench \
          --micro-batch --suite "$suite" --policies "${MB_POLICIES:-undivided,powerOfTwo}" \
          --out "$OUT" > "$OUT/microbatch_$suite.log" 2>&1
        grep -E "^\| (reuse|divide) " "$OUT/microbatch_$suite.log" | head -12
      done ;;
  esac
  echo "== $stage: $(( $(date +%s) - start )) s"
done
