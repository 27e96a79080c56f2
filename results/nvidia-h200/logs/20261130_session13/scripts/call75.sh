# session 13 call 6 (x2): re-search the one-pass kernels after the FUSE_Q rework (seeded by the stale
# winners), then the gdn-qwen6 evidence run on GPU0 alone, then the GPU tests in the time left
export SHA=${SHA:?}
source .devrun/common.sh
IDS="--shape-id h16_hv32_fixed8k --shape-id h16_hv64_fixed8k --shape-id h4_hv8_mixed --shape-id h16_hv48_uniform --shape-id h16_hv32_fixed32k"
timeout -s INT 190 python3 -m gdnbench autotune --family gdn --kernels state_out,aqk --budget ${B:-8} $IDS \
  --nproc-per-node 2 > $OUT/logs/tune_one_pass.log 2>&1
echo "searches done at ${SECONDS} s"
rm -f results/tuned/*/*.lock
tar -czf $OUT/tuned.tgz results/tuned
CUDA_VISIBLE_DEVICES=0 timeout -s INT 260 python3 -m gdnbench run -s gdn-qwen6 -b fla,gdnbench,gdnbench-default \
  --out $OUT/res/ > $OUT/logs/run_gdn.log 2>&1
echo "run rc=$? at ${SECONDS} s"
CUDA_VISIBLE_DEVICES=0 timeout $((575 - SECONDS)) python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py 2>&1 | tail -4 | tee $OUT/logs/gpu_tests.log
echo "tests done at ${SECONDS} s"
grep -E "best|searches" $OUT/logs/tune_one_pass.log | cut -c1-160
tar -czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs
