# session 13 call 4: the direct-launch GPU test (fixed: finite inputs), then the state+output prototype with Aqk hoisted
export SHA=${SHA:-x}
source .devrun/common.sh
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k direct_launch 2>&1 | tail -3 | tee $OUT/logs/gpu_test_direct.log
echo "test done at ${SECONDS} s"
timeout $((570 - SECONDS)) python3 .devrun/s13/so_aqk.py 2>&1 | grep -v Warning | tee $OUT/logs/state_out_aqk.log | tail -12
echo "total ${SECONDS} s"
tar -czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs
