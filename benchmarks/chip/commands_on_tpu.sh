#!/usr/bin/env bash
# Set a TPU VM up for the lab and run every command and page on its chip
# (benchmarks/chip_commands.py): one JSON line each in OUT_DIR/commands.jsonl.
#
#   bash benchmarks/chip/commands_on_tpu.sh OUT_DIR [DEADLINE_S] [ONLY]
#
# DEADLINE_S: start nothing after this many seconds (default 420: a command on a lent chip may run
# 10 minutes, the setup takes about one); ONLY: comma-separated item names. The commands run in one
# process, then the pages in another that leaves the chip to the app's worker.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:?OUT_DIR}
source benchmarks/chip/setup_tpu.sh
mkdir -p "$out"
deadline=$(( $(date +%s) + ${2:-420} ))
for part in cli pages; do
  "$py" benchmarks/chip_commands.py "$out/commands.jsonl" --deadline-at "$deadline" --part "$part" \
    ${3:+--only "$3"} 2>&1 | grep -v "ScriptRunContext\|hugepages\|warnings.warn\|DEBUG"
done
