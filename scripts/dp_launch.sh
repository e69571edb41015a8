#!/usr/bin/env bash
# Starts N data-parallel ranks of `fp4lab train` on one host without MPI: NCCL
# with a file rendezvous (train/dist/launch.hpp), rank r on GPU r, and waits for
# all of them. Rank 0's output goes to stdout/stderr; rank r > 0's to
# $LOGDIR/rank<r>.log (LOGDIR default: a temporary directory, kept on failure).
#
#   scripts/dp_launch.sh N FP4LAB CONFIG [train arguments ...]
# Exit status: 0 when every rank exited 0, else the first non-zero status.
# (With MPI installed, `mpirun -np N fp4lab train CONFIG ...` does the same.)
set -uo pipefail
if [ $# -lt 3 ]; then sed -n '2,9p' "$0"; exit 2; fi
n=$1 fp4lab=$2 config=$3
shift 3
case "$n" in ''|*[!0-9]*) echo "dp_launch.sh: N must be a positive integer, got '$n'" >&2; exit 2 ;; esac
[ "$n" -ge 1 ] || { echo "dp_launch.sh: N must be at least 1" >&2; exit 2; }
if [ "$n" -eq 1 ]; then exec "$fp4lab" train "$config" "$@"; fi
logdir=${LOGDIR:-$(mktemp -d)}
mkdir -p "$logdir"
rv=$(mktemp -u "${TMPDIR:-/tmp}/fp4lab_rendezvous.XXXXXX")
pids=()
for ((r = n - 1; r >= 0; r--)); do
  if [ "$r" -eq 0 ]; then
    "$fp4lab" train "$config" --rendezvous "file:$rv" --rank 0 --world "$n" "$@" &
  else
    "$fp4lab" train "$config" --rendezvous "file:$rv" --rank "$r" --world "$n" "$@" >"$logdir/rank$r.log" 2>&1 &
  fi
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do
  wait "$p"; s=$?
  [ "$status" -eq 0 ] && status=$s
done
if [ "$status" -ne 0 ]; then
  echo "dp_launch.sh: a rank failed (status $status); other ranks' logs in $logdir" >&2
elif [ -z "${LOGDIR:-}" ]; then
  rm -rf "$logdir"
fi
rm -f "$rv"
exit $status
