#!/bin/sh
# A fast stand-in for nvidia-smi in stress tests: replays the XML that the real fake
# (gpuclaim.sim.fake_nvidia_smi) recorded for this node, so racing claimers do not spend
# their time starting Python. Usage: fast-nvidia-smi.sh DIR -q -x
dir=$1
shift
if [ "$*" = "-q -x" ]; then exec cat "$dir/$GPUCLAIM_NODE.q.xml"; fi
echo "fast-nvidia-smi: unsupported arguments: $*" >&2
exit 2
