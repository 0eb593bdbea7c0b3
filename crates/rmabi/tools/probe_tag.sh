#!/bin/sh
# Print the gcc layout probe for one open-gpu-kernel-modules tag.
#   tools/probe_tag.sh 595.45.04 595      # tag, RMABI_FAMILY (550, 580, 590 or 595)
# REPO overrides the git dir of NVIDIA/open-gpu-kernel-modules.
set -eu
tag=${1:?usage: probe_tag.sh TAG FAMILY}
fam=${2:?usage: probe_tag.sh TAG FAMILY}
repo=${REPO:-/work/.mirror/NVIDIA+open-gpu-kernel-modules/repo}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git --git-dir "$repo" archive "$tag" src/common/sdk/nvidia/inc \
    src/nvidia/arch/nvalloc/unix/include kernel-open/common/inc | tar -x -C "$tmp"
gcc -std=gnu11 -DRMABI_FAMILY="$fam" \
    -I"$tmp/src/common/sdk/nvidia/inc" -I"$tmp/src/common/sdk/nvidia/inc/ctrl" \
    -I"$tmp/kernel-open/common/inc" -I"$tmp/src/nvidia/arch/nvalloc/unix/include" \
    -o "$tmp/probe" "$here/probe.c"
"$tmp/probe"
