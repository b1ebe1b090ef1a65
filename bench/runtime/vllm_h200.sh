#!/usr/bin/env bash
# GPU side of the vllm engine's measurements (issue #31): vLLM 0.26.0 arrives in pieces, then one call
# installs it and measures. Prepared on the CPU by bench/runtime/vllm_prepare.sh, which prints the calls:
#
#   call k (one per piece but the last), each sent as soon as the previous returns:
#     run(kind="nvidia-h200", timeout_s=60, carry=[".vllm/pieces/pNN", ".vllm/pieces/SHA256SUMS"],
#         command="bash bench/runtime/vllm_h200.sh piece pNN")
#   the last call, carrying the last piece:
#     run(kind="nvidia-h200", timeout_s=600, carry=[".vllm/pieces/pLAST", ".vllm/pieces/SHA256SUMS"],
#         command="bash bench/runtime/vllm_h200.sh run")
#
# piece NAME   copies the carried .vllm/pieces/NAME into $PIECES (default /tmp/vllm-pieces, outside the
#              checkout: it lasts while the machine stays warm) and checks its hash (exit 1 if wrong).
# run          copies any carried piece the same way, then: all pieces present and their hashes right,
#              the bundle assembled and checked, its wheels installed with pip --no-deps into $SITE
#              (default /tmp/vllm-site; a wheel whose distribution the image already has is skipped
#              and named, but for vLLM and h200.sh's speech API set), vLLM's plugin entry point for the ChatTTS model written there; then the steps,
#              in order of value, each under `timeout` (its cap and what is left of --budget, default
#              540 s), a failing step not stopping the next:
#   imports      python3 -m bench.runtime.vllm_imports: every module an engine start imports (MISSING x: y)
#   check        python3 -m bench.runtime.vllm_check: greedy codes and refine-text tokens of the vllm
#                engine (float32 eager; bfloat16 with CUDA graphs) against the reference engine (float32)
#                on the full-size random weights, beside the graph engine's bfloat16 rate; vLLM's KV
#                cache beside the operator planner's prediction
#   vllm         the speech API benchmark, --engine vllm, 128 frames, refine off, DVAE path, 1,16,64,256
#   graph        the same with --engine graph (the graph engine's row in the same lease)
#   check_fp8    the check for vllm bfloat16 with an fp8 KV cache (also against check's 16-bit KV run,
#                whose outputs, and the reference's, it reuses)
#   check_awq    the same for AWQ weights (the random checkpoint's round-to-nearest AWQ form, awq_random)
#                (either runs its 16-bit base first when no earlier check of this call kept it)
#   check_control the reference engine again in float32 with PyTorch's math attention: how far two
#                correct float32 arithmetics part on these weights (read the float32 vllm rate beside it)
#   vllm_mixed   --mixed, upstream's pipeline (refine-text on, Decoder path), --engine vllm
#   vllm_eager   as vllm, CUDA graphs off (engine.enforce_eager)
#   vllm_prefix  as vllm, prefix cache on (prompts salted by speaker)
#   graph_mixed  as vllm_mixed, --engine graph
#   vllm_fp8     as vllm, engine.kvCacheDtype fp8, at 64 and 256 streams
#   vllm_profile as vllm at 1 and 256 streams, every process's Python stacks sampled every 2 ms
#                (bench/runtime/stack_sampler.py): where the engine core's step goes
#   anchor       python3 .anchor/chattts_gpt_anchor.py (only when .anchor is carried too)
# Choose with --steps "imports check vllm" (or STEPS=...); --budget S; --levels 1,16,64,256.
# --smoke      the steps' command lines on the CPU, without pieces (CI and a local check: vLLM is not
#              run; each step's module must parse its arguments), so a typo fails there, not on the GPU.
#
# Comes back in $OUT (default bench/results/tmp/vllm-h200-out): summary.txt, results.tar.gz (every
# JSON/MD result), logs.tar.gz (step logs, server logs and configs, install log, vLLM's memory lines).
set -uo pipefail

PIECES="${PIECES:-/tmp/vllm-pieces}"
SITE="${SITE:-/tmp/vllm-site}"
BUDGET_S="${BUDGET_S:-540}"
STEPS="${STEPS:-}"
LEVELS="${LEVELS:-1,16,64,256}"
KNOWN_STEPS="imports check vllm graph check_fp8 check_awq vllm_mixed vllm_eager vllm_prefix graph_mixed vllm_fp8 vllm_profile check_control anchor"
DEFAULT_STEPS="imports check vllm graph check_fp8 check_awq vllm_mixed vllm_eager vllm_prefix graph_mixed vllm_fp8"
cd "$(dirname "$0")/../.." || exit 2
CARRIED="${VLLM_DIR:-.vllm}/pieces"  # the pieces the calls carry (vllm_prepare.sh writes them)

die() { echo "vllm_h200.sh: $*" >&2; exit 2; }

# A carried piece -> $PIECES, its hash checked against the carried SHA256SUMS.
take_piece() {
  local name="$1" want got
  [ -f "$CARRIED/$name" ] || die "piece $name is not in $CARRIED (carry \"$CARRIED/$name\")"
  [ -f "$CARRIED/SHA256SUMS" ] || die "$CARRIED/SHA256SUMS is not carried (carry it with every piece)"
  want="$(awk -v n="$name" '$2 == n {print $1}' "$CARRIED/SHA256SUMS")"
  [ -n "$want" ] || die "SHA256SUMS names no piece $name"
  mkdir -p "$PIECES"
  cp "$CARRIED/$name" "$PIECES/$name.part" && mv "$PIECES/$name.part" "$PIECES/$name"
  cp "$CARRIED/SHA256SUMS" "$PIECES/SHA256SUMS"
  got="$(sha256sum "$PIECES/$name" | cut -d' ' -f1)"
  if [ "$got" != "$want" ]; then
    rm -f "$PIECES/$name"
    echo "vllm_h200.sh: piece $name: sha256 $got, want $want" >&2; exit 1
  fi
  echo "piece $name ok ($(stat -c %s "$PIECES/$name") bytes); $PIECES holds: $(cd "$PIECES" && ls p[0-9][0-9] 2>/dev/null | tr '\n' ' ')"
}

mode="${1:-}"
[ $# -gt 0 ] && shift
smoke=0
case "$mode" in
  piece)
    [ $# -eq 1 ] || die "usage: vllm_h200.sh piece pNN"
    case "$1" in p[0-9][0-9]) ;; *) die "a piece is named pNN, got '$1'" ;; esac
    take_piece "$1"
    exit 0 ;;
  run) ;;
  --smoke) smoke=1 ;;
  -h|--help|"") sed -n '2,42p' "$0"; exit 0 ;;
  *) die "unknown mode '$mode' (piece NAME | run | --smoke | --help)" ;;
esac
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) [ $# -ge 2 ] || die "--steps wants a list"; STEPS="$2"; shift ;;
    --budget) [ $# -ge 2 ] || die "--budget wants seconds"; BUDGET_S="$2"; shift ;;
    --levels) [ $# -ge 2 ] || die "--levels wants a list"; LEVELS="$2"; shift ;;
    --smoke) smoke=1 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
  shift
done
case "$BUDGET_S" in ''|*[!0-9]*) die "--budget must be whole seconds, got '$BUDGET_S'" ;; esac
STEPS="${STEPS:-$DEFAULT_STEPS}"
for step in $STEPS; do
  case " $KNOWN_STEPS " in *" $step "*) ;; *) die "unknown step '$step' ($KNOWN_STEPS)" ;; esac
done

export OUT="${OUT:-$PWD/bench/results/tmp/vllm-h200-out}"
mkdir -p "$OUT"
STAGE="$(mktemp -d)"
mkdir -p "$STAGE/results" "$STAGE/logs"
touch "$STAGE/started"
DATE="$(date -u +%Y-%m-%d)"
export PYTHONUNBUFFERED=1
# No network on the device; caches in one place for the whole call (the vllm steps share compiled code).
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export VLLM_CACHE_ROOT="${VLLM_CACHE_ROOT:-/tmp/vllm-cache}" TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-/tmp/vllm-cache/inductor}"

if [ "$smoke" = 1 ]; then
  export BENCH_RESULTS="${BENCH_RESULTS:-$STAGE/bench-results}"
  export PYTHONPATH="runtime:.${PYTHONPATH:+:$PYTHONPATH}"
else
  # -- assemble and install -----------------------------------------------------------------
  for carried in "$CARRIED"/p[0-9][0-9]; do
    [ -f "$carried" ] && take_piece "$(basename "$carried")"
  done
  [ -f "$PIECES/SHA256SUMS" ] || die "no pieces in $PIECES (the calls before this one carry them; see --help)"
  need="$(awk '$2 ~ /^p[0-9][0-9]$/ {print $2}' "$PIECES/SHA256SUMS")"
  lacking=""
  for name in $need; do [ -f "$PIECES/$name" ] || lacking="$lacking $name"; done
  [ -z "$lacking" ] || { echo "vllm_h200.sh: $PIECES lacks:$lacking (the machine was given back between calls? start again from call 1)" >&2; exit 1; }
  t0=$SECONDS
  bundle_sum="$(awk '$2 == "bundle.tar" {print $1}' "$PIECES/SHA256SUMS")"
  for name in $need; do cat "$PIECES/$name"; done > "$STAGE/bundle.tar"
  got="$(sha256sum "$STAGE/bundle.tar" | cut -d' ' -f1)"
  [ "$got" = "$bundle_sum" ] || { echo "vllm_h200.sh: bundle sha256 $got, want $bundle_sum" >&2; exit 1; }
  mkdir -p "$STAGE/wheels" && tar -xf "$STAGE/bundle.tar" -C "$STAGE/wheels" && rm -f "$STAGE/bundle.tar" \
    || die "unpacking the bundle failed"
  # Only what the image lacks: a wheel of a distribution the image has is skipped (and named).
  python3 - "$STAGE/wheels" > "$STAGE/logs/install-plan.txt" <<'EOF'
import importlib.metadata as md, pathlib, re, sys
norm = lambda s: re.sub(r"[-_.]+", "-", s).lower()
have = {norm(d.metadata["Name"]): d.version for d in md.distributions() if d.metadata["Name"]}
# Always ours: vLLM, and the speech API's set that bench/runtime/h200.sh installs over the image (known good).
always = {"vllm", "fastapi", "starlette", "uvicorn", "httptools", "pydantic", "pydantic-core", "annotated-types",
          "typing-inspection"}
for wheel in sorted(pathlib.Path(sys.argv[1]).glob("*.whl")):
    name, version = wheel.name.split("-")[:2]
    if norm(name) not in always and norm(name) in have:
        print(f"skip {wheel.name} (the image has {norm(name)} {have[norm(name)]})")
    else:
        print(f"install {wheel}")
EOF
  cat "$STAGE/logs/install-plan.txt"
  mapfile -t to_install < <(awk '$1 == "install" {print $2}' "$STAGE/logs/install-plan.txt")
  rm -rf "$SITE"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check \
    --target "$SITE" "${to_install[@]}" > "$STAGE/logs/install.log" 2>&1 \
    || { cat "$STAGE/logs/install.log"; echo "vllm_h200.sh: pip install failed" >&2; exit 1; }
  # vLLM finds out-of-tree models through this entry point in every process it starts.
  ep="$SITE/chattts_runtime_vllm_plugin-0.0.0.dist-info"
  mkdir -p "$ep"
  printf 'Metadata-Version: 2.1\nName: chattts-runtime-vllm-plugin\nVersion: 0.0.0\n' > "$ep/METADATA"
  printf '[vllm.general_plugins]\nchattts = chattts_runtime.vllm_plugin:register\n' > "$ep/entry_points.txt"
  export PYTHONPATH="$SITE:runtime:."
  echo "== installed $(wc -l < "$STAGE/logs/install-plan.txt") wheels' plan into $SITE in $((SECONDS - t0)) s ($(du -sh "$SITE" | cut -f1))"
fi

{
  echo "== $(date -u +%FT%TZ) steps: $STEPS (budget ${BUDGET_S}s, levels $LEVELS)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv 2>&1 || echo "nvidia-smi failed"
  nproc | sed 's/^/cpus /'
} 2>&1 | tee "$STAGE/logs/environment.log"

declare -A CAP=([imports]=60 [check]=240 [check_fp8]=200 [check_awq]=150 [check_control]=60 [vllm]=150 [graph]=100 [vllm_mixed]=170 [vllm_eager]=120
                [vllm_prefix]=130 [graph_mixed]=150 [vllm_fp8]=130 [vllm_profile]=110 [anchor]=100)
if [ "$smoke" = 1 ]; then
  DEVICE=cpu SIZE=tiny
else
  DEVICE=cuda SIZE=full
