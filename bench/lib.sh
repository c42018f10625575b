# Sourced by the bench scripts (not run): the repository's root, --help, and the peers
# option, so that every script runs from any directory with nothing but this repository.

# bench_root is the repository: the parent of this file's folder, whatever the caller's cwd.
bench_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# bench_usage prints the calling script's usage: the comment block under its first line.
bench_usage() { awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"; }

# bench_help ARGS... reads the arguments of a script that takes none but -h/--help.
bench_help() {
  if [ $# -eq 1 ] && { [ "$1" = -h ] || [ "$1" = --help ]; }; then
    bench_usage
    exit 0
  fi
  if [ $# -gt 0 ]; then
    bench_usage >&2
    exit 2
  fi
}

# bench_options ARGS... reads a script's arguments: -h/--help prints its usage and exits;
# --peers SCRIPT (or --peers=SCRIPT; default $SOFTRNIC_PEERS) names the peers script, left
# in peers (bench_peers checks it); the other arguments are left, in order, in the array rest.
#
# A peers script measures, in the same run of the machine, what a user would pick instead of
# softrnic, and prints one tab-separated line per figure: peer, test, size in bytes, value,
# unit. "quick" as its first argument asks for shorter runs. The development workspace has
# one beside this checkout, ../shared/bench/peers.sh, with a Go sockets baseline in the
# gobaseline folder beside it.
bench_options() {
  peers=${SOFTRNIC_PEERS:-}
  rest=()
  while [ $# -gt 0 ]; do
    case $1 in
      -h | --help) bench_usage; exit 0 ;;
      --peers)
        if [ $# -lt 2 ]; then
          bench_usage >&2
          exit 2
        fi
        peers=$2
        shift 2
        ;;
      --peers=*) peers=${1#--peers=}; shift ;;
      *) rest+=("$1"); shift ;;
    esac
  done
}

# bench_peers NAME WITHOUT makes peers absolute (the caller's cwd is left behind once the
# script moves to bench_root), or, with no peers script or one that does not exist, empties
# it and says what the run leaves out (WITHOUT, e.g. "the peer columns stay empty").
bench_peers() {
  local name=$1 without=$2
  if [ -z "$peers" ]; then
    echo "$name: no peers script (--peers SCRIPT or SOFTRNIC_PEERS=SCRIPT): $without." >&2
  elif [ ! -f "$peers" ]; then
    echo "$name: no peers script at $peers: $without." >&2
    peers=
  else
    peers=$(cd "$(dirname "$peers")" && pwd)/$(basename "$peers")
  fi
}
