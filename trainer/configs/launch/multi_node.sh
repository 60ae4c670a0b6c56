#!/usr/bin/env bash
# Run the same command on every node (4 nodes x 8 GPUs). HEAD is the first node's address.
set -euo pipefail
MEMBER=${MEMBER:-3b-k512v128}
DATA=${DATA:?set DATA to a prepared data folder on a shared filesystem}
HEAD=${HEAD:?set HEAD to the rendezvous host}
torchrun --nnodes=4 --nproc_per_node=8 --rdzv-id="$MEMBER-pt" --rdzv-backend=c10d --rdzv-endpoint="$HEAD:29500" \
  -m headprobe train --stage pt --preset "$MEMBER" --data "$DATA" --out "runs/$MEMBER/pt" \
  --tokens 100000000000 --seq-len 4096 --batch-size 256 --micro-batch-size 2 \
  --lr 2e-4 --schedule wsd --warmup-steps 2000 --parallel fsdp --compile --save-every 1000 --resume