fi
SPEECH="python3 -m bench.runtime --device $DEVICE --size $SIZE --sequential 4"
FIXED="$SPEECH --frames 128 --concurrency $LEVELS --rounds 4 --max-model-len 1024 --refine off --audio-decoder dvae"
# The reference's outputs (and each vllm variant's) outside the call's stage: a run call sent right after
# another (machine still warm) compares check_fp8/check_awq against the first call's check, not recomputed.
if [ "$smoke" = 1 ]; then KEEP="$STAGE/keep"; else KEEP="${KEEP:-/tmp/vllm-check}"; fi
mkdir -p "$KEEP"
CHECK="python3 -m bench.runtime.vllm_check --device $DEVICE --size $SIZE --out $STAGE/results --reference $KEEP/reference.json"
MIXED="$SPEECH --mixed --frames 2048 --concurrency $LEVELS --rounds 2 --max-model-len 2048 --refine on --audio-decoder decoder"
step_command() {
  case "$1" in
    imports) echo "python3 -m bench.runtime.vllm_imports --out $STAGE/results/vllm-imports-h200-$DATE.json" ;;
    check) echo "$CHECK --vllm float32:eager --vllm bfloat16:graphs --vllm graph --tag h200-$DATE" ;;
    check_fp8) echo "$CHECK --vllm bfloat16:graphs:fp8 --tag h200-$DATE-fp8-kv" ;;
    check_awq) echo "$CHECK --vllm bfloat16:graphs:awq --tag h200-$DATE-awq" ;;
    check_control) echo "$CHECK --vllm reference-math --tag h200-$DATE-control" ;;
    vllm) echo "$FIXED --engine vllm --tag h200-$DATE-vllm" ;;
    graph) echo "$FIXED --engine graph --tag h200-$DATE-vllm-lease-graph" ;;
    vllm_mixed) echo "$MIXED --engine vllm --tag h200-$DATE-vllm-mixed" ;;
    vllm_eager) echo "$FIXED --engine vllm --cuda-graphs off --tag h200-$DATE-vllm-eager" ;;
    vllm_prefix) echo "$FIXED --engine vllm --prefix-cache on --tag h200-$DATE-vllm-prefix" ;;
    graph_mixed) echo "$MIXED --engine graph --tag h200-$DATE-vllm-lease-graph-mixed" ;;
    vllm_fp8) echo "${FIXED/--concurrency $LEVELS/--concurrency 64,256} --engine vllm --kv-cache-dtype fp8 --tag h200-$DATE-vllm-fp8" ;;
    vllm_profile) echo "${FIXED/--concurrency $LEVELS/--concurrency 1,256} --engine vllm --tag h200-$DATE-vllm-profile" ;;
    anchor) echo "python3 .anchor/chattts_gpt_anchor.py" ;;
  esac
}

# --smoke: run MODULE's main() up to its argument parser; a bad flag or value exits 2, a good parse exits 0.
cat > "$STAGE/argcheck.py" <<'EOF'
import argparse, runpy, sys

_parse = argparse.ArgumentParser.parse_args


def parse_then_stop(self, *args, **kwargs):
    _parse(self, *args, **kwargs)
    print("parsed:", " ".join(sys.argv[1:]))
    raise SystemExit(0)


argparse.ArgumentParser.parse_args = parse_then_stop
module = sys.argv.pop(1)
sys.argv[0] = module
runpy.run_module(module, run_name="__main__", alter_sys=True)
EOF

# Before a step: the previous step's GPU memory given back (a vLLM engine core exits after its server;
# vLLM refuses to start while less than gpuMemoryUtilization of the GPU is free). At most 30 s.
gpu_released() {
  [ "$smoke" = 1 ] && return
  local used i
  for i in $(seq 30); do
    used="$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -1 | tr -d ' ')"
    case "$used" in ''|*[!0-9]*) return ;; esac
    [ "$used" -lt 4096 ] && return
    [ "$i" = 1 ] && echo "== waiting for the GPU's memory ($used MiB used)"
    sleep 1
  done
  echo "== the GPU still holds $used MiB after 30 s"
}

