# session 12 call 5 (x2): re-search state on h16_hv64_fixed8k (GDN, GPU0) and h96_fixed (KDA, GPU1) with seeds
# completed for the new BK dimension; then the clean gdn-qwen6 run alone on GPU0
source .devrun/common.sh
gpu0() {
  export CUDA_VISIBLE_DEVICES=0
  timeout -s INT 200 python3 -m gdnbench autotune --family gdn --kernels state --retune --budget 45 --shape-id h16_hv64_fixed8k > $OUT/logs/tune_state_gdn_hv64.log 2>&1
}
gpu1() {
  export CUDA_VISIBLE_DEVICES=1
  timeout -s INT 200 python3 -m gdnbench autotune --family kda --kernels state --retune --budget 45 --shape-id h96_fixed > $OUT/logs/tune_state_kda_h96.log 2>&1
}
gpu0 & gpu1 & wait
rm -f results/tuned/*/*.lock
tar -czf $OUT/tuned.tgz results/tuned
for f in $OUT/logs/*.log; do echo "== $f"; grep -v "^\s*$" $f | grep -iv "warn" | grep -v "━" | tail -4 | cut -c1-200; done
export CUDA_VISIBLE_DEVICES=0
timeout -s INT $((580 - SECONDS)) python3 -m gdnbench run -s gdn-qwen6 -b fla,gdnbench,gdnbench-default --out $OUT/res/ > $OUT/logs/run_gdn.log 2>&1
for f in $OUT/res/*.json; do python3 -m gdnbench report $f --markdown ${f%.json}.md > /dev/null 2>&1; \
  python3 -m gdnbench plot $f --out ${f%.json}.png > /dev/null 2>&1; python3 -m gdnbench plot $f --roofline --out ${f%.json}-roofline.png > /dev/null 2>&1; done
grep -A22 "geomean time ratios" $OUT/res/*.md | cut -c1-120
tail -3 $OUT/logs/run_gdn.log
tar -czf $OUT/all.tgz -C $OUT logs res && rm -rf $OUT/logs $OUT/res
