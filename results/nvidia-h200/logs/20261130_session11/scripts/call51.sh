# session 11 call 2: sequential memcheck grid at small heads (one process at a time, alone on the GPU)
source .devrun/common.sh
CS=/usr/local/cuda/bin/compute-sanitizer
T0=$(date +%s)
while IFS= read -r spec; do
  [ -z "$spec" ] && continue
  [ $(( $(date +%s) - T0 )) -gt 540 ] && { echo "time cap: skipped $spec"; continue; }
  n=$(echo "$spec" | tr ' =:;,' '_____'); t1=$(date +%s)
  env $spec timeout 60 $CS --tool memcheck --print-limit 1 python3 .devrun/st/mc_case.py > $OUT/logs/$n.log 2>&1
  echo "$spec :: $(grep -oE 'ERROR SUMMARY: [0-9]+' $OUT/logs/$n.log | head -1) $(grep -m1 -oE 'at [a-z_]+_kernel[^ ]* in [a-z_.]+:[0-9]+' $OUT/logs/$n.log) $(grep -oE 'rel-RMS [0-9.e+-]+' $OUT/logs/$n.log) ($(( $(date +%s) - t1 )) s)"
done < .devrun/st/grid51.txt
tar -czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs
