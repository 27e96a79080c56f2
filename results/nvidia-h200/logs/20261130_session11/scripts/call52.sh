# session 11 call 3: KDA small-head stage diag (bf16 vs fp32 storage per stage), then the memcheck grid with the
# codegen-hazard rule in default_config (one process at a time)
source .devrun/common.sh
CS=/usr/local/cuda/bin/compute-sanitizer
T0=$(date +%s)
while IFS= read -r spec; do
  env $spec timeout 60 python3 .devrun/st/kda_stages.py 2>&1 | grep -E 'STAGES|Error|error' | head -3
done <<'EOS'
DT=bfloat16 KK=32 VV=16 NORM=fused_qk
DT=bfloat16 KK=32 VV=16 NORM=fused_qk SET=output_fused=num_warps:4
DT=bfloat16 KK=32 VV=16 NORM=flag
DT=bfloat16 KK=32 VV=16 NORM=fused_q
DT=float16 KK=32 VV=16 NORM=fused_qk
DT=bfloat16 KK=128 VV=128 NORM=fused_qk
DT=bfloat16 KK=32 VV=32 NORM=fused_qk
EOS
echo "diag done at $(( $(date +%s) - T0 )) s"
while IFS= read -r spec; do
  [ -z "$spec" ] && continue
  [ $(( $(date +%s) - T0 )) -gt 550 ] && { echo "time cap: skipped $spec"; continue; }
  n=$(echo "$spec" | tr ' =:;,' '_____'); t1=$(date +%s)
  env $spec timeout 60 $CS --tool memcheck --print-limit 1 python3 .devrun/st/mc_case.py > $OUT/logs/$n.log 2>&1
  echo "$spec :: $(grep -oE 'ERROR SUMMARY: [0-9]+' $OUT/logs/$n.log | head -1) $(grep -m1 -oE 'at [a-z_]+_kernel[^ ]* in [a-z_.]+:[0-9]+' $OUT/logs/$n.log) $(grep -oE 'rel-RMS [0-9.e+-]+' $OUT/logs/$n.log) ($(( $(date +%s) - t1 )) s)"
done < .devrun/st/grid52.txt
tar -czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs
