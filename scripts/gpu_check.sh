#!/usr/bin/env bash
# The GPU checks, in one go on a CUDA machine (none of them is needed to install or test the project):
#
#   scripts/gpu_check.sh OUT_DIR tests            # tests/test_decode_gpu.py (greedy equality, bf16/fp16, CUDA graphs)
#   scripts/gpu_check.sh OUT_DIR decode           # scripts/bench_decode.py in bf16, eager and compiled (CUDA graphs)
#   scripts/gpu_check.sh OUT_DIR overhead         # scripts/bench_step_overhead.py in bf16, eager and compiled: the
#                                                 # self-drafting host-bound pair, the round split into drafting,
#                                                 # verifying and the decoder's own work, host reads per step
#   scripts/gpu_check.sh OUT_DIR head TARGET HEAD # specdistill-eval of an EAGLE-3 head on its real target, bf16:
#                                                 # greedy gamma 2 4 6, prompt lookup, T=1, compiled (a greedy
#                                                 # round one CUDA graph), compiled_steps (the same with the head's
#                                                 # steps apart: HeadDrafter.chained off)
#                                                 # (RUNS="compiled greedy" picks and orders them)
#   scripts/gpu_check.sh OUT_DIR train TARGET [RUN] # NUM (4096) prompts written and answered by TARGET here
#                                                 # (toward CATEGORIES, default all; none of them held out), then
#                                                 # recipes/smollm2/eagle3.yaml on them in bf16 (the data curve's
#                                                 # settings, 3.75 epochs at batch BATCH=32, the target run in each
#                                                 # step); the head lands in RUN (default OUT_DIR/head_run), ready
#                                                 # for the head step
#
# Durations on an H100/H200 (torch 2.11): tests 70-100 s, decode ~140-220 s (compile included), overhead not timed
# yet (about 40 s on a 2-core CPU); train's data
# ~4 min for NUM=4096 on an H200 (prompts 115 s, answers 76 s, two model loads), its training not timed yet. head
# runs transformers' eager forward at ~50 tokens/s for SmolLM2-135M (launch-bound), so each eval of PROMPTS=8 (one
# per category) x NEW=64 tokens takes ~40 s per gamma; the default limit of a step is LIMIT=240 s (COMPILED_LIMIT=360
# for head's compiled runs, whose compilation counts).
# Each step writes its log and results into OUT_DIR and has its own time limit, so one slow step loses only itself.
# PYTHON (default python3) is the interpreter; the repository is put on PYTHONPATH, nothing is installed: a
# dependency of pyproject.toml that the interpreter lacks stops the script before any step, naming it.
set -u
OUT=${1:?usage: scripts/gpu_check.sh OUT_DIR tests|decode|overhead|head|train ...}
STEP=${2:?step: tests, decode, overhead, head or train}
PY=${PYTHON:-python3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
    TOKENIZERS_PARALLELISM=false
mkdir -p "$OUT"
cd "$ROOT" || exit 1

machine() {
    $PY - <<'EOF'
import platform, torch, transformers
p = torch.cuda.get_device_properties(0) if torch.cuda.is_available() else None
print(f"machine: {p.name if p else 'no CUDA device'}"
      f"{f', {p.total_memory / 2**30:.0f} GiB, {p.multi_processor_count} SMs' if p else ''}; "
      f"Python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}")
EOF
}

missing_packages() {  # the project's dependencies this interpreter lacks (a GPU image has torch, not all of ours)
    $PY - <<'EOF'
import re, tomllib
from importlib.metadata import PackageNotFoundError, version
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
missing = []
for dep in deps:
    name = re.match(r"[A-Za-z0-9_.-]+", dep).group(0)
    if name == "deepspeed":  # ZeRO training only: no step here imports it
        continue
    try:
        version(name)
    except PackageNotFoundError:
        missing.append(name)
print(" ".join(missing))
EOF
}

MISSING=$(missing_packages)
if [ -n "$MISSING" ]; then  # found now, not at the end of a measurement (the eval JSON needs `evaluate`)
    echo "gpu_check.sh: missing Python packages: $MISSING (carry them as wheels: docs/benchmarks/gpu.md)" >&2
    exit 2
fi

case "$STEP" in
tests)
    machine | tee "$OUT/tests.log"
    timeout "${LIMIT:-240}" $PY -m pytest tests/test_decode_gpu.py -m gpu -q -p no:cacheprovider 2>&1 \
        | tee -a "$OUT/tests.log"
    ;;
decode)
    machine | tee "$OUT/decode.log"
    timeout "${LIMIT:-300}" $PY scripts/bench_decode.py --device cuda --dtype bfloat16 --compile \
        --gamma ${GAMMAS:-2 4} --num-prompts 4 --max-new-tokens 128 --repeats 3 \
        --markdown "$OUT/decode.md" --json "$OUT/decode.json" 2>&1 | tee -a "$OUT/decode.log"
    ;;
overhead)
    machine | tee "$OUT/overhead.log"
    timeout "${LIMIT:-240}" $PY scripts/bench_step_overhead.py --device cuda --dtype bfloat16 \
        --repeats "${REPEATS:-3}" --json "$OUT/step_overhead_gpu.json" 2>&1 | tee -a "$OUT/overhead.log"
    ;;
head)
    TARGET=${3:?head needs TARGET (folder or .gguf)}; HEAD=${4:?head needs the head folder}
    machine | tee "$OUT/head.log"
    PROMPT_FILE=${PROMPT_FILE:-recipes/prompts/chat_eval.jsonl}  # its categories take turns: the first 8, one each
    # specdistill-eval with the head's compiled greedy rounds drafted step by step (for the same-machine comparison)
    STEPS_APART='import runpy, sys, kinds.eagle3.drafter as d; d.HeadDrafter.chained = False
sys.argv[0] = "scripts/eval_acceptance.py"; runpy.run_path(sys.argv[0], run_name="__main__")'
    run_eval() {  # NAME ARGS...: one specdistill-eval run on the held-out chat prompts (EVAL: how it is started)
        local name=$1; shift
        echo "== $name: $*" | tee -a "$OUT/head.log"
        timeout "${LIMIT:-240}" $PY "${EVAL[@]}" --target "$TARGET" \
            --prompts "$PROMPT_FILE" --num-prompts "${PROMPTS:-8}" --max-new-tokens "${NEW:-64}" \
            --device "${DEVICE:-cuda}" --dtype "${DTYPE:-bfloat16}" --repeats 1 --output "$OUT/$name.json" "$@" 2>&1 \
            | tee -a "$OUT/head.log"
    }
    for run in ${RUNS:-greedy lookup t1 compiled compiled_steps}; do  # RUNS picks and orders them
        EVAL=(scripts/eval_acceptance.py)
        case "$run" in
        greedy) run_eval head_greedy --draft "$HEAD" --gamma ${GAMMAS:-2 4 6} ;;
        lookup) run_eval lookup_greedy --draft prompt-lookup --gamma 4 ;;
        t1) run_eval head_t1 --draft "$HEAD" --gamma 4 --temperature 1.0 ;;
        # compiled runs compile the target's and the head's steps (and, chained, its round) inside their limit
        compiled) LIMIT=${COMPILED_LIMIT:-360} run_eval head_compiled --draft "$HEAD" --gamma 4 --compile ;;
        compiled_steps) EVAL=(-c "$STEPS_APART")
            LIMIT=${COMPILED_LIMIT:-360} run_eval head_compiled_steps --draft "$HEAD" --gamma 4 --compile ;;
        *) echo "gpu_check.sh: unknown head run '$run' (greedy, lookup, t1, compiled or compiled_steps)" >&2 ;;
        esac
    done
    ;;
train)
    TARGET=${3:?train needs TARGET (folder or .gguf)}; RUN=${4:-$OUT/head_run}
    DATA=${DATA:-$OUT/data}; BATCH=${BATCH:-32}
    machine | tee "$OUT/train.log"
    data_job() {  # JOB ARGS...: specdistill-data on this machine's device, 512 prompts at once
        local job=$1; shift
        echo "== data $job: $*" | tee -a "$OUT/train.log"
        timeout "${LIMIT:-300}" $PY -m specdistill.cli.data "$job" --target "$TARGET" --batch-size 512 --quiet "$@" 2>&1 \
            | tee -a "$OUT/train.log"
    }
    # CATEGORIES (default all: the held-out prompts' 8 categories in turn; "none": the bare Magpie turn)
    if [ "${CATEGORIES:-all}" = none ]; then toward=(); else toward=(--categories ${CATEGORIES:-all}); fi
    data_job prompts --num "${NUM:-4096}" --seed "${SEED:-0}" --out "$DATA/prompts" "${toward[@]}" \
        --exclude recipes/prompts/chat_eval.jsonl
    data_job responses --prompts "$DATA/prompts" --out "$DATA/chat" --max-new-tokens 128
    if [ ! -s "$DATA/chat/train.jsonl" ]; then
        echo "gpu_check.sh: no training rows in $DATA/chat (see $OUT/train.log)" >&2; exit 1
    fi
    ROWS=$(wc -l <"$DATA/chat/train.jsonl"); STEPS=$(( (ROWS * 15 / 4 + BATCH - 1) / BATCH ))  # 3.75 epochs
    echo "== train: $ROWS rows, $STEPS steps at batch $BATCH" | tee -a "$OUT/train.log"
    # PRECISION: bf16 weights for the frozen target and bf16 autocast for the head (PRECISION="" on a CPU)
    timeout "${TRAIN_LIMIT:-600}" $PY scripts/train.py recipes/smollm2/eagle3.yaml model.target="$TARGET" \
        data.dataset="$DATA/chat" distill.hidden_state_cache=null distill.ttt_steps=4 distill.ttt_decay=0.8 \
        train.max_steps="$STEPS" train.per_device_train_batch_size="$BATCH" train.output_dir="$RUN" \
        data.num_eval_prompts="${PROMPTS:-16}" "eval.gammas=[2,4]" \
        ${PRECISION-model.target_dtype=bfloat16 train.bf16=true} 2>&1 | tee -a "$OUT/train.log"
    ;;
*)
    echo "gpu_check.sh: unknown step '$STEP' (tests, decode, overhead, head or train)" >&2; exit 2 ;;
esac
