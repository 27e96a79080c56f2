# session 12 call 4 (x2): re-search the state kernel with its new BK dimension (piece height), GDN on GPU0, KDA on GPU1
source .devrun/common.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
gpu0() {
  export CUDA_VISIBLE_DEVICES=0
  timeout -s INT 330 python3 -m gdnbench autotune --family gdn --kernels state --retune --budget ${B:-25} > $OUT/logs/tune_state_gdn.log 2>&1
}
gpu1() {
  export CUDA_VISIBLE_DEVICES=1
  timeout -s INT 330 python3 -m gdnbench autotune --family kda --kernels state --retune --budget ${B:-25} > $OUT/logs/tune_state_kda.log 2>&1
}
gpu0 & gpu1 & wait
rm -f results/tuned/*/*.lock
tar -czf $OUT/tuned.tgz results/tuned
for f in $OUT/logs/*.log; do echo "== $f"; grep -v "^\s*$" $f | grep -iv "warn" | tail -12 | cut -c1-200; done
tar -czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs $OUT/res
