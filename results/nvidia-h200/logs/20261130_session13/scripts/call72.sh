# session 13 call 3: the gdn-qwen6 evidence run (GPU0 alone), then the GPU tests
export SHA=${SHA:?}
source .devrun/common.sh
export CUDA_VISIBLE_DEVICES=0
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,utilization.gpu --format=csv,noheader
timeout -s INT 400 python3 -m gdnbench run -s gdn-qwen6 -b fla,gdnbench,gdnbench-default --out $OUT/res/ > $OUT/logs/run_gdn.log 2>&1
echo "run rc=$? at ${SECONDS} s"
timeout 170 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py 2>&1 | tail -5 | tee $OUT/logs/gpu_tests.log
echo "tests done at ${SECONDS} s"
grep -v "^\s*$" $OUT/logs/run_gdn.log | grep -iv warn | tail -30 | cut -c1-220
tar -czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs
