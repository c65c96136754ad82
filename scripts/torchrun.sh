#!/bin/bash
# Multi-node training with torchrun: run this on every node, e.g. for 2 nodes of 8 GPUs:
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=node0 scripts/torchrun.sh -c configs/experiment/cifar10.yaml
#   NNODES=2 NODE_RANK=1 MASTER_ADDR=node0 scripts/torchrun.sh -c configs/experiment/cifar10.yaml
# Lightning detects torchrun (TorchElasticEnvironment) and takes ranks from it; the run folder is
# named after the rendezvous id (RDZV_ID), so give every node the same new RDZV_ID per run.
set -euo pipefail
NNODES=${NNODES:-1}
if [ "$NNODES" -gt 1 ]; then : "${RDZV_ID:?set RDZV_ID to the same new value on every node}"; fi
NPROC_PER_NODE=${NPROC_PER_NODE:-$(nvidia-smi -L | wc -l)}
exec "$(dirname "$0")/../.venv/bin/torchrun" \
  --nnodes "$NNODES" --nproc-per-node "$NPROC_PER_NODE" --node-rank "${NODE_RANK:-0}" \
  --rdzv-id "${RDZV_ID:-kiln-$(date +%Y%m%d-%H%M%S)}" --rdzv-backend c10d \
  --rdzv-endpoint "${MASTER_ADDR:-localhost}:${MASTER_PORT:-29500}" \
  -m kiln fit -c configs/trainer/ddp.yaml \
  --trainer.num_nodes "$NNODES" --trainer.devices "$NPROC_PER_NODE" "$@"
