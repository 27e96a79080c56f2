# session 11 call 7: state + output in one kernel (prototype) vs the two kernels at their tuned configs
export SHA=${SHA:-x}
source .devrun/common.sh
TLIM=150 python3 .devrun/st/so_sweep.py 2>&1 | tee $OUT/logs/state_out_sweep.log | grep -v Warning
tar -czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs
