# session 13 call 5 (x2): search the one-pass kernels (state_out, aqk) on the five shapes that run them
export SHA=${SHA:-x}
source .devrun/common.sh
IDS="--shape-id h16_hv32_fixed8k --shape-id h16_hv64_fixed8k --shape-id h4_hv8_mixed --shape-id h16_hv48_uniform --shape-id h16_hv32_fixed32k"
timeout -s INT 300 python3 -m gdnbench autotune --family gdn --kernels state_out --budget ${BS:-30} $IDS \
  --nproc-per-node 2 > $OUT/logs/tune_state_out.log 2>&1
echo "state_out searches done at ${SECONDS} s"
timeout -s INT 170 python3 -m gdnbench autotune --family gdn --kernels aqk --budget ${BA:-10} $IDS \
  --nproc-per-node 2 > $OUT/logs/tune_aqk.log 2>&1
echo "aqk searches done at ${SECONDS} s"
rm -f results/tuned/*/*.lock
tar -czf $OUT/tuned.tgz results/tuned
for f in $OUT/logs/tune*.log; do echo "== $f"; grep -v "^\s*$" $f | grep -iv "warn" | grep -E "best|searches|fail|rror" | cut -c1-200; done
tar -czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs $OUT/res
