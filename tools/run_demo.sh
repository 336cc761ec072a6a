#!/usr/bin/env bash
# The whole pipeline on the built-in shapes dataset, on CPU with 2 processes (gloo), in about 10 minutes:
#   environment (.venv) -> dataset -> MALA-T Mask R-CNN: train, COCO bbox/segm AP, a picture
#                                   -> MALA-T UperNet:    train, mIoU, a picture
# Environment: NPROC (processes, default 2), PORT (torchrun's port, default 29500).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==== [%4ds] %s\n' "$SECONDS" "$*"; }

step "environment"
bash tools/setup_env.sh
export PYTHON="$PWD/.venv/bin/python"
NPROC="${NPROC:-2}"
DATA=data/builtin
IMAGE="$DATA/images/validation/000003.jpg"

step "built-in dataset"
"$PYTHON" tools/make_builtin_dataset.py --out "$DATA"

run_task() {  # $1: config; trains, evaluates and draws; the work dir is work_dirs/<config name>
    local config="$1" name work checkpoint
    name="$(basename "$config" .py)"
    work="work_dirs/$name"
    step "$name: training on $NPROC CPU processes"
    tools/dist_train.sh "$config" "$NPROC"
    checkpoint="$(cat "$work/last_checkpoint")"
    step "$name: evaluating $checkpoint"
    tools/dist_test.sh "$config" "$checkpoint" "$NPROC" 2>&1 | tee "$work/test.log"
    step "$name: drawing the predictions on $IMAGE"
    # a detector trained for minutes from scratch is not confident yet: draw what it scores above 0.1
    "$PYTHON" tools/demo.py "$IMAGE" "$config" "$checkpoint" --out "$work/demo.png" --score-thr 0.1
}

DET=configs/detection/mask_rcnn_mala_t_builtin.py
SEG=configs/segmentation/upernet_mala_t_builtin.py
run_task "$DET"
run_task "$SEG"

step "done"
for config in "$DET" "$SEG"; do
    name="$(basename "$config" .py)"
    echo "$name:"
    grep -Eo '(coco/(bbox|segm)_mAP(_50)?|mIoU|mAcc|aAcc): [0-9.]+' "work_dirs/$name/test.log" | sed 's/^/    /'
    echo "    picture: work_dirs/$name/demo.png"
done
echo "total: ${SECONDS}s"
