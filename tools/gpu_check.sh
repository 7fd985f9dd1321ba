#!/usr/bin/env bash
# GPU certification check (issue 36, item 7). NEVER RUN ON A GPU YET: written for one CUDA machine, dry-run on
# the CPU only. At most 10 minutes on one GPU (--budget-s, default 570 s, bounds all steps together; each step has
# its own timeout too). Writes ONE JSON file (--out, default gpu_check.json): nvidia-smi / torch.cuda facts and,
# per step, name, command, status (passed / failed / skipped with a reason / dry-run), wall seconds and the
# figures parsed from its output. Steps and their commands: tools/gpu_check.py (the logic); docs/distributed.md,
# "GPU certification".
#
#   tools/gpu_check.sh --dry-run --out /tmp/gpu_check.json   # on the CPU: lists the steps and commands
#   tools/gpu_check.sh --out gpu_check.json                  # on a GPU machine, from the repository root
#   tools/gpu_check.sh --only rl_hf_cuda fsdp2_all_gpus      # a subset
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here/.."
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec "${PYTHON:-python}" "$here/gpu_check.py" "$@"
