#!/bin/bash
# DDP with torchrun, on GPU or CPU nodes: run this on every node from the project folder, e.g. for 2 nodes:
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=node0 RDZV_ID=run7 scripts/torchrun.sh -c configs/experiment/cifar10.yaml
#   NNODES=2 NODE_RANK=1 MASTER_ADDR=node0 RDZV_ID=run7 scripts/torchrun.sh -c configs/experiment/cifar10.yaml
# One process per GPU torch sees (configs/trainer/ddp.yaml), or NPROC_PER_NODE processes on the CPU where it
# sees none (configs/trainer/ddp_cpu.yaml, 2 by default); PRESET=<file> for another preset. Every argument goes
# to `kiln fit`. Lightning takes the ranks from torchrun (TorchElasticEnvironment); the run folder is named after
# the rendezvous id (RDZV_ID), so give every node the same new RDZV_ID per run.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
NNODES=${NNODES:-1}
venv=${VENV:-$here/.venv}  # the environment `make install` made; VENV=<folder> for another one with kiln
[ -x "$venv/bin/torchrun" ] || { echo "scripts/torchrun.sh: no $venv/bin/torchrun: run 'make install' in the project folder first, or set VENV to an environment with kiln" >&2; exit 1; }
if [ "$NNODES" -gt 1 ]; then : "${RDZV_ID:?set RDZV_ID to the same new value on every node}"; fi
gpus=$("$venv/bin/python" -c "import torch; print(torch.cuda.device_count())")
if [ "$gpus" -gt 0 ]; then
  PRESET=${PRESET:-$here/configs/trainer/ddp.yaml}
  NPROC_PER_NODE=${NPROC_PER_NODE:-$gpus}
else
  PRESET=${PRESET:-$here/configs/trainer/ddp_cpu.yaml}
  NPROC_PER_NODE=${NPROC_PER_NODE:-2}
fi
exec "$venv/bin/torchrun" \
  --nnodes "$NNODES" --nproc-per-node "$NPROC_PER_NODE" --node-rank "${NODE_RANK:-0}" \
  --rdzv-id "${RDZV_ID:-kiln-$(date +%Y%m%d-%H%M%S)}" --rdzv-backend c10d \
  --rdzv-endpoint "${MASTER_ADDR:-localhost}:${MASTER_PORT:-29500}" \
  -m kiln fit -c "$PRESET" --trainer.num_nodes "$NNODES" --trainer.devices "$NPROC_PER_NODE" "$@"
