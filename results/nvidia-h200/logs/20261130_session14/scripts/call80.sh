# session 14 call 1 (x2): GPU tests on GPU1 while GPU0 times the fused routes' one-pass forms at default
# aqk/state_out configs; then search aqk/state_out (FUSE_Q) on the five one-pass shapes over both GPUs;
# then the A/B again with the winners
export SHA=${SHA:?}
source .devrun/common.sh
(CUDA_VISIBLE_DEVICES=1 timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py > $OUT/logs/gpu_tests.log 2>&1; echo "tests rc=$? at ${SECONDS} s" >> $OUT/logs/gpu_tests.log) &
CUDA_VISIBLE_DEVICES=0 timeout 200 python3 .devrun/s14/fused_ab.py > $OUT/logs/fused_ab_default.log 2>&1
echo "ab default rc=$? at ${SECONDS} s"
wait
tail -3 $OUT/logs/gpu_tests.log
IDS="--shape-id h16_hv32_fixed8k --shape-id h16_hv64_fixed8k --shape-id h4_hv8_mixed --shape-id h16_hv48_uniform --shape-id h16_hv32_fixed32k"
timeout -s INT $((470 - SECONDS)) python3 -m gdnbench autotune --family gdn --kernels state_out,aqk --routes fused_q \
  --budget ${B:-8} $IDS --nproc-per-node 2 > $OUT/logs/tune_fused_one_pass.log 2>&1
echo "searches rc=$? at ${SECONDS} s"
rm -f results/tuned/*/*.lock
tar -czf $OUT/tuned.tgz results/tuned
CUDA_VISIBLE_DEVICES=0 timeout $((585 - SECONDS)) python3 .devrun/s14/fused_ab.py > $OUT/logs/fused_ab_tuned.log 2>&1
echo "ab tuned rc=$? at ${SECONDS} s"
grep -E "/explicit|geomean" $OUT/logs/fused_ab_default.log | cut -c1-120
grep -E "/explicit|geomean" $OUT/logs/fused_ab_tuned.log | cut -c1-120
tar -czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs
