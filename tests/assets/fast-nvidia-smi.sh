#!/bin/sh
# A fast stand-in for nvidia-smi in stress tests: replays CSV that the real fake
# (gpuclaim.sim.fake_nvidia_smi) recorded for this node, so racing claimers do not spend
# their time starting Python. Usage: fast-nvidia-smi.sh DIR --query-gpu=... | --query-compute-apps=...
dir=$1
shift
case "$1" in
  --query-gpu=*) exec cat "$dir/$GPUCLAIM_NODE.gpus.csv" ;;
  --query-compute-apps=*) exec cat "$dir/$GPUCLAIM_NODE.apps.csv" ;;
  *) echo "fast-nvidia-smi: unsupported arguments: $*" >&2; exit 2 ;;
esac
