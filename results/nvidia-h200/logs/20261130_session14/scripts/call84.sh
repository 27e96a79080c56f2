# session 14 call 5 (x2): search aqk/state_out FUSE_Q (c_q tile) on the five one-pass shapes over both GPUs,
# then the gdn-qwen6 evidence run on GPU0 while GPU1 runs the GPU tests and the fused one/two-kernel A/B
export SHA=${SHA:?}
source .devrun/common.sh
IDS="--shape-id h16_hv32_fixed8k --shape-id h16_hv64_fixed8k --shape-id h4_hv8_mixed --shape-id h16_hv48_uniform --shape-id h16_hv32_fixed32k"
timeout -s INT 220 python3 -m gdnbench autotune --family gdn --kernels state_out,aqk --routes fused_q \
  --budget ${B:-30} $IDS --nproc-per-node 2 > $OUT/logs/tune_fused_one_pass.log 2>&1
echo "searches rc=$? at ${SECONDS} s"
rm -f results/tuned/*/*.lock
tar -czf $OUT/tuned.tgz results/tuned
(CUDA_VISIBLE_DEVICES=1 timeout 250 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py > $OUT/logs/gpu_tests.log 2>&1; echo "tests rc=$? at ${SECONDS} s" >> $OUT/logs/gpu_tests.log
 CUDA_VISIBLE_DEVICES=1 timeout $((580 - SECONDS)) python3 .devrun/s14/fused_ab.py > $OUT/logs/fused_ab_final.log 2>&1) &
CUDA_VISIBLE_DEVICES=0 timeout -s INT 300 python3 -m gdnbench run -s gdn-qwen6 -b fla,gdnbench,gdnbench-default \
  --out $OUT/res/ > $OUT/logs/run_gdn.log 2>&1
echo "run rc=$? at ${SECONDS} s"
wait
echo "all at ${SECONDS} s"
tail -2 $OUT/logs/gpu_tests.log
grep -E "^(aqk|state_out) gdn|searches:" $OUT/logs/tune_fused_one_pass.log | cut -c1-150
grep -E "geomean|  fused" $OUT/logs/fused_ab_final.log | cut -c1-160
tail -30 $OUT/logs/run_gdn.log | cut -c1-200
tar -czf $OUT/res.tgz -C $OUT res && rm -rf $OUT/res
tar -czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs
