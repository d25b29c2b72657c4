#!/usr/bin/env bash
# The grids behind docs/leaderboard.md (RULER-4K, 26 shards each), one process per call, one thread:
# run one call per core, each with its own list of shards.
#   bash scripts/leaderboard.sh ratios 0,2,4  # 30 per task: 0.5 / 0.25 / 0.75, the decode-time rule at 0.5
#   bash scripts/leaderboard.sh quant 1,3     # 10 per task: FullKV / SnapKV / TOVA x storage kinds, KVzip
#   bash scripts/leaderboard.sh presses 0,2   # 30 per task: kvpress's other training-free presses at 0.5
# The store is the usual one ($KVBENCH_RESULTS_DIR, else results/); a finished setting is skipped. The
# page's own records are leaderboard/ruler4k/*.tar.xz (leaderboard/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
usage="bash scripts/leaderboard.sh ratios|quant|presses SHARDS (comma-separated, each of 0-25 once)"
[ $# -eq 2 ] || { echo "error: 2 arguments expected, got $#; usage: $usage" >&2; exit 2; }
case "$1" in ratios|quant|presses) ;; *) echo "error: unknown grid '$1' (ratios, quant, presses)" >&2; exit 2 ;; esac
# Every shard checked before run.py starts: a bad one writes nothing (no run, record or log directory).
[[ "$2" =~ ^(0|[1-9][0-9]?)(,(0|[1-9][0-9]?))*$ ]] ||
  { echo "error: shards '$2' are not a comma-separated list of 0-25; usage: $usage" >&2; exit 2; }
seen=","
for shard in ${2//,/ }; do
  ((shard <= 25)) || { echo "error: shard $shard is not one of the 26 shards (0-25)" >&2; exit 2; }
  [[ "$seen" != *",$shard,"* ]] || { echo "error: shard $shard given twice (each of 0-25 once)" >&2; exit 2; }
  seen+="$shard,"
done
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
common=(runner=quality_grid task=ruler runner.num_shards=26 "runner.shard_index=$2")
case "$1" in
  ratios)
    exec python run.py -m "${common[@]}" task.limit=30 runner.batch_size=15 \
      'runner.methods=[fullkv,streamingllm,h2o,keepkv,adakv_expected_attention_e2]' 'runner.compression_ratios=[0.5]' \
      'runner.extra_grids=[{methods:[tova,snapkv,knorm,expected_attention,adakv_snapkv,adakv_expected_attention,pyramidkv,criticalkv_snapkv,zsmerge],compression_ratios:[0.5]},{methods:[snapkv,streamingllm,zsmerge,adakv_snapkv,adakv_expected_attention,pyramidkv,criticalkv_snapkv,h2o,keepkv,adakv_expected_attention_e2],compression_ratios:[0.25,0.75]},{methods:[tova,knorm,expected_attention,streamingllm,h2o,zsmerge,keepkv],compression_ratios:[0.5],overrides:["decode_budget=true"]}]' ;;
  quant)  # quantized settings decode one at a time (runner.batch_size=1: their own runs' rounding)
    exec python run.py -m "${common[@]}" task.limit=10 'runner.methods=[fullkv,snapkv,tova]' \
      'runner.compression_ratios=[0.5]' 'runner.quants=[none,int8,int4,kivi2]' \
      'runner.extra_grids=[{methods:[kvzip,kvzip_layerwise],compression_ratios:[0.5]}]' ;;
  presses)  # ThinK alone prunes half of each head's key channels at any token budget (no ratio); KVgrad is
    # not here: its backward passes took ~10x the shared 4K prefill of a sample (hours per shard)
    exec python run.py -m "${common[@]}" task.limit=30 runner.batch_size=15 \
      'runner.methods=[think,non_causal_attn,compactor,cap,block,chunk,entropy_gated_chunkkv,finch,merging,cam,kvcompose,think_snapkv]' \
      'runner.compression_ratios=[0.5]' ;;
esac
