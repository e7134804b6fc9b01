#!/bin/bash
# mca_loops.sh FILE.s [MIN] : llvm-mca's throughput estimate for every loop of an assembly file with at
# least MIN (default 8) multiply-add instructions (vpmaddubsw / vpdpbusd): label, their count, stack
# references, cycles per iteration. MCPU selects the model (default znver3; icelake-server for an
# AVX-512 CPU model: LLVM 14 has no Zen 4). Make FILE.s with setup.py's flags, e.g.
#   gcc -std=gnu11 -O3 -fno-strict-aliasing -fPIC -Icsrc/include -Icsrc -Icsrc/kernels/x86 \
#       -S csrc/kernels/x86/gemm_q32_avx512_vnni.c -o /tmp/v.s
#   MCPU=icelake-server tools/mca_loops.sh /tmp/v.s 16
# A model, not a measurement: use it to compare loops, and time on the CPU before keeping a change.
set -euo pipefail
f=$1; mn=${2:-8}; tmp=$(mktemp); trap 'rm -f "$tmp"' EXIT
awk '/^\.L[0-9]+:/{if (n) print lbl, n; lbl=$1; n=0} /vpmaddubsw|vpdpbusd/{n++} END{if (n) print lbl, n}' "$f" |
while read -r lbl n; do
    [ "$n" -ge "$mn" ] || continue
    awk -v L="$lbl" '$1==L{p=1; next} p && /^\.L[0-9]+:/{exit} p' "$f" | grep -v '^\s*\.' > "$tmp" || true
    st=$(grep -c 'rsp)' "$tmp" || true)
    cyc=$(llvm-mca -mcpu="${MCPU:-znver3}" -iterations=200 "$tmp" 2>/dev/null | awk '/Total Cycles/{print $3 / 200}')
    echo "${lbl%:} madds=$n stackrefs=$st cycles/iter=$cyc"
done
