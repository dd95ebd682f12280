#!/usr/bin/env bash
# Set a TPU VM up for the lab and measure the chip's catalogue (benchmarks/chip_catalogue.py measure).
#
#   bash benchmarks/chip/run_on_tpu.sh OUT_DIR [NAMES] [DEADLINE_S]
#
# NAMES: comma-separated configuration names (default all); DEADLINE_S: start none after this many
# seconds (a command on a lent chip may run 10 minutes). Uses the VM's own JAX and libtpu (the lab's
# source runs on JAX 0.10 too) and installs the rest of what the lab imports into /tmp/site, after
# the VM's JAX on PYTHONPATH; PIP_INDEX_URL (default: the lent chip's local index) says from where.
# The measured lines go to OUT_DIR/measured.jsonl, each program's HLO to OUT_DIR/hlo.tar (unpacked
# into benchmarks/chip/hlo/ here: `chip_catalogue.py recount` reads them).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:?OUT_DIR}
source benchmarks/chip/setup_tpu.sh
mkdir -p "$out/hlo"
"$py" benchmarks/chip_catalogue.py measure --out "$out/hlo" ${2:+--only "$2"} --deadline-s "${3:-1e9}" \
  ${CHIP_IN_PROCESS:+--in-process} --repeats "${CHIP_REPEATS:-10}"
mv "$out/hlo/measured.jsonl" "$out/measured.jsonl"
tar -C "$out" -cf "$out/hlo.tar" hlo && rm -r "$out/hlo"
