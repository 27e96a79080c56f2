# session 14 call 4 (x2): state_out FUSE_Q variants v7 (c and c+log2 r_q as one tile), v8 (q rows scaled
# before the dot), v9 (r_q contiguous per head) beside v0/v2/v5
export SHA=${SHA:?}
source .devrun/common.sh
(CUDA_VISIBLE_DEVICES=1 timeout 300 python3 .devrun/s14/so_var.py h16_hv64_fixed8k h4_hv8_mixed > $OUT/logs/so_var_b.log 2>&1) &
CUDA_VISIBLE_DEVICES=0 timeout 300 python3 .devrun/s14/so_var.py h16_hv32_fixed8k h16_hv32_fixed32k > $OUT/logs/so_var_a.log 2>&1
wait
echo "at ${SECONDS} s"
grep -v Warning $OUT/logs/so_var_a.log $OUT/logs/so_var_b.log | cut -c1-170 | tail -40
tar -czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs
