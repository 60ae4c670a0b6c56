#!/usr/bin/env bash
# One node, 8 GPUs: pretraining of one 0.6B grid member (the study's recipe, trainer/configs/0.6b.json).
# DATA is a folder made by `headprobe data prepare ... --tokenizer your-64k-tokenizer.json`.
set -euo pipefail
MEMBER=${MEMBER:-0.6b-d512}
DATA=${DATA:?set DATA to a prepared data folder}
torchrun --standalone --nproc_per_node=8 -m headprobe train \
  --stage pt --preset "$MEMBER" --data "$DATA" --out "runs/$MEMBER/pt" \
  --tokens 100000000000 --seq-len 4096 --batch-size 256 --micro-batch-size 4 \
  --lr 3e-4 --schedule wsd --decay-fraction 0.2 --warmup-steps 2000 \
  --parallel fsdp --compile --save-every 1000 --keep 3 --resume

# then 262K continual pretraining (add --freeze attention for the frozen-projection run)
torchrun --standalone --nproc_per_node=8 -m headprobe train \
  --stage cpt --init "runs/$MEMBER/pt/final" --data "$DATA" --out "runs/$MEMBER/cpt" \
  --tokens 8000000000 --seq-len 262144 --batch-size 8 --micro-batch-size 1 \
  --lr 1e-4 --warmup-steps 200 --rope-theta-full 1000000 \
  --parallel fsdp --activation-checkpointing --compile --save-every 200 --resume
