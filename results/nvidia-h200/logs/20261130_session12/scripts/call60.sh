# session 12 call 1: state kernel under ncu (8K, serving) + leave-one-out variants
export SHA=${SHA:-x}
source .devrun/common.sh
T0=$(date +%s)
which ncu; ncu --version | tail -1
for S in h16_hv32_fixed8k h2_hv8_serving; do
  NCU=1 SHAPE=$S timeout 200 ncu --clock-control none --kernel-name regex:state_kernel --launch-skip 1 --launch-count 1 \
     --set full --import-source yes -f -o $OUT/logs/ncu_$S python3 .devrun/s12/state_probe.py > $OUT/logs/ncu_$S.run.log 2>&1
  tail -3 $OUT/logs/ncu_$S.run.log
  ncu -i $OUT/logs/ncu_$S.ncu-rep --page details > $OUT/logs/ncu_${S}_details.txt 2>&1
  ncu -i $OUT/logs/ncu_$S.ncu-rep --page source --csv --print-source sass > $OUT/logs/ncu_${S}_sass.csv 2>&1
  ncu -i $OUT/logs/ncu_$S.ncu-rep --page raw --csv > $OUT/logs/ncu_${S}_raw.csv 2>&1
  echo "ncu $S done at $(( $(date +%s) - T0 )) s"
done
python3 .devrun/s12/state_probe.py 2>&1 | tee $OUT/logs/state_probe.log | grep -v Warning
echo "total $(( $(date +%s) - T0 )) s"
tar -czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs
