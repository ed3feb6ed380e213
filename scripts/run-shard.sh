#!/usr/bin/env bash
# One shard of a suite matrix, under the cluster's own scheduler: a Slurm array task or a Kubernetes indexed Job
# pod. The shard index and count come from the scheduler's variables; every shard records into the same MLflow
# store ($MLFLOW_TRACKING_URI, a shared server) under one matrix id, so `suite compare` / `suite report` of any
# shard's matrix run see the whole matrix.
#
#   Slurm:       SLURM_ARRAY_TASK_ID, SLURM_ARRAY_TASK_COUNT (SLURM_ARRAY_TASK_MIN if the array does not start
#                at 0), SLURM_ARRAY_JOB_ID (the matrix id: slurm-<job id>)
#   Kubernetes:  JOB_COMPLETION_INDEX (set by an Indexed Job), SUITE_SHARD_COUNT (= the Job's completions),
#                SUITE_MATRIX_ID (e.g. the Job's name)
#   both:        SUITE_ARGS (the matrix: "--workers 0,1,2 --loader cpu,device ..."), SUITE_OUTPUT_ROOT (default
#                ./suite-results), SUITE (the command, default: suite)
#
# Extra arguments are passed on to `suite run`.
set -euo pipefail

: "${MLFLOW_TRACKING_URI:?set MLFLOW_TRACKING_URI to the store every shard shares (an MLflow server)}"
if [[ -n "${SLURM_ARRAY_TASK_ID:-}" ]]; then
    index=$(( SLURM_ARRAY_TASK_ID - ${SLURM_ARRAY_TASK_MIN:-0} ))
    count=${SLURM_ARRAY_TASK_COUNT:?SLURM_ARRAY_TASK_COUNT is not set}
    matrix_id=${SUITE_MATRIX_ID:-slurm-${SLURM_ARRAY_JOB_ID:?SLURM_ARRAY_JOB_ID is not set}}
elif [[ -n "${JOB_COMPLETION_INDEX:-}" ]]; then
    index=$JOB_COMPLETION_INDEX
    count=${SUITE_SHARD_COUNT:?set SUITE_SHARD_COUNT to the completions of the Job}
    matrix_id=${SUITE_MATRIX_ID:?set SUITE_MATRIX_ID, e.g. to the name of the Job}
else
    echo "run-shard.sh: neither a Slurm array task (SLURM_ARRAY_TASK_ID) nor an indexed Job pod (JOB_COMPLETION_INDEX)" >&2
    exit 2
fi

# shellcheck disable=SC2086 # SUITE_ARGS is a list of options, split on purpose
exec ${SUITE:-suite} run --shard "$index/$count" --matrix-id "$matrix_id" \
    --output "${SUITE_OUTPUT_ROOT:-suite-results}/$matrix_id-shard$index" --no-progress ${SUITE_ARGS:-} "$@"
