#!/usr/bin/env bash
# fetch_deps.sh — unpack Debian's cmocka into .deps/cmocka so the GPU machine (no network) can build
# the cmocka tests: the folder travels with the tree (carry it). Run once on a machine with apt.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$root/.deps" && cd "$root/.deps"
apt-get download libcmocka0 libcmocka-dev
for f in libcmocka*.deb; do dpkg -x "$f" cmocka; done
rm -f libcmocka*.deb
ls cmocka/usr/lib/x86_64-linux-gnu/libcmocka.so* cmocka/usr/include/cmocka.h