RESERVE_S=15
declare -A STATUS
summary=()
for step in $STEPS; do
  cmd="$(step_command "$step")"
  if [ "$smoke" = 1 ]; then  # parse only: the step's module parses its flags, then stops (nothing runs)
    case "$cmd" in
      "python3 -m "*) cmd="python3 $STAGE/argcheck.py ${cmd#python3 -m }" ;;
      *) cmd="test -n ${cmd// /_}" ;;  # the anchor: a script outside the tree
    esac
  fi
  if [ "$step" = anchor ] && [ ! -f .anchor/chattts_gpt_anchor.py ] && [ "$smoke" = 0 ]; then
    STATUS[$step]="skipped (.anchor is not carried)"; summary+=("$step: ${STATUS[$step]}"); continue
  fi
  left=$((BUDGET_S - SECONDS - RESERVE_S))
  limit=$(( CAP[$step] < left ? CAP[$step] : left ))
  if [ "$limit" -lt 20 ]; then
    STATUS[$step]="skipped (${left}s of budget left)"; summary+=("$step: ${STATUS[$step]}"); echo "== $step: ${STATUS[$step]}"
    continue
  fi
  gpu_released
  left=$((BUDGET_S - SECONDS - RESERVE_S))
  limit=$(( CAP[$step] < left ? CAP[$step] : left ))
  step_env=()
  if [ "$step" = vllm_profile ]; then  # every process the step starts samples its stacks (sitecustomize)
    step_env=(env "STACK_SAMPLES_DIR=$STAGE/logs/stacks" "PYTHONPATH=bench/runtime/stack_hook:${PYTHONPATH:-}")
  fi
  echo "== $(date -u +%T) $step (limit ${limit}s): ${step_env[*]} $cmd"
  t0=$SECONDS
  if [ "$smoke" = 1 ]; then
    # shellcheck disable=SC2086
    timeout -k 10 "$limit" "${step_env[@]}" $cmd > "$STAGE/logs/$step.log" 2>&1
    rc=$?
  else
    # shellcheck disable=SC2086  # timeout signals the step's whole process group (servers, load generators)
    timeout -k 10 "$limit" "${step_env[@]}" $cmd 2>&1 | tee "$STAGE/logs/$step.log"
    rc=${PIPESTATUS[0]}
  fi
  took=$((SECONDS - t0))
  case "$rc" in
    0) STATUS[$step]="passed" ;;
    124|137) STATUS[$step]="TIMED OUT after ${limit}s"; sleep 2 ;;
    *) STATUS[$step]="FAILED (exit $rc)" ;;
  esac
  summary+=("$step: ${STATUS[$step]} in ${took}s")
  echo "== $step: ${STATUS[$step]} in ${took}s"
done

# Collect: results, the servers' logs and configs, and vLLM's own memory figures from them.
RESULTS_DIR="${BENCH_RESULTS:-bench/results}"
[ -f "$OUT/anchor.json" ] && [ "$OUT/anchor.json" -nt "$STAGE/started" ] && cp "$OUT/anchor.json" "$STAGE/results/anchor-h200-$DATE.json"
for f in "$RESULTS_DIR"/runtime-h200-"$DATE"-*.json "$RESULTS_DIR"/runtime-h200-"$DATE"-*.md \
         "$RESULTS_DIR"/tmp/bench-server-*.log "$RESULTS_DIR"/tmp/bench-server-*.yaml; do
  if [ -f "$f" ] && [ "$f" -nt "$STAGE/started" ]; then
    case "$f" in "$RESULTS_DIR"/tmp/*) cp "$f" "$STAGE/logs/" ;; *) cp "$f" "$STAGE/results/" ;; esac
  fi
done
grep -hiE "model loading took|kv cache|cuda graph|graph capturing|maximum concurrency|memory profiling|torch.compile takes|init engine" \
  "$STAGE"/logs/*.log 2>/dev/null | cut -c1-300 | sort -u > "$STAGE/results/vllm-memory-lines-$DATE.txt" || true
{
  echo "vllm_h200.sh $(date -u +%FT%TZ), ${SECONDS}s, steps: $STEPS"
  printf '%s\n' "${summary[@]}"
  grep -hE "^(MISSING|FAILED) |^missing top-level" "$STAGE/logs/imports.log" 2>/dev/null
  grep -hE "greedy frames equal|NOT EQUAL" "$STAGE"/logs/check*.log 2>/dev/null | cut -c1-300
  grep -h "^concurrency " "$STAGE"/logs/vllm*.log "$STAGE"/logs/graph*.log 2>/dev/null | cut -c1-160
  for f in "$STAGE"/logs/stacks/stacks-*.txt; do  # the profiled processes' busiest threads, in short
    [ -f "$f" ] || continue
    awk 'NR == 1 {print; next} /^## thread/ {n++; k = 0} n == 1 && k++ < 28 {print} /^# folded/ {exit}' "$f" | cut -c1-180
  done
} | tee "$OUT/summary.txt"
tar -czf "$OUT/results.tar.gz" -C "$STAGE" results
tar -czf "$OUT/logs.tar.gz" -C "$STAGE" logs
ls -l "$OUT"
failed=0
for name in "${!STATUS[@]}"; do case "${STATUS[$name]}" in passed|skipped*) ;; *) failed=1 ;; esac; done
exit $failed
