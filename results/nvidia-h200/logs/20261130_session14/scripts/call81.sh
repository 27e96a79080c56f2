# session 14 call 2 (x2): search aqk/state_out (FUSE_Q) on the five one-pass shapes over both GPUs
# (seeded by the plain winners), then the fused one-pass A/B with the winners
export SHA=${SHA:?}
source .devrun/common.sh
IDS="--shape-id h16_hv32_fixed8k --shape-id h16_hv64_fixed8k --shape-id h4_hv8_mixed --shape-id h16_hv48_uniform --shape-id h16_hv32_fixed32k"
timeout -s INT 330 python3 -m gdnbench autotune --family gdn --kernels state_out,aqk --routes fused_q \
  --budget ${B:-30} $IDS --nproc-per-node 2 > $OUT/logs/tune_fused_one_pass.log 2>&1
echo "searches rc=$? at ${SECONDS} s"
rm -f results/tuned/*/*.lock
tar -czf $OUT/tuned.tgz results/tuned
CUDA_VISIBLE_DEVICES=0 timeout $((585 - SECONDS)) python3 .devrun/s14/fused_ab.py > $OUT/logs/fused_ab_tuned.log 2>&1
echo "ab tuned rc=$? at ${SECONDS} s"
grep -E "^(aqk|state_out) gdn|searches:" $OUT/logs/tune_fused_one_pass.log | cut -c1-150
grep -E "/explicit|geomean" $OUT/logs/fused_ab_tuned.log | cut -c1-200
tar -czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs
