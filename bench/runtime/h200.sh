#!/usr/bin/env bash
# The runtime's GPU measurements of issue #10 in ONE device call, inside 9 minutes.
#
#   run(kind="nvidia-h200", carry=[".whl", ".anchor"], timeout_s=600,
#       command="bash bench/runtime/h200.sh --anchor")
#
# From the repository root. Steps, in this order (each one's output tee'd to <step>.log):
#   anchor       python3 .anchor/chattts_gpt_anchor.py (the ceiling; ~1 min)      only with --anchor
#   graph_check  python3 -m bench.runtime.graph_check --size full
#   gathered     python3 -m bench.runtime.gathered_check: a first-audio substep (a gathered step over scattered
#                slots) against the full step, through the real kernels and a captured graph (~30 s)
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
#   faithful_stream    faithful with --voice-from-first-piece stream (the voice pass streamed as the first piece)
#   fixed128     the fixed-length row: 128 frames, refine-text off, DVAE path, 256 streams (the A/B row)
#   fixed128_decoder  the same on the Decoder path: beside fixed128, the Decoder's cost at 256 streams; beside
#                faithful, what the default pipeline's long prompts (the voice sample in every piece) cost
#   windows      python3 -m bench.runtime.window_schedule: the audio decoders' time per second of audio and the
#                distance from the whole piece, per window schedule (chunks of 24 frames, or growing to 48/96/192)
#
# --ab REV=STEP[,STEP]   after each named step, the same step served by revision REV's runtime (its tree in
#                .ab/REV/runtime, made here by bench/runtime/ab_prepare.sh REV and carried), the order of the
#                arms alternating from step to step; the summary gives each level's ratio. Repeatable: a step
#                may have several B arms.
# --vs KEY=VALUE@STEP[,STEP]   a B arm of this tree with one more engine setting (--engine-setting KEY=VALUE),
#                e.g. --vs audio_batch_rows=1@faithful: what that setting changes, in the same lease. Repeatable.
#                SECTION.KEY=VALUE sets another section of the runtime config: generation.stream_max_chunk_frames=96.
# --gpu-profile STEP[,STEP]   in that step (its A arm) the graph engine's process records short torch.profiler
#                windows of the GPU's work (bench/runtime/gpu_profile.py; GPU_PROFILE_DELAY_S, _EVERY_S, _WINDOW_S,
#                _KEEP_EVERY), summarized after the step: busy share, per stream, kernels by family; in
#                logs.tar.gz (gpu-profile-STEP/ and gpu-profile-STEP.txt).
# --smoke        every step at the tiny size on the CPU, one level, one round (CI: tests/bench): CUDA-only
#                steps (anchor, graph_check, upstream) only check that they parse. No wheels are installed.
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
with_anchor=0 with_reference=0 with_loadgen=1 smoke=0
declare -A PROFILED=()  # steps (A arm) whose engine process records GPU profile windows (--gpu-profile)
declare -A AB=()  # step -> its B arms: revisions whose runtime serves it, or set:KEY=VALUE (this tree, one more setting)
while [ $# -gt 0 ]; do
  case "$1" in
    --anchor) with_anchor=1 ;;
    --smoke) smoke=1 ;;
    --ab)
      rev="${2%%=*}"; ab_steps="${2#*=}"
      if [ -z "$rev" ] || [ "$rev" = "$2" ] || [ -z "$ab_steps" ]; then
        echo "h200.sh: --ab wants REV=STEP[,STEP...], got '$2'" >&2; exit 2
      fi
      for ab_step in ${ab_steps//,/ }; do AB[$ab_step]="${AB[$ab_step]:-} $rev"; done
      shift ;;
    --vs)
      setting="${2%@*}"; vs_steps="${2##*@}"
      if [ "$setting" = "$2" ] || [ -z "$vs_steps" ] || [ "${setting%%=*}" = "$setting" ] || [ -z "${setting%%=*}" ]; then
        echo "h200.sh: --vs wants KEY=VALUE@STEP[,STEP...], got '$2'" >&2; exit 2
      fi
      for vs_step in ${vs_steps//,/ }; do AB[$vs_step]="${AB[$vs_step]:-} set:$setting"; done
      shift ;;
    --gpu-profile) for p_step in ${2//,/ }; do PROFILED[$p_step]=1; done; shift ;;
    --reference) with_reference=1 ;;
    --no-loadgen) with_loadgen=0 ;;
    --steps) STEPS="$2"; shift ;;
    --budget) BUDGET_S="$2"; shift ;;
    -h|--help) sed -n '2,/^[^#]/{/^#/p}' "$0"; exit 0 ;;
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
KNOWN_STEPS="anchor graph_check gathered engine_load graph faithful faithful_norefine faithful_ownvoice faithful_stream fixed128 fixed128_decoder windows upstream memprobe dtype reference loadgen"
AB_ABLE="graph faithful faithful_norefine faithful_ownvoice faithful_stream fixed128 fixed128_decoder reference"  # bench.runtime steps
for step in $STEPS "${!AB[@]}"; do
  case " $KNOWN_STEPS " in *" $step "*) ;;
    *) echo "h200.sh: unknown step '$step' ($KNOWN_STEPS)" >&2; exit 2 ;;
  esac
done
for step in "${!AB[@]}"; do
  case " $AB_ABLE " in *" $step "*) ;; *) echo "h200.sh: --ab works on the speech API steps ($AB_ABLE), not $step" >&2; exit 2 ;; esac
  case " $STEPS " in *" $step "*) ;; *) echo "h200.sh: --ab names $step, which is not among the steps ($STEPS)" >&2; exit 2 ;; esac
  for arm in ${AB[$step]}; do
    case "$arm" in set:*) continue ;; esac
    if [ "$smoke" = 0 ] && [ ! -d ".ab/$arm/runtime/chattts_runtime" ] && \
       [ ! -d "$(dirname "$0")/../../.ab/$arm/runtime/chattts_runtime" ]; then
      echo "h200.sh: --ab $arm: .ab/$arm/runtime is missing (bash bench/runtime/ab_prepare.sh $arm, and carry .ab)" >&2
      exit 2
    fi
  done
done
# A B arm's name in step names and result tags: the revision, or KEY-VALUE of a setting arm.
arm_label() {
  case "$1" in set:*) echo "${1#set:}" | tr -c 'A-Za-z0-9._\n-' '-' | tr '=' '-' ;; *) echo "$1" ;; esac
}

cd "$(dirname "$0")/../.." || exit 2
export OUT="${OUT:-$PWD/bench/results/tmp/h200-out}"
mkdir -p "$OUT"
rm -f "$OUT/anchor.json"
STAGE="$(mktemp -d)"
mkdir -p "$STAGE/results" "$STAGE/logs"
touch "$STAGE/started"  # only results written after this are collected (bench/results holds earlier runs)
DATE="$(date -u +%Y-%m-%d)"
export PYTHONUNBUFFERED=1

# The sizes of every step: the H200's, or (--smoke) the CPU's tiniest.
if [ "$smoke" = 1 ]; then
  # Results and the servers' scratch go to a folder of their own, not among the recorded results.
  export BENCH_RESULTS="${BENCH_RESULTS:-$STAGE/bench-results}"
  DEVICE=cpu SIZE=tiny LEVELS="${LEVELS:-2}" ROUNDS="${ROUNDS:-1}" SEQUENTIAL=1 MIXED_LEN=1024 FIXED_LEVELS=2 FIXED_ROUNDS=1
  FIXED_FRAMES=16
  WHEELS=none
else
  DEVICE=cuda SIZE=full LEVELS="${LEVELS:-1,16,64,128,256}" ROUNDS="${ROUNDS:-2}" SEQUENTIAL=4 MIXED_LEN=2048
  FIXED_LEVELS="${FIXED_LEVELS:-256}" FIXED_ROUNDS=8 FIXED_FRAMES=128
fi

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
# Result names say which GPU ran them: a call for an H200 may be served by an H100.
case "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" in
  *H200*) GPU_TAG=h200 ;;
  *H100*) GPU_TAG=h100 ;;
  *) GPU_TAG=gpu ;;
esac

# Nominal caps (s); a step also never runs past the budget, less a reserve for packing the results.
declare -A CAP=([anchor]=120 [graph_check]=220 [gathered]=90 [engine_load]=120 [graph]=200 [faithful]=210 [faithful_norefine]=180 [faithful_ownvoice]=210
                [faithful_stream]=210 [fixed128]=150 [fixed128_decoder]=150 [windows]=120 [upstream]=180 [memprobe]=300 [dtype]=150 [reference]=200 [loadgen]=90)
if [ "$smoke" = 1 ]; then  # a shared 2-core CI machine, not an H200
  for step in "${!CAP[@]}"; do CAP[$step]=$((CAP[$step] * 3)); done
fi
RESERVE_S=15
declare -A STATUS
summary=()

FAITHFUL="python3 -m bench.runtime --device $DEVICE --size $SIZE --mixed --frames 2048 --refine on --audio-decoder decoder --concurrency $LEVELS --sequential $SEQUENTIAL --rounds $ROUNDS --engine graph --max-model-len $MIXED_LEN"
FIXED="python3 -m bench.runtime --device $DEVICE --size $SIZE --frames $FIXED_FRAMES --concurrency $FIXED_LEVELS --sequential $SEQUENTIAL --rounds $FIXED_ROUNDS --engine graph --max-model-len 1024 --refine off"
step_command() {
  if [ "$smoke" = 1 ]; then  # what cannot run without CUDA or its wheels: parse it
    case "$1" in
      anchor) echo "python3 bench/runtime/parse_only.py .anchor/chattts_gpt_anchor.py" ; return ;;  # CUDA-only: parse it
      graph_check) echo "python3 -m bench.runtime.graph_check --help" ; return ;;
      upstream) echo "bash -n bench/runtime/upstream_peer.sh" ; return ;;
    esac
  fi
  case "$1" in
    anchor) echo "python3 .anchor/chattts_gpt_anchor.py" ;;
    graph_check) echo "python3 -m bench.runtime.graph_check --size full --out $STAGE/results/graph_check.json" ;;
    gathered) echo "python3 -m bench.runtime.gathered_check --device $DEVICE --size $SIZE --out $STAGE/results" ;;
    engine_load) echo "python3 -m bench.runtime.engine_load --engine graph --size $SIZE --concurrency ${LEVELS} --rounds $ROUNDS --audio --out $STAGE/results/engine_load-graph.json" ;;
    loadgen) if [ "$smoke" = 1 ]; then echo "python3 -m bench.runtime.loadgen --concurrency 2 --rounds 1 --frames 16 --server-procs 1 --client-procs 1 --client-lib httpx --out $STAGE/results/loadgen-capacity.json"
             else echo "python3 -m bench.runtime.loadgen --concurrency 256 --rounds 4 --frames 128 --client-procs 1,8 --client-lib aiohttp,httpx --interval-ms 0,120 --out $STAGE/results/loadgen-capacity.json"; fi ;;
    graph) echo "python3 -m bench.runtime --device $DEVICE --size $SIZE --frames $FIXED_FRAMES --concurrency $LEVELS --sequential $SEQUENTIAL --rounds $((ROUNDS * 4)) --engine graph --max-model-len 1024 --tag $GPU_TAG-$DATE-graph" ;;
    faithful) echo "$FAITHFUL --tag $GPU_TAG-$DATE-faithful" ;;
    faithful_norefine) echo "${FAITHFUL/--refine on/--refine off} --tag $GPU_TAG-$DATE-faithful-refine-off" ;;
    faithful_ownvoice) echo "$FAITHFUL --voice-from-first-piece off --tag $GPU_TAG-$DATE-faithful-own-voice" ;;
    faithful_stream) echo "$FAITHFUL --voice-from-first-piece stream --tag $GPU_TAG-$DATE-faithful-stream" ;;
    fixed128) echo "$FIXED --audio-decoder dvae --tag $GPU_TAG-$DATE-fixed128" ;;
    fixed128_decoder) echo "$FIXED --audio-decoder decoder --tag $GPU_TAG-$DATE-fixed128-decoder" ;;
    upstream) echo "bash bench/runtime/upstream_peer.sh $STAGE/results/upstream-chattts-$GPU_TAG-$DATE.jsonl" ;;
    memprobe) echo "python3 -m bench.runtime.memory_probe --device $DEVICE --size $SIZE --out $STAGE/results" ;;
    dtype) echo "python3 -m bench.runtime.dtype_agreement --device $DEVICE --size $SIZE --out $STAGE/results" ;;
    windows) if [ "$smoke" = 1 ]; then echo "python3 -m bench.runtime.window_schedule --device cpu --size tiny --streams 2 --repeats 1 --out $STAGE/results"
             else echo "python3 -m bench.runtime.window_schedule --device cuda --size full --out $STAGE/results --tag $GPU_TAG-$DATE"; fi ;;
    reference) echo "python3 -m bench.runtime --device $DEVICE --size $SIZE --frames 128 --concurrency ${LEVELS} --sequential $SEQUENTIAL --rounds $ROUNDS --engine reference --max-model-len 1024 --tag $GPU_TAG-$DATE-reference" ;;
  esac
}

# One run of a step: "A" (this tree) or one of its B arms (--ab's revision, its runtime served by this tree's
# client; or --vs's setting on this tree). The tag is each command's last argument: the arm's label extends it.
run_arm() {
  local step="$1" arm="$2" name="$1" cmd limit left t0 rc took label
  cmd="$(step_command "$step")"
  if [ "$arm" != A ]; then
    label="$(arm_label "$arm")"
    name="$step@$label"
    case "$arm" in
      set:*) cmd="$cmd-ab-$label --engine-setting ${arm#set:}" ;;
      *) cmd="$cmd-ab-$arm --runtime .ab/$arm/runtime" ;;
    esac
  fi
  left=$((BUDGET_S - SECONDS - RESERVE_S))
  limit=$(( CAP[$step] < left ? CAP[$step] : left ))
  if [ "$limit" -lt 20 ]; then
    STATUS[$name]="skipped (${left}s of budget left)"
    summary+=("$name: ${STATUS[$name]}")
    echo "== $name: ${STATUS[$name]}"
    return
  fi
  script="$(echo "$cmd" | awk '$1 == "python3" && $2 ~ /\.py$/ {print $2}
                               $1 == "python3" && $2 == "-m" {gsub(/\./, "/", $3); print $3 ".py"}')"
  if [ -n "$script" ] && [ ! -f "$script" ] && [ ! -d "${script%.py}" ]; then
    STATUS[$name]="skipped ($script is not in this tree)"
    summary+=("$name: ${STATUS[$name]}")
    echo "== $name: ${STATUS[$name]}"
    return
  fi
  step_env=()
  if [ "$arm" = A ] && [ -n "${PROFILED[$step]:-}" ]; then  # the engine process profiles itself (sitecustomize)
    step_env=(env "GPU_PROFILE_DIR=$STAGE/logs/gpu-profile-$step" "PYTHONPATH=bench/runtime/gpu_profile_hook:$PYTHONPATH")
  fi
  echo "== $(date -u +%T) $name (limit ${limit}s): ${step_env[*]} $cmd"
  t0=$SECONDS
  # timeout signals its whole process group: the runtime server and load generator children too.
  timeout -k 10 "$limit" "${step_env[@]}" $cmd 2>&1 | tee "$STAGE/logs/$name.log"
  rc=${PIPESTATUS[0]}
  took=$((SECONDS - t0))
  case "$rc" in
    0) STATUS[$name]="passed" ;;
    124|137) STATUS[$name]="TIMED OUT after ${limit}s"; sleep 2 ;;  # let the GPU memory go
    *) STATUS[$name]="FAILED (exit $rc)" ;;
  esac
  summary+=("$name: ${STATUS[$name]} in ${took}s")
  echo "== $name: ${STATUS[$name]} in ${took}s"
  if [ "${#step_env[@]}" -gt 0 ] && [ -d "$STAGE/logs/gpu-profile-$step" ]; then  # out of the engine's process
    python3 -m bench.runtime.gpu_profile "$STAGE/logs/gpu-profile-$step" --keep-every "${GPU_PROFILE_KEEP_EVERY:-0}" \
      2>&1 | tee "$STAGE/logs/gpu-profile-$step.txt"
  fi
}

ab_turn=0
for step in $STEPS; do
  if [ -n "${AB[$step]:-}" ]; then  # every arm, the order reversed from one A/B step to the next
    arms=(A ${AB[$step]})
    if [ $((ab_turn % 2)) = 1 ]; then
      for ((i = ${#arms[@]} - 1; i >= 0; i--)); do run_arm "$step" "${arms[$i]}"; done
    else
      for arm in "${arms[@]}"; do run_arm "$step" "$arm"; done
    fi
    ab_turn=$((ab_turn + 1))
  else
    run_arm "$step" A
  fi
done

# Collect: results beside the step logs, server logs and configs of the benchmark runs.
[ -f "$OUT/anchor.json" ] && cp "$OUT/anchor.json" "$STAGE/results/anchor-$GPU_TAG-$DATE.json"
RESULTS_DIR="${BENCH_RESULTS:-bench/results}"
for f in "$RESULTS_DIR"/runtime-"$GPU_TAG"-"$DATE"-*.json "$RESULTS_DIR"/runtime-"$GPU_TAG"-"$DATE"-*.md \
         "$RESULTS_DIR"/tmp/bench-server-*.log "$RESULTS_DIR"/tmp/bench-server-*.yaml; do
  if [ -f "$f" ] && [ "$f" -nt "$STAGE/started" ]; then
    case "$f" in "$RESULTS_DIR"/tmp/*) cp "$f" "$STAGE/logs/" ;; *) cp "$f" "$STAGE/results/" ;; esac
  fi
done
{
  echo "h200.sh $(date -u +%FT%TZ), ${SECONDS}s, steps: $STEPS"
  printf '%s\n' "${summary[@]}"
  for step in "${!AB[@]}"; do  # each A/B pair's ratios, from the two result files
    for arm in ${AB[$step]}; do
      python3 -m bench.runtime.ab_summary --results "$STAGE/results" --step "$step" --rev "$(arm_label "$arm")" 2>&1
    done
  done
} | tee "$OUT/summary.txt"
tar -czf "$OUT/results.tar.gz" -C "$STAGE" results
tar -czf "$OUT/logs.tar.gz" -C "$STAGE" logs
ls -l "$OUT"
failed=0
for name in "${!STATUS[@]}"; do [ "${STATUS[$name]}" = passed ] || failed=1; done
exit $failed
