#!/usr/bin/env bash
# The whole pipeline on the built-in shapes dataset, on CPU with 2 processes (gloo):
#   environment (.venv) -> dataset -> MALA-T Mask R-CNN: train, COCO box/mask AP, a picture
#                                   -> MALA-T UperNet:    train, mIoU, a picture
#                                   -> what the trained MALA attends to, against softmax and linear attention
# Environment: NPROC (processes, default 2), PORT (torchrun's port; default: a free one), RETRAIN=1 (train again even
# where a trained checkpoint exists).
# Each step's whole output goes to a log file in its work dir; the screen shows progress and the results.
set -euo pipefail
cd "$(dirname "$0")/.."

elapsed() { printf '%d:%02d' $((SECONDS / 60)) $((SECONDS % 60)); }  # minutes past 59 included (an mmcv build)
step() { printf '\n==== [%s] %s\n' "$(elapsed)" "$*"; }
# a step's output: all of it to the log, to the screen only progress, results and errors (COCO AP, which mmdet
# prints as a fraction, appears in the closing table as a percentage)
run_logged() {  # $1: log file; the rest: the command
    local log="$1"; shift
    mkdir -p "$(dirname "$log")"
    if ! "$@" 2>&1 | tee "$log" | { grep --line-buffered -E \
            'Iter\(train\) \[ *[0-9]*[05]0/|Iter\((val|test)\) \[ *[0-9]+/[0-9]+\] +aAcc|^wrote|: query max|^error' \
            | sed -u -E 's/^[0-9/]+ [0-9:]+ - mmengine - INFO - //; s/ +(base_lr|data_time|memory|time): [^ ]+//g' \
            || true; }; then
        grep -E -A3 'Error|Traceback' "$log" | tail -20 >&2
        echo "failed: $* (whole output: $log)" >&2
        exit 1
    fi
}

step "environment (the first run builds mmcv: 15-30 minutes on 2 cores, with a progress line a minute)"
bash tools/setup_env.sh
export PYTHON="$PWD/.venv/bin/python"
# the demo trains on CPU by design, so the launchers accept .venv's CPU torch on a machine with GPUs too
export MALA_MM_ALLOW_CPU=1
NPROC="${NPROC:-2}"
DATA=data/builtin
IMAGE="$DATA/images/validation/000003.jpg"

step "built-in dataset at $DATA"
run_logged work_dirs/demo/dataset.log "$PYTHON" tools/make_builtin_dataset.py --out "$DATA"
tail -1 work_dirs/demo/dataset.log

run_task() {  # $1: config, $2: what training takes; trains (or reuses), evaluates and draws
    local config="$1" name work checkpoint
    name="$(basename "$config" .py)"
    work="work_dirs/$name"
    if [[ -z "${RETRAIN:-}" && -f "$work/last_checkpoint" && -f "$(cat "$work/last_checkpoint")" ]]; then
        step "$name: reusing $(cat "$work/last_checkpoint") (RETRAIN=1 trains again)"
    else
        step "$name: training on $NPROC CPU processes ($2 on 2 idle cores)"
        rm -rf "$work"
        run_logged "$work/train.log" tools/dist_train.sh "$config" "$NPROC"
    fi
    checkpoint="$(cat "$work/last_checkpoint")"
    step "$name: evaluating $checkpoint on the validation set"
    run_logged "$work/test.log" tools/dist_test.sh "$config" "$checkpoint" "$NPROC"
    step "$name: drawing the annotation and the prediction of $IMAGE"
    run_logged "$work/demo.log" "$PYTHON" tools/demo.py "$IMAGE" "$config" "$checkpoint" \
        --out "$work/demo.png" --with-gt --scale 4 --score-thr 0.5
}

DET=configs/detection/mask_rcnn_mala_t_builtin.py
SEG=configs/segmentation/upernet_mala_t_builtin.py
run_task "$DET" "about 8 minutes"
run_task "$SEG" "about 4 minutes"

step "what the trained MALA-T attends to (stage 0, a query on the upper right star)"
INSIGHT=work_dirs/demo/attention_insight
run_logged work_dirs/demo/attention_insight.log "$PYTHON" tools/analysis/attention_insight.py "$IMAGE" \
    --checkpoint "$(cat work_dirs/upernet_mala_t_builtin/last_checkpoint)" --stage 0 --query 37 96 \
    --out-dir "$INSIGHT"

step "done"
"$PYTHON" - "work_dirs/$(basename "$DET" .py)/test.log" "work_dirs/$(basename "$SEG" .py)/test.log" <<'PYCODE'
import re, sys
rows = [('Mask R-CNN MALA-T', sys.argv[1], [('box AP', 'coco/bbox_mAP', 100), ('box AP50', 'coco/bbox_mAP_50', 100),
                                            ('mask AP', 'coco/segm_mAP', 100), ('mask AP50', 'coco/segm_mAP_50', 100)]),
        ('UperNet MALA-T', sys.argv[2], [('mIoU', 'mIoU', 1), ('aAcc', 'aAcc', 1), ('mAcc', 'mAcc', 1)])]
print(f'{"model":<20}{"metric":<12}{"value (%)":>10}')
for model, log, metrics in rows:
    text = open(log).read()
    for label, key, scale in metrics:
        value = float(re.findall(rf'{re.escape(key)}: (-?[0-9.]+)', text)[-1]) * scale
        print(f'{model:<20}{label:<12}{value:>10.1f}')
PYCODE
echo "pictures:"
for config in "$DET" "$SEG"; do echo "    work_dirs/$(basename "$config" .py)/demo.png (annotation | prediction)"; done
for picture in "$INSIGHT"/*.png; do echo "    $picture"; done
echo "logs: work_dirs/*/train.log, test.log; total: $(elapsed)"
