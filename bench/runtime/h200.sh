#!/usr/bin/env bash
# The runtime's GPU measurements of issue #10 in ONE device call, inside 9 minutes.
#
#   run(kind="nvidia-h200", carry=[".whl", ".anchor"], timeout_s=600,
#       command="bash bench/runtime/h200.sh --anchor")
#
# From the repository root. Steps, in this order (each one's output tee'd to <step>.log):
#   anchor       python3 .anchor/chattts_gpt_anchor.py (the ceiling; ~1 min)      only with --anchor
#   graph_check  python3 -m bench.runtime.graph_check --size full
#   engine_load  python3 -m bench.runtime.engine_load --engine graph --size full ...
#   graph        python3 -m bench.runtime ... --engine graph      (the speech API end to end)
#   faithful     python3 -m bench.runtime ... --engine graph --mixed --refine on --audio-decoder decoder
#                (upstream's pipeline: refine-text, then the Decoder path; mixed lengths, 1-4 sentences)
#   faithful_norefine  the same with --refine off
#   faithful_ownvoice  faithful with --voice-from-first-piece off (each piece of a long input on its own)
#   upstream     upstream ChatTTS's own Chat.infer() on the same GPU (bench/runtime/upstream_peer.sh: the
#                scripts of ../shared/anchors copied into .anchor; needs the chattts wheels in .whl)
#   memprobe     python3 -m bench.runtime.memory_probe (each engine's GPU memory against the operator's
#                planner at 64/128/256 sequences), when that module is in the tree
#   dtype        python3 -m bench.runtime.dtype_agreement (bf16 against float32: code agreement, mel
#                distance), when that module is in the tree
#   reference    python3 -m bench.runtime ... --engine reference  (slow)              only with --reference
#   loadgen      python3 -m bench.runtime.loadgen ...: the load generator's own ceiling on this machine
#                (aiohttp and httpx, 1 and 8 processes, 256 streams, against a server that only writes
#                chunks), so the reader can see the client was not the limit;     skipped with --no-loadgen
# Choose steps with --anchor / --reference, or name them all: --steps "graph_check graph" or
# STEPS="anchor graph" in the environment. Each step is bounded by `timeout` (its own cap and
# what is left of --budget, default 520 s, for the whole script); a failing step does not
# stop the next; a summary says which passed.
#
# Comes back in $OUT (default bench/results/tmp/h200-out): summary.txt, results.tar.gz (every JSON/MD result),
# logs.tar.gz (step logs, server logs and configs), and anchor.json when the anchor ran.
set -uo pipefail

STEPS="${STEPS:-}"
BUDGET_S="${BUDGET_S:-520}"
WHEELS="${WHEELS:-.whl}"  # cp312 wheels for the device image; WHEELS=none skips them
with_anchor=0 with_reference=0 with_loadgen=1
while [ $# -gt 0 ]; do
  case "$1" in
    --anchor) with_anchor=1 ;;
    --reference) with_reference=1 ;;
    --no-loadgen) with_loadgen=0 ;;
    --steps) STEPS="$2"; shift ;;
    --budget) BUDGET_S="$2"; shift ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "h200.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if [ -z "$STEPS" ]; then
  STEPS="graph_check engine_load graph"
  [ "$with_anchor" = 1 ] && STEPS="anchor $STEPS"
  [ "$with_reference" = 1 ] && STEPS="$STEPS reference"
  [ "$with_loadgen" = 1 ] && STEPS="$STEPS loadgen"
fi
for step in $STEPS; do
  case "$step" in anchor|graph_check|engine_load|graph|faithful|faithful_norefine|faithful_ownvoice|upstream|memprobe|dtype|reference|loadgen) ;;
    *) echo "h200.sh: unknown step '$step' (anchor graph_check engine_load graph faithful faithful_norefine" \
            "upstream memprobe dtype reference loadgen)" >&2; exit 2 ;;
  esac
done

cd "$(dirname "$0")/../.." || exit 2
export OUT="${OUT:-$PWD/bench/results/tmp/h200-out}"
mkdir -p "$OUT"
rm -f "$OUT/anchor.json"
STAGE="$(mktemp -d)"
mkdir -p "$STAGE/results" "$STAGE/logs"
touch "$STAGE/started"  # only results written after this are collected (bench/results holds earlier runs)
DATE="$(date -u +%Y-%m-%d)"
export PYTHONUNBUFFERED=1

# Wheels the image lacks (fastapi, uvicorn, httptools, ...): two versions of one package would stop pip.
if [ "$WHEELS" != none ] && compgen -G "$WHEELS/*.whl" >/dev/null; then
  dups="$(for w in "$WHEELS"/*.whl; do basename "$w" | cut -d- -f1 | tr 'A-Z.-' 'a-z__'; done | sort | uniq -d)"
  if [ -n "$dups" ]; then
    echo "h200.sh: $WHEELS holds several versions of: $dups" >&2
    exit 2
  fi
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl \
    || { echo "h200.sh: installing $WHEELS failed" >&2; exit 2; }
  export PYTHONPATH="/tmp/site:runtime:."
else
  export PYTHONPATH="runtime:.${PYTHONPATH:+:$PYTHONPATH}"
fi

{
  echo "== $(date -u +%FT%TZ) steps: $STEPS (budget ${BUDGET_S}s)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm --format=csv 2>&1 || echo "nvidia-smi failed"
  python3 -m pip show torch 2>/dev/null | sed -n '1,2p'
  python3 - <<'EOF'
import importlib.metadata as md
for name in ("torch", "transformers", "fastapi", "uvicorn", "httptools", "uvloop", "aiohttp", "httpx", "pydantic"):
    try:
        print(f"{name} {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"{name} (not installed)")
EOF
  nproc | sed 's/^/cpus /'
} 2>&1 | tee "$STAGE/logs/environment.log"

# Nominal caps (s); a step also never runs past the budget, less a reserve for packing the results.
declare -A CAP=([anchor]=120 [graph_check]=150 [engine_load]=120 [graph]=200 [faithful]=210 [faithful_norefine]=180 [faithful_ownvoice]=210
                [upstream]=180 [memprobe]=300 [dtype]=150 [reference]=200 [loadgen]=90)
LEVELS="${LEVELS:-1,16,64,128,256}"
ROUNDS="${ROUNDS:-2}"
RESERVE_S=15
declare -A STATUS
summary=()

step_command() {
  case "$1" in
    anchor) echo "python3 .anchor/chattts_gpt_anchor.py" ;;
    graph_check) echo "python3 -m bench.runtime.graph_check --size full --out $STAGE/results/graph_check.json" ;;
    engine_load) echo "python3 -m bench.runtime.engine_load --engine graph --size full --concurrency 1,16,64,128,256 --rounds 3 --audio --out $STAGE/results/engine_load-graph.json" ;;
    loadgen) echo "python3 -m bench.runtime.loadgen --concurrency 256 --rounds 4 --frames 128 --client-procs 1,8 --client-lib aiohttp,httpx --interval-ms 0,120 --out $STAGE/results/loadgen-capacity.json" ;;
    graph) echo "python3 -m bench.runtime --device cuda --size full --frames 128 --concurrency 1,16,64,128,256 --sequential 8 --rounds 8 --engine graph --max-model-len 1024 --tag h200-$DATE-graph" ;;
    faithful) echo "python3 -m bench.runtime --device cuda --size full --mixed --frames 2048 --refine on --audio-decoder decoder --concurrency $LEVELS --sequential 4 --rounds $ROUNDS --engine graph --max-model-len 2048 --tag h200-$DATE-faithful" ;;
    faithful_norefine) echo "python3 -m bench.runtime --device cuda --size full --mixed --frames 2048 --refine off --audio-decoder decoder --concurrency $LEVELS --sequential 4 --rounds $ROUNDS --engine graph --max-model-len 2048 --tag h200-$DATE-faithful-refine-off" ;;
    faithful_ownvoice) echo "python3 -m bench.runtime --device cuda --size full --mixed --frames 2048 --refine on --voice-from-first-piece off --audio-decoder decoder --concurrency $LEVELS --sequential 4 --rounds $ROUNDS --engine graph --max-model-len 2048 --tag h200-$DATE-faithful-own-voice" ;;
    upstream) echo "bash bench/runtime/upstream_peer.sh $STAGE/results/upstream-chattts-h200-$DATE.jsonl" ;;
    memprobe) echo "python3 -m bench.runtime.memory_probe --out $STAGE/results" ;;
    dtype) echo "python3 -m bench.runtime.dtype_agreement --out $STAGE/results" ;;
    reference) echo "python3 -m bench.runtime --device cuda --size full --frames 128 --concurrency 1,16,64,256 --sequential 4 --rounds 2 --engine reference --max-model-len 1024 --tag h200-$DATE-reference" ;;
  esac
}

for step in $STEPS; do
  left=$((BUDGET_S - SECONDS - RESERVE_S))
  limit=$(( CAP[$step] < left ? CAP[$step] : left ))
  if [ "$limit" -lt 20 ]; then
    STATUS[$step]="skipped (${left}s of budget left)"
    summary+=("$step: ${STATUS[$step]}")
    echo "== $step: ${STATUS[$step]}"
    continue
  fi
  cmd="$(step_command "$step")"
  script="$(echo "$cmd" | awk '$1 == "python3" && $2 ~ /\.py$/ {print $2}
                               $1 == "python3" && $2 == "-m" {gsub(/\./, "/", $3); print $3 ".py"}')"
  if [ -n "$script" ] && [ ! -f "$script" ] && [ ! -d "${script%.py}" ]; then
    STATUS[$step]="skipped ($script is not in this tree)"
    summary+=("$step: ${STATUS[$step]}")
    echo "== $step: ${STATUS[$step]}"
    continue
  fi
  echo "== $(date -u +%T) $step (limit ${limit}s): $cmd"
  t0=$SECONDS
  # timeout signals its whole process group: the runtime server and load generator children too.
  timeout -k 10 "$limit" $cmd 2>&1 | tee "$STAGE/logs/$step.log"
  rc=${PIPESTATUS[0]}
  took=$((SECONDS - t0))
  case "$rc" in
    0) STATUS[$step]="passed" ;;
    124|137) STATUS[$step]="TIMED OUT after ${limit}s"; sleep 2 ;;  # let the GPU memory go
    *) STATUS[$step]="FAILED (exit $rc)" ;;
  esac
  summary+=("$step: ${STATUS[$step]} in ${took}s")
  echo "== $step: ${STATUS[$step]} in ${took}s"
done

# Collect: results beside the step logs, server logs and configs of the benchmark runs.
[ -f "$OUT/anchor.json" ] && cp "$OUT/anchor.json" "$STAGE/results/anchor-h200-$DATE.json"
for f in bench/results/runtime-h200-"$DATE"-*.json bench/results/runtime-h200-"$DATE"-*.md \
         bench/results/tmp/bench-server-cuda-*.log bench/results/tmp/bench-server-cuda-*.yaml; do
  if [ -f "$f" ] && [ "$f" -nt "$STAGE/started" ]; then
    case "$f" in bench/results/tmp/*) cp "$f" "$STAGE/logs/" ;; *) cp "$f" "$STAGE/results/" ;; esac
  fi
done
{
  echo "h200.sh $(date -u +%FT%TZ), ${SECONDS}s, steps: $STEPS"
  printf '%s\n' "${summary[@]}"
} | tee "$OUT/summary.txt"
tar -czf "$OUT/results.tar.gz" -C "$STAGE" results
tar -czf "$OUT/logs.tar.gz" -C "$STAGE" logs
ls -l "$OUT"
failed=0
for step in $STEPS; do [ "${STATUS[$step]}" = passed ] || failed=1; done
exit $failed
