# session 14 call 3 (x2): state_out's and aqk's FUSE_Q costs, variants (GPU0: state_out, GPU1: aqk)
export SHA=${SHA:?}
source .devrun/common.sh
(CUDA_VISIBLE_DEVICES=1 timeout 400 python3 .devrun/s14/aqk_var.py h16_hv32_fixed8k h16_hv64_fixed8k h16_hv32_fixed32k h4_hv8_mixed > $OUT/logs/aqk_var.log 2>&1; echo "aqk rc=$?" >> $OUT/logs/aqk_var.log) &
CUDA_VISIBLE_DEVICES=0 timeout 400 python3 .devrun/s14/so_var.py h16_hv32_fixed8k h16_hv64_fixed8k h16_hv32_fixed32k h4_hv8_mixed > $OUT/logs/so_var.log 2>&1
echo "so rc=$? at ${SECONDS} s"
wait
echo "at ${SECONDS} s"
grep -v Warning $OUT/logs/so_var.log | cut -c1-160 | tail -40
grep -v Warning $OUT/logs/aqk_var.log | cut -c1-160 | tail -50
tar -czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs
