# session 11 call 1: transposed state kernel prototype vs state_kernel (tuned), gdn-qwen6
source .devrun/common.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
TLIM=480 python3 .devrun/st/sweep.py 2>&1 | tee $OUT/logs/state_t_sweep.log | grep -v Warning
tar -czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs
