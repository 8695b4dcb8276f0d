#!/usr/bin/env bash
# GRPO on SkyRL with the deepanalyze env: joins (or starts) a Ray cluster, then runs
# recipes/skyrl_grpo.yaml with this node's Python (>= 3.12, with `.[skyrl,kernel]` and skyrl[fsdp]).
#
# One node, 8 GPUs:
#   MODEL=/models/coldstart JUDGE_URL=http://judge-host:8001/v1 JUDGE_MODEL=qwen-judge recipes/skyrl_grpo.sh
# Two nodes: on the head node    ray start --head --num-gpus 8 --port 6379
#            on each other node  ray start --address HEAD_IP:6379 --num-gpus 8
#            then on the head    NODES=2 MODEL=… JUDGE_URL=… JUDGE_MODEL=… recipes/skyrl_grpo.sh
# Extra arguments are recipe overrides, e.g.  skyrl.trainer.train_batch_size=128  env.max_turns=20
set -euo pipefail
cd "$(dirname "$0")/.."

: "${MODEL:?set MODEL to the policy checkpoint folder}"
: "${JUDGE_URL:?set JUDGE_URL to the judge endpoint, e.g. http://judge-host:8001/v1}"
: "${JUDGE_MODEL:?set JUDGE_MODEL to the judge model name the endpoint serves}"
NODES=${NODES:-1}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
PYTHON=${PYTHON:-python}

if ! ray status >/dev/null 2>&1; then
  ray start --head --num-gpus "$GPUS_PER_NODE" --port 6379   # SkyRL's ray.init() attaches to it
fi

exec "$PYTHON" -m deepanalyze_env.cli train recipes/skyrl_grpo.yaml \
  "model=$MODEL" \
  "env.judge.base_url=$JUDGE_URL" \
  "env.judge.model=$JUDGE_MODEL" \
  "skyrl.trainer.placement.policy_num_nodes=$NODES" \
  "skyrl.trainer.placement.ref_num_nodes=$NODES" \
  "skyrl.trainer.placement.policy_num_gpus_per_node=$GPUS_PER_NODE" \
  "skyrl.trainer.placement.ref_num_gpus_per_node=$GPUS_PER_NODE" \
  "skyrl.generator.inference_engine.num_engines=$((NODES * GPUS_PER_NODE))" \
  "$@"
