#!/usr/bin/env bash
# Runs mpi_sum_test (kernels/comm_ranks.h's rank-order sum across real
# processes) under `mpirun -np 3`: three ranks, so that the order of the adds
# is not commutative luck.  Usage: mpi_sum_test.sh MPI_SUM_TEST
set -u
BIN="$1"
[ -x "$BIN" ] || { echo "usage: mpi_sum_test.sh MPI_SUM_TEST"; exit 2; }
command -v mpirun >/dev/null || { echo "FAIL mpirun not found: install openmpi-bin"; exit 1; }
# root in CI; more ranks than cores; Open MPI's allocations outlive
# MPI_Finalize, so LeakSanitizer is off for the ranks (its other checks stay)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" timeout 120 mpirun -np 3 "$BIN"
