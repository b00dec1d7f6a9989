#!/usr/bin/env bash
# Runs mpi_sum_test (kernels/comm_ranks.h's rank-order sum across real
# processes) as three ranks, so that the order of the adds is not
# commutative luck: once under `mpirun -np 3` (MPI), once as a torchrun-style
# launch (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT: TCP through rank 0).
# Without an mpirun that can start them (test_lib.sh's mpirun_usable) the
# first part says `SKIPPED: mpirun WHY` and the second still runs.
# Usage: mpi_sum_test.sh MPI_SUM_TEST
set -u
. "$(dirname "$0")/test_lib.sh"
BIN="$1"
[ -x "$BIN" ] || { echo "usage: mpi_sum_test.sh MPI_SUM_TEST"; exit 2; }
# root in CI; more ranks than cores; Open MPI's allocations outlive
# MPI_Finalize, so LeakSanitizer is off for the ranks (its other checks stay)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
if mpirun_usable 3 "the sum under mpirun -np 3"; then
  if ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" timeout 120 mpirun -np 3 "$BIN"; then
    ok "mpirun -np 3"
  else
    fail "mpirun -np 3"
  fi
fi

port=$(random_port)
pids=()
for r in 2 1 0; do
  WORLD_SIZE=3 RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port MOETUNE_RENDEZVOUS_TIMEOUT_S=60 \
    timeout 120 "$BIN" &
  pids+=($!)
done
for p in "${pids[@]}"; do
  wait "$p" || fail "torchrun-style launch: a rank exited $?"
done
[ "$failures" = 0 ] && ok "torchrun-style launch of 3 ranks"
exit $((failures > 0))
