#!/bin/sh
# cli_expect.sh RC PATTERN CMD...: CMD must exit with RC and print exactly one line to stderr
# containing PATTERN (for RC 0: stdout must contain PATTERN).
want_rc=$1; pattern=$2; shift 2
out=$("$@" 2>/tmp/cli_expect.$$)
rc=$?
err=$(cat /tmp/cli_expect.$$); rm -f /tmp/cli_expect.$$
if [ "$rc" != "$want_rc" ]; then echo "exit $rc, want $want_rc; stderr: $err"; exit 1; fi
if [ "$want_rc" = 0 ]; then
  echo "$out" | grep -q -- "$pattern" || { echo "stdout lacks '$pattern': $out"; exit 1; }
  exit 0
fi
lines=$(printf '%s\n' "$err" | grep -c .)
[ "$lines" = 1 ] || { echo "want one stderr line, got $lines: $err"; exit 1; }
echo "$err" | grep -q -- "$pattern" || { echo "stderr lacks '$pattern': $err"; exit 1; }
echo "ok: $err"
