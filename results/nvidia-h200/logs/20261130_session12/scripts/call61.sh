# session 12 call 2: one-tile state kernel vs the pieces kernel, six shapes; ncu of one_tile at 8K
export SHA=${SHA:-x}
source .devrun/common.sh
T0=$(date +%s)
python3 .devrun/s12/state_probe.py 2>&1 | tee $OUT/logs/one_tile.log | grep -v Warning
S=h16_hv32_fixed8k
NCU=one SHAPE=$S timeout 200 ncu --clock-control none --kernel-name regex:state_kernel --launch-skip 1 --launch-count 1 \
   --set full --import-source yes -f -o $OUT/logs/ncu_one_$S python3 .devrun/s12/state_probe.py > $OUT/logs/ncu_one_$S.run.log 2>&1
ncu -i $OUT/logs/ncu_one_$S.ncu-rep --page source --csv --print-source sass > $OUT/logs/ncu_one_${S}_sass.csv 2>&1
ncu -i $OUT/logs/ncu_one_$S.ncu-rep --page raw --csv > $OUT/logs/ncu_one_${S}_raw.csv 2>&1
echo "total $(( $(date +%s) - T0 )) s"
tar -czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs
