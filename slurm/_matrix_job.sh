#!/bin/sh
# Body of one streaming-benchmark matrix job, submitted by run_streaming_matrix.sh.
#
#   _matrix_job.sh JOB_DIR SOURCE MODE DECODE -- COMMAND [ARG...]
#
# Runs COMMAND from the directory sbatch was given (--chdir), copies its output to JOB_DIR/job.log
# and records how it ended, so that each configuration reports for itself even when the matrix
# runs unattended:
#   JOB_DIR/exit_status  the command's exit code
#   JOB_DIR/status       ok | failed | oom
#   JOB_DIR/failed.json  on failure, when the command left no result JSON of its own, a record
#                        that summarize_results.py lists with the failed runs
# The job exits with the command's code, so sacct and --dependency=afterok see the failure too.
#
# There are no #SBATCH lines here: run_streaming_matrix.sh passes every option as an sbatch flag.
# POSIX sh on purpose (clusters run batch scripts with whatever /bin/sh is, often dash): no
# pipefail, no arrays, no [[ ]].
set -eu

usage() {
    echo "usage: _matrix_job.sh JOB_DIR SOURCE MODE DECODE -- COMMAND [ARG...]" >&2
    exit 2
}

[ "$#" -ge 6 ] || usage
job_dir=$1 source=$2 mode=$3 decode=$4
[ "$5" = "--" ] || usage
shift 5

mkdir -p "$job_dir"
rm -f "$job_dir/exit_status" "$job_dir/status" "$job_dir/failed.json"
echo "[$(date '+%Y-%m-%d %H:%M:%S')] $source/$mode/$decode on $(hostname) job ${SLURM_JOB_ID:-none}: $*"

# Without pipefail a pipeline's status is tee's, so the command's own code travels through a file.
set +e
{ "$@" 2>&1; echo "$?" > "$job_dir/exit_status"; } | tee "$job_dir/job.log"
set -e
code=$(cat "$job_dir/exit_status" 2>/dev/null || echo 1)

if [ "$code" -eq 0 ]; then
    status=ok
elif [ "$code" -eq 137 ] || grep -Eqi 'out of memory|MemoryError|oom-kill' "$job_dir/job.log"; then
    # 137 = SIGKILL, which is how the cgroup OOM killer ends a step.
    status=oom
else
    status=failed
fi
echo "$status" > "$job_dir/status"
echo "[$(date '+%Y-%m-%d %H:%M:%S')] $source/$mode/$decode: $status (exit $code)"

if [ "$status" != ok ] && [ -z "$(find "$job_dir" -name '*.json' ! -name failed.json)" ]; then
    # Last lines of the log as a JSON string: quotes and backslashes swapped for harmless
    # characters rather than escaped, since this is for a human reading the summary.
    error=$(tail -n 5 "$job_dir/job.log" | tr -d '\000-\011\013-\037' | tr '"' "'" | tr "\\\\" / |
        awk '{ printf "%s%s", sep, $0; sep = "\\n" }')
    printf '{"source": "%s", "mode": "%s", "decode": "%s", "status": "%s", "exit_code": %s, "error": "%s"}\n' \
        "$source" "$mode" "$decode" "$status" "$code" "exit $code: $error" > "$job_dir/failed.json"
fi
exit "$code"
