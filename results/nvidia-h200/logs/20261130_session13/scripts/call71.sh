# session 13 call 2 (x2): re-search the output kernels (plain, fused_q, fused_qk; most entries had 1-14
# candidates evaluated) and the two long single-sequence state entries (10 and 40 evaluated), longer budgets
export SHA=${SHA:-x}
source .devrun/common.sh
T0=$(date +%s)
timeout -s INT 380 python3 -m gdnbench autotune --family gdn --kernels output,output_fused --retune \
  --budget ${BO:-32} --nproc-per-node 2 > $OUT/logs/tune_output.log 2>&1
echo "output searches done at $(( $(date +%s) - T0 )) s"
timeout -s INT 150 python3 -m gdnbench autotune --family gdn --kernels state --retune --budget ${BS:-75} \
  --shape-id h16_hv32_fixed8k --shape-id h16_hv32_fixed32k --nproc-per-node 2 > $OUT/logs/tune_state_long.log 2>&1
echo "state searches done at $(( $(date +%s) - T0 )) s"
rm -f results/tuned/*/*.lock
tar -czf $OUT/tuned.tgz results/tuned
for f in $OUT/logs/tune*.log; do echo "== $f"; grep -v "^\s*$" $f | grep -iv "warn" | grep -E "best|searches|fail" | cut -c1-200; done
tar -czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs $OUT/res
