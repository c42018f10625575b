#!/usr/bin/env bash
# Logs, once a second, every process whose command line names loadtest.sh or go test
# (epoch seconds, then the processes), so run.sh can tell which measurements overlapped one.
while :; do
  p=$(pgrep -af 'loadtest.sh|go test' | grep -vE '^[0-9]+ pgrep ' | tr '\n' ';')
  [ -n "$p" ] && echo "$(date +%s) $p"
  sleep 1
done
