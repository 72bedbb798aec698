#!/usr/bin/env bash
# The GPU checks, in one go on a CUDA machine (none of them is needed to install or test the project):
#
#   scripts/gpu_check.sh OUT_DIR tests            # tests/test_decode_gpu.py (greedy equality, bf16/fp16, CUDA graphs)
#   scripts/gpu_check.sh OUT_DIR decode           # scripts/bench_decode.py in bf16, eager and compiled (CUDA graphs)
#   scripts/gpu_check.sh OUT_DIR head TARGET HEAD # specdistill-eval of an EAGLE-3 head on its real target, bf16:
#                                                 # greedy gamma 2 4 6, prompt lookup, T=1, compiled
#                                                 # (RUNS="compiled greedy" picks and orders them)
#
# Durations on an H100/H200 (torch 2.11): tests 70-85 s, decode ~140 s (compile included). head runs transformers' eager forward at ~50
# tokens/s for SmolLM2-135M (launch-bound), so each eval of PROMPTS=8 (one per category) x NEW=64 tokens takes
# ~40 s per gamma; the default limit of a step is LIMIT=240 s.
# Each step writes its log and results into OUT_DIR and has its own time limit, so one slow step loses only itself.
# PYTHON (default python3) is the interpreter; the repository is put on PYTHONPATH, nothing is installed: a
# dependency of pyproject.toml that the interpreter lacks stops the script before any step, naming it.
set -u
OUT=${1:?usage: scripts/gpu_check.sh OUT_DIR tests|decode|head ...}; STEP=${2:?step: tests, decode or head}
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
head)
    TARGET=${3:?head needs TARGET (folder or .gguf)}; HEAD=${4:?head needs the head folder}
    machine | tee "$OUT/head.log"
    PROMPT_FILE=${PROMPT_FILE:-recipes/prompts/chat_eval.jsonl}  # its categories take turns: the first 8, one each
    run_eval() {  # NAME ARGS...: one specdistill-eval run on the held-out chat prompts
        local name=$1; shift
        echo "== $name: $*" | tee -a "$OUT/head.log"
        timeout "${LIMIT:-240}" $PY scripts/eval_acceptance.py --target "$TARGET" \
            --prompts "$PROMPT_FILE" --num-prompts "${PROMPTS:-8}" --max-new-tokens "${NEW:-64}" \
            --device "${DEVICE:-cuda}" --dtype "${DTYPE:-bfloat16}" --repeats 1 --output "$OUT/$name.json" "$@" 2>&1 \
            | tee -a "$OUT/head.log"
    }
    for run in ${RUNS:-greedy lookup t1 compiled}; do  # RUNS picks and orders them
        case "$run" in
        greedy) run_eval head_greedy --draft "$HEAD" --gamma ${GAMMAS:-2 4 6} ;;
        lookup) run_eval lookup_greedy --draft prompt-lookup --gamma 4 ;;
        t1) run_eval head_t1 --draft "$HEAD" --gamma 4 --temperature 1.0 ;;
        compiled) run_eval head_compiled --draft "$HEAD" --gamma 4 --compile ;;
        *) echo "gpu_check.sh: unknown head run '$run' (greedy, lookup, t1 or compiled)" >&2 ;;
        esac
    done
    ;;
*)
    echo "gpu_check.sh: unknown step '$STEP' (tests, decode or head)" >&2; exit 2 ;;
esac
