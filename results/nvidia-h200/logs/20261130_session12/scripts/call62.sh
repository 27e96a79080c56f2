# session 12 call 3: one-tile vs pieces at K/V 192 and 256 (best of configs each), and HV64 with maxnreg
export SHA=${SHA:-x}
source .devrun/common.sh
T0=$(date +%s)
BASE_SWEEP=1 SYNTH="192,192;256,256;192,128" SHAPES=k192v192_fixed8k,k256v256_fixed8k,k192v128_fixed8k,h16_hv64_fixed8k \
  python3 .devrun/s12/state_probe.py 2>&1 | tee $OUT/logs/one_tile_bigk.log | grep -v Warning
echo "total $(( $(date +%s) - T0 )) s"
tar -czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs
