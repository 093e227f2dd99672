#!/usr/bin/env bash
# Submit the streaming benchmark matrix, sources x modes x decodes, as isolated single-GPU SLURM
# jobs: an OOM in one configuration ends only that job and is reported in that job's directory.
#
#   slurm/run_streaming_matrix.sh                      # 4 x 2 x 2 = 16 jobs, one after another
#   SOURCES=local DECODES=cpu SERIAL=0 slurm/run_streaming_matrix.sh
#
# Environment (lists take spaces or commas):
#   SOURCES      hub bucket warmed_bucket local     (default: all four)
#   MODES        single sarm                        (default: both)
#   DECODES      cpu cuda                           (default: both)
#   NUM_WORKERS  DataLoader workers, default 8; cuda jobs use at most 4
#   POOL_SIZE    episode pool size, default 16; cuda jobs use at most 8
#   ACCOUNT, PARTITION   passed to sbatch when set
#   TIME_LIMIT   per job, default 01:00:00
#   OUTPUT_DIR   default benchmarks/streaming/results/matrix-<date>; one folder per job inside
#   DATASET      passed to the benchmark as --dataset when set
#   SERIAL       1 (default): chain jobs with --dependency=afterany so one runs at a time and
#                they do not share the network; 0: submit them all to run in parallel
#   CONDA_ENV    run each job through `conda run --no-capture-output -n CONDA_ENV`
#   SBATCH       the sbatch to call, default `sbatch`
#
# Each job folder gets slurm-<id>.out, job.log, exit_status and status (ok | failed | oom); see
# _matrix_job.sh. Afterwards: python benchmarks/streaming/summarize_results.py OUTPUT_DIR
set -euo pipefail

VALID_SOURCES="hub bucket warmed_bucket local"
VALID_MODES="single sarm"
VALID_DECODES="cpu cuda"
# GPU decoding holds decoder state and frames in GPU memory per worker, so fewer of each fit.
CUDA_MAX_WORKERS=4
CUDA_MAX_POOL_SIZE=8

die() {
    echo "run_streaming_matrix.sh: $*" >&2
    exit 2
}

# check_words NAME "VALUE" "VALID": every word of VALUE must be one of VALID.
check_words() {
    local name=$1 value=$2 valid=$3 word
    [[ -n ${value// /} ]] || die "$name is empty; valid values are: $valid"
    for word in $value; do
        [[ " $valid " == *" $word "* ]] || die "invalid $name value '$word'; valid values are: $valid"
    done
}

check_positive_int() {
    [[ $2 =~ ^[1-9][0-9]*$ ]] || die "$1 must be a positive integer, got '$2'"
}

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo_root=$(cd "$script_dir/.." && pwd)

sources=${SOURCES:-$VALID_SOURCES}
modes=${MODES:-$VALID_MODES}
decodes=${DECODES:-$VALID_DECODES}
sources=${sources//,/ } modes=${modes//,/ } decodes=${decodes//,/ }
num_workers=${NUM_WORKERS:-8}
pool_size=${POOL_SIZE:-16}
time_limit=${TIME_LIMIT:-01:00:00}
serial=${SERIAL:-1}
sbatch=${SBATCH:-sbatch}
output_dir=${OUTPUT_DIR:-$repo_root/benchmarks/streaming/results/matrix-$(date +%Y%m%d-%H%M%S)}

check_words SOURCES "$sources" "$VALID_SOURCES"
check_words MODES "$modes" "$VALID_MODES"
check_words DECODES "$decodes" "$VALID_DECODES"
check_positive_int NUM_WORKERS "$num_workers"
check_positive_int POOL_SIZE "$pool_size"
[[ $serial == 0 || $serial == 1 ]] || die "invalid SERIAL value '$serial'; valid values are: 0 1"
[[ -z ${CONDA_ENV:-} || ${CONDA_ENV} =~ ^[A-Za-z0-9_.+-]+$ ]] ||
    die "invalid CONDA_ENV value '${CONDA_ENV}'; expected an environment name"
command -v "$sbatch" > /dev/null || die "sbatch not found (SBATCH=$sbatch)"

mkdir -p "$output_dir"
output_dir=$(cd "$output_dir" && pwd)  # jobs run with --chdir=repo root, so no relative paths
manifest=$output_dir/jobs.tsv
printf 'name\tjob_id\tdependency\n' > "$manifest"

common=(--parsable --nodes=1 --ntasks=1 --gres=gpu:1 "--time=$time_limit" "--chdir=$repo_root")
[[ -n ${ACCOUNT:-} ]] && common+=("--account=$ACCOUNT")
[[ -n ${PARTITION:-} ]] && common+=("--partition=$PARTITION")

launcher=()
[[ -n ${CONDA_ENV:-} ]] && launcher=(conda run --no-capture-output -n "$CONDA_ENV")

previous=""
count=0
for source in $sources; do
    for mode in $modes; do
        for decode in $decodes; do
            workers=$num_workers pool=$pool_size
            if [[ $decode == cuda ]]; then
                ((workers > CUDA_MAX_WORKERS)) && workers=$CUDA_MAX_WORKERS
                ((pool > CUDA_MAX_POOL_SIZE)) && pool=$CUDA_MAX_POOL_SIZE
            fi
            name=$source-$mode-$decode
            job_dir=$output_dir/$name
            mkdir -p "$job_dir"  # sbatch --output needs the folder to exist before the job starts

            # ${a[@]+...}: an empty array under set -u is an error in bash before 4.4.
            benchmark=(${launcher[@]+"${launcher[@]}"} python benchmarks/streaming/benchmark_streaming.py
                --source "$source" --mode "$mode" --decode "$decode" --full --loader dataloader
                --num-workers "$workers" --pool-size "$pool" --output-dir "$job_dir")
            [[ -n ${DATASET:-} ]] && benchmark+=(--dataset "$DATASET")

            flags=("${common[@]}" "--job-name=$name" "--cpus-per-task=$((workers + 2))"
                "--output=$job_dir/slurm-%j.out")
            dependency=none
            if [[ $serial == 1 && -n $previous ]]; then
                # afterany, not afterok: a failed or OOM configuration must not cancel the rest.
                dependency=afterany:$previous
                flags+=("--dependency=$dependency")
            fi

            # --parsable prints "id" or "id;cluster".
            reply=$("$sbatch" "${flags[@]}" "$script_dir/_matrix_job.sh" \
                "$job_dir" "$source" "$mode" "$decode" -- "${benchmark[@]}") ||
                { echo "run_streaming_matrix.sh: sbatch failed for $name" >&2; exit 1; }
            job_id=${reply%%;*}
            [[ $job_id =~ ^[0-9]+$ ]] ||
                { echo "run_streaming_matrix.sh: unexpected sbatch reply for $name: '$reply'" >&2; exit 1; }

            printf '%-28s job %-10s dependency %s\n' "$name" "$job_id" "$dependency"
            printf '%s\t%s\t%s\n' "$name" "$job_id" "$dependency" >> "$manifest"
            previous=$job_id
            count=$((count + 1))
        done
    done
done

echo "submitted $count jobs; results and per-job status in $output_dir (list: $manifest)"
echo "when they finish: python benchmarks/streaming/summarize_results.py $output_dir"
