# session 13 call 1: host time, JIT launch path vs direct launch of the cached compiled kernel
export SHA=${SHA:-x}
source .devrun/common.sh
T0=$(date +%s)
timeout 400 python3 .devrun/s13/host_fast.py 2>&1 | grep -v Warning | tee $OUT/logs/host_fast.log
echo "total $(( $(date +%s) - T0 )) s"
tar -czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs
