#!/usr/bin/env bash
# snapshot.sh — export the committed tree (HEAD) into .snap/ (ignored), so a GPU run tests exactly
# what is committed, not files being edited in the working tree. Carry .snap and .deps.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
rm -rf "$root/.snap" && mkdir -p "$root/.snap"
git -C "$root" archive HEAD | tar -x -C "$root/.snap"
git -C "$root" rev-parse --short HEAD > "$root/.snap/REVISION"
echo "snapshot of $(cat "$root/.snap/REVISION") in .snap"
