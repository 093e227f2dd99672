#!/bin/sh
#SBATCH --job-name=episodestream-robocasa
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=64
#SBATCH --time=12:00:00
#SBATCH --output=slurm-%x-%j.out
#
# Multi-node training streamed from a LeRobot v3.0 dataset (RoboCasa by default in the example):
# one task per node, each running `accelerate launch` for that node's GPUs.
#
#   sbatch slurm/train_streaming_robocasa.sh [ARG...]            # from the repository root
#   sbatch --nodes=4 slurm/train_streaming_robocasa.sh --max-steps 1000
#
# ARGs go to examples/scaling/train_streaming_multinode.py after the ones below. Environment:
#   DATASET        passed as --dataset when set
#   OUTPUT_DIR     passed as --output-dir, default outputs/train_streaming_robocasa/<job id>
#   CONDA_ENV      run each node's launcher through `conda run --no-capture-output -n CONDA_ENV`
#   GPUS_PER_NODE  default $SLURM_GPUS_ON_NODE, else 8; keep it equal to --gpus-per-node
#   MASTER_PORT    rendezvous port on the first node, default 29500
#
# POSIX sh on purpose: batch scripts often run under dash.
set -eu

die() {
    echo "train_streaming_robocasa.sh: $*" >&2
    exit 2
}

: "${SLURM_JOB_NODELIST:?submit this with sbatch (or run it inside salloc)}"
: "${SLURM_NNODES:?submit this with sbatch (or run it inside salloc)}"
TRAIN_SCRIPT=examples/scaling/train_streaming_multinode.py
# sbatch runs a copy of this file from its spool, so the repository is found from the cwd.
[ -f "$TRAIN_SCRIPT" ] || die "$TRAIN_SCRIPT not found in $(pwd); submit from the repository root"

GPUS_PER_NODE=${GPUS_PER_NODE:-${SLURM_GPUS_ON_NODE:-8}}
MASTER_PORT=${MASTER_PORT:-29500}
OUTPUT_DIR=${OUTPUT_DIR:-outputs/train_streaming_robocasa/${SLURM_JOB_ID:-local}}
CONDA_ENV=${CONDA_ENV:-}
case $GPUS_PER_NODE in '' | *[!0-9]* | 0) die "GPUS_PER_NODE must be a positive integer, got '$GPUS_PER_NODE'" ;; esac
case $MASTER_PORT in '' | *[!0-9]*) die "MASTER_PORT must be a port number, got '$MASTER_PORT'" ;; esac

MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
[ -n "$MASTER_ADDR" ] || die "no host name in SLURM_JOB_NODELIST='$SLURM_JOB_NODELIST'"
export MASTER_ADDR MASTER_PORT GPUS_PER_NODE CONDA_ENV

if [ -n "${DATASET:-}" ]; then
    set -- --dataset "$DATASET" "$@"
fi
set -- "$TRAIN_SCRIPT" --output-dir "$OUTPUT_DIR" "$@"

echo "$SLURM_NNODES nodes x $GPUS_PER_NODE GPUs, rendezvous $MASTER_ADDR:$MASTER_PORT: $*"
# The quoted script is expanded by each task, where SLURM_PROCID is that node's rank; expanded
# here, every node would claim rank 0. --kill-on-bad-exit: a node that dies must not leave the
# others waiting in a collective until the time limit.
# shellcheck disable=SC2016
srun --kill-on-bad-exit=1 sh -c '
    set -- launch --multi_gpu --num_machines "$SLURM_NNODES" \
        --num_processes "$((SLURM_NNODES * GPUS_PER_NODE))" --machine_rank "$SLURM_PROCID" \
        --main_process_ip "$MASTER_ADDR" --main_process_port "$MASTER_PORT" "$@"
    if [ -n "$CONDA_ENV" ]; then
        exec conda run --no-capture-output -n "$CONDA_ENV" accelerate "$@"
    fi
    exec accelerate "$@"' sh "$@"
