#!/bin/sh
# The NVRM lines of the kernel log since boot, for the survey (facts.nvidia.parse_kernel_log):
# the journal's kernel messages of this boot where journald keeps them (the ring buffer of a
# long-running host may have dropped its early lines), else the kernel ring buffer (dmesg).
# The first line names the source; then at most the last 400 NVRM lines, so that a card logging
# an Xid every second cannot flood the survey. Exit 3: neither could be read (the lines say why).
if command -v journalctl >/dev/null 2>&1 \
  && [ -n "$(journalctl -k -b -q -n 1 --no-pager -o cat 2>/dev/null)" ]; then
  echo "@source journal"
  journalctl -k -b -q --no-pager -o cat 2>/dev/null | grep 'NVRM' | tail -n 400
  exit 0
fi
if log=$(dmesg 2>&1); then
  echo "@source dmesg"
  printf '%s\n' "$log" | grep 'NVRM' | tail -n 400
  exit 0
fi
printf '%s\n' "$log" | head -n 3
exit 3
