#!/bin/sh
# One FastDecode R-worker per MPI rank, registering with an S-worker that waits for them (docs/CLUSTER.md):
#   mpirun -np N --map-by ppr:1:node --bind-to none examples/mpi/rworker.sh tcp://SWORKER_HOST:5600 \
#     --threads 16 --memory-gb 64
# Rank r (Open MPI's OMPI_COMM_WORLD_RANK; PMIX_RANK, PMI_RANK or SLURM_PROCID under other launchers) listens on
# tcp://RWORKER_HOST:(RWORKER_PORT + r) (defaults 0.0.0.0 and 5555) and announces that port at this host's name (at
# RWORKER_HOST itself when it is not a wildcard), named rworker<r>@<host>. Every rank exits when the run's session
# ends (--serve-once). More arguments go to fd-rworker. BIN (default: build/default/bin of this checkout) holds it.
# tests/python/test_cluster_launchers.py runs it under Open MPI's mpirun on one host.
set -eu
if [ $# -lt 1 ]; then
  echo "usage: mpirun -np N $0 tcp://SWORKER_HOST:PORT [fd-rworker arguments]" >&2
  exit 2
fi
register=$1
shift
rank=${OMPI_COMM_WORLD_RANK:-${PMIX_RANK:-${PMI_RANK:-${SLURM_PROCID:-}}}}
case $rank in
  '' | *[!0-9]*)
    echo "$0: no MPI rank in the environment (OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK or SLURM_PROCID): start it with mpirun" >&2
    exit 2 ;;
esac
BIN=${BIN:-$(cd "$(dirname "$0")/../.." && pwd)/build/default/bin}
port=$((${RWORKER_PORT:-5555} + rank))
exec "$BIN/fd-rworker" --listen "tcp://${RWORKER_HOST:-0.0.0.0}:$port" --register "$register" --serve-once \
  --name "rworker$rank@$(hostname)" "$@"
