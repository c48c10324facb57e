#!/usr/bin/env bash
# Run the GPU validation on a lent GPU machine, in parts that each fit one 10-minute device command.
# Every part but dry-run and summary first installs this checkout into the current Python (pip install -e .):
# run them on the device machine, never on a machine whose Python others use.
#
#   bench/gpu/run_all.sh next      # the next GPU session's first command: the eviction microbenchmark, then the
#                                  # C++ observer's cost (each step under its own limit; at most ~7 min)
#   bench/gpu/run_all.sh next2     # its second command, at once: discards, then torchrun on one rank (<= ~5 min)
#   bench/gpu/run_all.sh replay    # any standard trace replayed with touch kernels (replay_gpu.py; <= ~4 min)
#   bench/gpu/run_all.sh part1     # calibrate + tests/gpu + correctness           (~6 min, at most ~9)
#   bench/gpu/run_all.sh part2     # 1.5x: oversub --trace (managed, uvmprefetch, deepum) + fidelity --from
#                                  # oversub, without and with the live-sync host clock (~8 min, at most ~9.5)
#   bench/gpu/run_all.sh part2b    # the same at 2x, into <run folder>/oversub-2x/  (~8 min, at most ~9.5)
#   bench/gpu/run_all.sh part3     # overhead                                      (~3 min, at most ~3.5)
#   bench/gpu/run_all.sh discard   # UVMPREFETCH_DISCARD=1: the probe + correctness --discard (at most ~6.5 min)
#   bench/gpu/run_all.sh discard2  # diagnose at 1.5x, 7 iterations, uvmprefetch with and without discards (<= ~7.5 min)
#   bench/gpu/run_all.sh discard3  # one command for a 15-minute lease: the discard probe, discard2's diagnose,
#                                  # then correctness --discard over 10 iterations (~7-8 min; the last step may be cut)
#   bench/gpu/run_all.sh dist      # torchrun, one rank, NCCL, DDP on GPT-2 small under a budget (<= ~4 min)
#   bench/gpu/run_all.sh runtime   # the C++ observer: tests/gpu/test_native_observer_cuda.py, then runtime_cost.py
#                                  # (GPT-2 medium fits, GPT-2 large at 1.5x; ~7 min with the setup, at most ~8.5)
#   bench/gpu/run_all.sh tracker   # the allocator tracker on real allocator events (tests/gpu/test_alloc_tracker_gpu.py,
#                                  # ~1-2 min with the setup; needs no runtime integration)
#   bench/gpu/run_all.sh discards  # discards.py: GPT-2 large at 1.5x and 2x, discards on and off, 7 iterations
#                                  # (~6 min, at most ~7 with the setup); needs the runtime's liveness integration
#   bench/gpu/run_all.sh copypath  # copypath.py: GPT-2 large at 1.5x and 2x, UVMPREFETCH_EVICT=auto vs uvm, 7 iterations
#                                  # (~8 min, at most ~9 with the setup); needs the allocator events wired into the
#                                  # runtime (else the copy path finds no eligible block and the check says so)
#   bench/gpu/run_all.sh alternatives     # every way to train GPT-2 large under the 1.5x budget (checkpointing,
#                                         # offload, FSDP2 offload, managed, uvmprefetch), then 2x while its
#                                         # deadline allows (~7.5 min, at most ~9)
#   bench/gpu/run_all.sh alternatives-2x  # the same at 2x only (~7 min)
#   bench/gpu/run_all.sh fidelity  # fidelity alone, its own runs (if part2 ran out of time)
#   RES=DIR bench/gpu/run_all.sh summary   # gpu-summary.md from the results in DIR
#   bench/gpu/run_all.sh dry-run   # every script with --dry-run, on any machine (CPU)
#
# Results go to $RES, by default ./gpu-<part>-<UTC date-time>/ under the directory it is called from, and, when
# $OUT is set (the device tool), are copied there too as soon as each exists. part2's fidelity replays with
# the device's hand-fitted profile of uvmprefetch/gpus.py (h100-sxm-cal on an H100), not calibrate.json.
# docs/gpu-validation.md has the exact device-tool command lines.
set -uo pipefail
PART=${1:-}
RES=${RES:-$PWD/gpu-${PART:-none}-$(date -u +%Y%m%d-%H%M%S)}
cd "$(dirname "$0")/../.." || exit 2
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
# The shared-GPU rule (docs/design.md §5): never more managed memory than the card has free; pressure comes from
# UVMPREFETCH_BUDGET. The scripts set it for every child they start (_common.child_env); this covers the rest.
export UVMPREFETCH_MANAGED_LIMIT=gpu-free
PY=${PYTHON:-python3}
LOG=/tmp/uvmp-run_all-${PART:-none}.log
STATUS=0

case "$PART" in  # the parts that run on a GPU write into a fresh run folder
part1 | part2 | part2b | part3 | discard | discard2 | discard3 | fidelity | alternatives | alternatives-2x) mkdir -p "$RES" || exit 2 ;;
esac

log() { echo "[run_all $(date -u +%H:%M:%S)] $*" | tee -a "$LOG" >&2; }

setup() {
    # The image has torch, transformers and cuda-bindings but no network: install this package itself without
    # dependencies (its pins name the CPU torch of the dev machines) so that the UVMPREFETCH=1 start-up hook
    # is installed; fall back to PYTHONPATH (then only `uvmprefetch run` / explicit enable work).
    if ! "$PY" -m pip install -q --no-deps --no-build-isolation --no-index -e . >>"$LOG" 2>&1; then
        log "pip install -e . failed (see log); using PYTHONPATH and copying the start-up hook by hand"
        SITE=$("$PY" -c 'import site; print(site.getsitepackages()[0])')
        cp uvmprefetch/runtime/uvmprefetch-startup.pth "$SITE/" 2>>"$LOG" || log "cannot install the start-up hook"
    fi
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
    "$PY" - <<'EOF' 2>&1 | tee -a "$LOG"
import importlib, torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "gpu", torch.cuda.is_available() and torch.cuda.get_device_name(0))
for m in ("transformers", "cuda.bindings", "uvmprefetch"):
    try:
        mod = importlib.import_module(m); print(m, getattr(mod, "__version__", "ok"))
    except Exception as e:
        print(m, "MISSING:", e)
EOF
    nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv 2>&1 | tee -a "$LOG"
    command -v uvmprefetch >/dev/null && uvmprefetch doctor 2>&1 | tee -a "$LOG"
}

# step NAME SECONDS CMD...: run one script under a hard time limit; its exit code is remembered, never fatal.
step() {
    local name=$1 limit=$2; shift 2
    log "start $name (limit ${limit}s): $*"
    timeout --signal=TERM --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$LOG"
    local rc=${PIPESTATUS[0]}
    log "end $name rc=$rc"
    [ "$rc" -eq 0 ] || STATUS=1
}

# save FILE...: copy results to $OUT as soon as they exist, so that a command cut at its time limit still
# brings back what finished (the device tool returns what is under $OUT even then).
save() {
    [ -n "${OUT:-}" ] || return 0
    for f in "$@"; do
        [ -f "$RES/$f" ] && cp "$RES/$f" "$OUT/"
    done
    cp "$LOG" "$OUT/run_all-$PART.log" 2>/dev/null
    return 0
}

collect() {
    "$PY" bench/gpu/summarize.py --results "$RES" >/dev/null 2>>"$LOG" || log "summarize found nothing"
    save "$@" gpu-summary.md
    tail -n 40 "$RES/gpu-summary.md" 2>/dev/null
}

# compile the policy's Numba kernels into the package's cache first (~60 s on a fresh machine, seconds after):
# otherwise the first uvmprefetch run pays it inside its run time limit
numba_warm() {
    step numba-warm 120 "$PY" -c "from uvmprefetch.sim.replay import replay; from uvmprefetch.trace import load
replay(load('traces/gpt2-small-b2s128.uvmt'), 'uvmprefetch', oversub=1.5)"
}

# GPT-2 large at the 1.5x budget oversub.py measured, uvmprefetch with and without discards, 7 iterations (on an
# H200 a run with discards went NaN at iteration 3 of 7 and was finite over 4)
# One bench/gpu script that writes its cases into bench/baselines/gpu.json: DIR SCRIPT LIMIT ARGS... runs
# bench/gpu/SCRIPT.py ARGS --out $RES/DIR within LIMIT seconds; its SCRIPT.json and the baseline file go to $OUT.
baseline_script() {
    local dir=$1 script=$2 limit=$3; shift 3
    mkdir -p "$RES/$dir"
    numba_warm
    step "$script" "$limit" "$PY" "bench/gpu/$script.py" "$@" --out "$RES/$dir"
    [ -n "${OUT:-}" ] && cp "$RES/$dir/$script.json" bench/baselines/gpu.json "$OUT/" 2>/dev/null
    save
}

discard_diagnose() {
    step diagnose-discard 330 "$PY" bench/gpu/diagnose.py --budget "${BUDGET:-34636562432}" --iters 7 --warmup 3 \
        --timeout 150 --deadline 160 --out "$RES/discard" --policies 'uvmprefetch|UVMPREFETCH_DISCARD=1;uvmprefetch'
    [ -n "${OUT:-}" ] && cp "$RES/discard/diagnose.json" "$OUT/diagnose-discard.json" 2>/dev/null
    save
}

# keep_next FILE...: bring results of `next` back at once (a command cut at its limit keeps what finished), with
# the baseline file its scripts updated here (bench/baselines/gpu.json: commit it on the development machine)
keep_next() {
    [ -n "${OUT:-}" ] || return 0
    for f in "$@"; do
        [ -f "$NEXT/$f" ] && cp "$NEXT/$f" "$OUT/"
    done
    [ -f bench/baselines/gpu.json ] && cp bench/baselines/gpu.json "$OUT/gpu.json"
    cp "$LOG" "$OUT/run_all-next.log" 2>/dev/null
    return 0
}

case "$PART" in
next)
    # The next GPU session's FIRST command (~5.5 min, <= 8; a 15-minute lease = a start of a few minutes, this, then
    # `next2` at once while the machine is warm). Ordered by value; each step under its own limit, a cut step
    # keeps what finished. Keep the limits' sum (+ ~30 s of setup) under ~480 s.
    setup
    NEXT=$RES/next
    mkdir -p "$NEXT"
    # 1. issue 33 step 1, the measurements that decide copy-out eviction: copy-out + discard + copy-in against
    #    UVM eviction, remote access (~1 min on an H100)
    step evict-microbench 130 "$PY" bench/gpu/evict_microbench.py --out "$NEXT" --time-limit 110
    keep_next evict_microbench.json
    # 2. issue 31, the C++ observer, planner and mover threads: GPT-2 medium fits (overhead, losses bit-equal),
    #    GPT-2 large at 1.5x (host us per launch, no eviction call on the training thread); the policy's Numba
    #    kernels compile first (~60 s on a fresh machine)
    numba_warm
    step runtime-cost 200 "$PY" bench/gpu/runtime_cost.py --rounds 1 --fits-iters 10 --over-iters 4 \
        --time-limit 180 --out "$NEXT"
    keep_next runtime_cost.json
    ;;
next2)
    # The SECOND command of a 15-minute lease (<= 5 min), right after `next`: issue 32's discards (losses with
    # discards bit-equal to the run without, D2H per iteration), then issue 35's one-rank torchrun check.
    setup
    NEXT=$RES/next
    mkdir -p "$NEXT"
    numba_warm
    step discards 160 "$PY" bench/gpu/discards.py --ratios 1.5 --iters 5 --warmup 2 --timeout 70 --deadline 150 \
        --out "$NEXT"
    keep_next discards.json
    step distributed 110 "$PY" bench/gpu/distributed.py --deadline 100 --out "$NEXT"
    keep_next distributed.json
    ;;
replay)
    # issue 38: four of the standard traces (not T5 base) replayed with touch kernels at 1/8 of their size, 1.5x, demand and
    #    uvmprefetch under the live runtime, each with the simulator's prediction (~2.5 min, at most 3.5: it
    #    records the traces, ~30 s, and compiles the policy, ~1 min on a fresh machine, first; no case starts
    #    after 150 s, so the smaller traces go first). Written into $OUT after every case: a cut keeps them.
    setup
    NEXT=$RES/next
    mkdir -p "$NEXT"
    step replay-gpu 210 "$PY" bench/gpu/replay_gpu.py resnet-152 bert-large vit-large gpt2-large --scale 1/8 \
        --oversub 1.5 --policies demand,uvmprefetch --time-limit 150 --case-timeout 45 --out "${OUT:-$NEXT}"
    keep_next replay_gpu.json
    ;;
part1)
    setup
    step calibrate 120 "$PY" bench/gpu/calibrate.py --quiet --out "$RES"
    save calibrate.json
    # the GPU tests (runtime under cuda, trace recording on a GPU); their output is in run_all-part1.log
    step tests-gpu 150 "$PY" -m pytest -q -p no:cacheprovider tests/gpu -rs
    step correctness 210 "$PY" bench/gpu/correctness.py --iters 20 --timeout 90 --out "$RES"
    collect calibrate.json correctness.json
    ;;
part3)
    setup
    step overhead 200 "$PY" bench/gpu/overhead.py --iters 20 --warmup 5 --rounds 2 --timeout 60 --out "$RES"
    collect overhead.json
    ;;
discard)
    # the discard order of docs/runtime.md section 4 on a GPU: the probe (a discard behind an eviction of the
    # same range, then its memory reused), then the losses with discards on (they went NaN on an H100 and an H200)
    setup
    mkdir -p "$RES/discard"
    step tests-gpu-discard 90 "$PY" -m pytest -q -p no:cacheprovider tests/gpu -k discard -rs
    step correctness-discard 290 "$PY" bench/gpu/correctness.py --discard --iters 20 --timeout 60 \
        --out "$RES/discard"
    [ -n "${OUT:-}" ] && cp "$RES/discard/correctness.json" "$OUT/correctness-discard.json" 2>/dev/null
    save
    ;;
discard2)
    # where the time goes with discards on (docs/gpu-validation.md)
    setup
    mkdir -p "$RES/discard"
    numba_warm
    discard_diagnose
    ;;
discard3)
    # a lease of 15 device minutes holds one ~9-minute command: the discard probe, then 7 iterations of GPT-2 large
    # at 1.5x with discards (the guard on) and without, then the losses with discards against plain PyTorch
    setup
    mkdir -p "$RES/discard"
    step tests-gpu-discard 80 "$PY" -m pytest -q -p no:cacheprovider tests/gpu -k discard -rs
    save
    numba_warm
    discard_diagnose
    step correctness-discard 150 "$PY" bench/gpu/correctness.py --discard --iters 10 --timeout 45 --out "$RES/discard"
    [ -n "${OUT:-}" ] && cp "$RES/discard/correctness.json" "$OUT/correctness-discard.json" 2>/dev/null
    save
    ;;
runtime)
    # the C++ observer, planner and mover threads (docs/runtime.md, "Threads"): events on CUDA against the dispatch
    # mode and a real gated wait, then the overhead when the model fits and the cost at 1.5x (baseline cases)
    setup
    step tests-gpu-observer 90 "$PY" -m pytest -q -p no:cacheprovider tests/gpu/test_native_observer_cuda.py -rs
    save
    baseline_script runtime runtime_cost 360 --time-limit 330
    ;;
tracker)
    setup
    step tests-gpu-tracker 240 "$PY" -m pytest -q -p no:cacheprovider tests/gpu/test_alloc_tracker_gpu.py -rs
    # the session's allocator feed and the gated discard call (tests/gpu/_probe.py "liveness", "move")
    step tests-gpu-feed 180 "$PY" -m pytest -q -p no:cacheprovider tests/gpu/test_runtime_gpu.py -rs \
        -k "unobserved_allocation or prefetch_and_discard"
    save
    ;;
discards)
    # liveness from the caching allocator (docs/runtime.md section 11): losses with discards on must be
    # bit-equal to the same run without; D2H per iteration both ways; cases into bench/baselines/gpu.json
    setup
    baseline_script discards discards 380 --iters 7 --warmup 2 --timeout 150 --deadline 340
    ;;
copypath)
    # the copy path (docs/runtime.md "The copy path"): losses with UVMPREFETCH_EVICT=auto must be bit-equal to
    # UVM's eviction only; s/iter against plain; cases into bench/baselines/gpu.json
    setup
    baseline_script copypath copypath 500 --iters 7 --warmup 2 --timeout 150 --deadline 480
    ;;
part2 | part2b)
    setup
    # One ratio per device command: managed, uvmprefetch and deepum at 5 iterations each (3 steady; demand@2x
    # takes ~10 s an iteration) did not fit both ratios in one (on an H100 the deadline cut uvmprefetch@2x and
    # deepum). part2b writes under oversub-2x/ so that both parts' results stay.
    if [ "$PART" = part2 ]; then RATIO=1.5; DIR=$RES; SUF=; else RATIO=2; DIR=$RES/oversub-2x; SUF=-2x; fi
    mkdir -p "$DIR"
    numba_warm
    step oversub 430 "$PY" bench/gpu/oversub.py --trace --ratios "$RATIO" --out "$DIR" \
        --work-dir "/tmp/uvmp-oversub$SUF" --iters 5 --warmup 2 --deadline 390 --timeout 150
    keep() { [ -n "${OUT:-}" ] && cp "$1" "$OUT/$2" 2>/dev/null; return 0; }  # at once: a cut command keeps it
    keep "$DIR/oversub.json" "oversub$SUF.json"
    # fidelity replays with the device's hand-fitted gpus.py profile (h100-sxm on an H100) by itself, and
    # without discards where the live run had none (the cuda default: its report's discards_issued)
    step fidelity 60 "$PY" bench/gpu/fidelity.py --from "$DIR/oversub.json" --out "$DIR"
    keep "$DIR/fidelity.json" "fidelity$SUF.json"
    # the same replays with the host clock the live runtime showed (docs/simulator.md "Host clock")
    step fidelity-live-sync 60 "$PY" bench/gpu/fidelity.py --from "$DIR/oversub.json" --host live-sync \
        --out "$DIR/fidelity-live-sync"
    keep "$DIR/fidelity-live-sync/fidelity.json" "fidelity-live-sync$SUF.json"
    "$PY" bench/gpu/summarize.py --results "$DIR" >/dev/null 2>>"$LOG" || log "summarize found nothing"
    keep "$DIR/gpu-summary.md" "gpu-summary$SUF.md"
    save
    tail -n 40 "$DIR/gpu-summary.md" 2>/dev/null
    ;;
dist)
    # a runtime per rank under torchrun (docs/runtime.md "Distributed training"); the figures go into
    # bench/baselines/gpu.json, which comes back with the result
    setup
    numba_warm
    step distributed 200 "$PY" bench/gpu/distributed.py --deadline 170
    [ -n "${OUT:-}" ] && cp bench/baselines/gpu.json "$OUT/gpu.json" 2>/dev/null
    collect distributed.json
    ;;
alternatives | alternatives-2x)
    # 5 iterations a run (2 warm-up, as part2): under the H100's costs managed and uvmprefetch take ~10 s an
    # iteration at 1.5x, so a --deadline of 330 s holds the 1.5x methods and whatever of 2x fits after them
    setup
    if [ "$PART" = alternatives ]; then RATIOS=1.5,2; SUF=; else RATIOS=2; SUF=-2x; fi
    numba_warm
    step alternatives 390 "$PY" bench/gpu/alternatives.py --oversub "$RATIOS" --iters 5 --warmup 2 \
        --timeout 150 --deadline 330 --out "$RES" --work-dir "/tmp/uvmp-alternatives$SUF"
    if [ -n "${OUT:-}" ]; then
        cp "$RES/alternatives.json" "$OUT/alternatives$SUF.json" 2>/dev/null
        cp "$RES/alternatives.png" "$OUT/alternatives$SUF.png" 2>/dev/null
        cp bench/baselines/gpu.json "$OUT/gpu-baseline$SUF.json" 2>/dev/null
    fi
    save
    ;;
fidelity)
    setup
    step fidelity 540 "$PY" bench/gpu/fidelity.py --timeout 120 --out "$RES"
    collect fidelity.json
    ;;
summary)
    [ -d "$RES" ] || { echo "run_all.sh summary: RES=$RES is not a folder of results (set RES=DIR)" >&2; exit 2; }
    collect
    ;;
dry-run)
    RES=out/gpu-dryrun
    step evict-microbench 120 "$PY" bench/gpu/evict_microbench.py --dry-run --quiet
    step replay-gpu 300 "$PY" bench/gpu/replay_gpu.py --dry-run --quiet
    step calibrate 120 "$PY" bench/gpu/calibrate.py --dry-run --quiet
    step correctness 300 "$PY" bench/gpu/correctness.py --dry-run
    step overhead 300 "$PY" bench/gpu/overhead.py --dry-run --rounds 1
    step oversub 300 "$PY" bench/gpu/oversub.py --dry-run --trace
    step fidelity 300 "$PY" bench/gpu/fidelity.py --dry-run --from "$RES/oversub.json"
    step distributed 300 "$PY" bench/gpu/distributed.py --dry-run
    step alternatives 600 "$PY" bench/gpu/alternatives.py --dry-run
    step copypath 300 "$PY" bench/gpu/copypath.py --dry-run
    step runtime-cost 600 "$PY" bench/gpu/runtime_cost.py --dry-run --rounds 1 --time-limit 580
    "$PY" bench/gpu/summarize.py --dry-run | tail -n 12
    ;;
*)
    echo "usage: bench/gpu/run_all.sh next|next2|replay|part1|part2|part2b|part3|discard|discard2|discard3|dist|runtime|tracker|discards|copypath|alternatives|alternatives-2x|fidelity|summary|dry-run" >&2
    exit 2
    ;;
esac
log "done $PART status=$STATUS"
exit $STATUS
