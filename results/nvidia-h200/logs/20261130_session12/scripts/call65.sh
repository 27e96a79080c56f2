# session 12 call 6: the GPU tests (small heads through run_set's gate), then the TMA state prototype
export SHA=${SHA:-x}
source .devrun/common.sh
T0=$(date +%s)
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py 2>&1 | tail -5 | tee $OUT/logs/gpu_tests.log
echo "tests done at $(( $(date +%s) - T0 )) s"
TLIM=230 timeout 330 python3 .devrun/s12/tma_probe.py 2>&1 | grep -v Warning | tee $OUT/logs/tma_probe.log
echo "total $(( $(date +%s) - T0 )) s"
tar -czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs
