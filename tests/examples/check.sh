#!/usr/bin/env bash
# Runs each example the way README shows, and reads what it wrote with
# `go tool pprof` (Debian golang-go), the client the README's commands use:
#
#   tests/examples/check.sh BIN_DIR     (the directory holding the built examples)
#
# Run by ctest as `examples` (builds with examples, no sanitizers).
#   hello_heap      the quick start's run step (scripts/run-example): heap.pb.gz,
#                   and `go tool pprof -top` names BuildIndex
#   request_labels  labels.pb.gz; `go tool pprof -tags` lists endpoint and tenant
#   retention       retention.pb.gz; `-top` names the global that holds it all, g_sessions
#   memory_events   `peak`: peak.pb.gz; `-top` names LoadBatch
#   pprof_server    serves on 127.0.0.1:0; `go tool pprof` fetches /allocs from
#                   the URL it prints
# Exit status: the number of failed checks. Without go, the profiles are only
# checked to exist (and the run says so).
set -uo pipefail

bin="$(cd "${1:?usage: check.sh BIN_DIR}" && pwd)" || exit 1
tmp="$(mktemp -d "${TMPDIR:-/tmp}/heapprof-examples.XXXXXX")"
server_pid=
cleanup() {
  [[ -n "$server_pid" ]] && kill "$server_pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
unset HEAPPROF  # the examples as README runs them: no settings from outside
export GOCACHE="${GOCACHE:-/tmp/heapprof-gocache}" PPROF_TMPDIR="$tmp/pprof" HOME="${HOME:-/tmp}"

go=
for g in go /usr/lib/go/bin/go; do
  if command -v "$g" >/dev/null 2>&1; then go="$(command -v "$g")"; break; fi
done
[[ -n "$go" ]] || echo "go not installed (Debian golang-go): profiles checked to exist only"

failures=0
pass() { printf 'ok    %s\n' "$*"; }
fail() { printf 'FAIL  %s\n' "$*"; failures=$((failures + 1)); }
show() { sed -n '1,30s/^/      /p' "$1"; }

# run NAME ARGS...: runs the example in its own directory; output in $tmp/NAME.out.
run() {
  local name=$1; shift
  mkdir -p "$tmp/$name"
  (cd "$tmp/$name" && timeout -s KILL 120 "$bin/$name" "$@") >"$tmp/$name.out" 2>&1
}

# pprof_has NAME WANT ARGS...: `go tool pprof ARGS` succeeds and prints WANT.
pprof_has() {
  local name=$1 want=$2; shift 2
  [[ -n "$go" ]] || { pass "$name (go tool pprof not run)"; return; }
  if (cd "$tmp/$name" && timeout -s KILL 120 "$go" tool pprof "$@") >"$tmp/$name.pprof" 2>&1 &&
     grep -q -- "$want" "$tmp/$name.pprof"; then
    pass "$name: go tool pprof $* shows $want"
  else
    fail "$name: go tool pprof $* does not show $want"; show "$tmp/$name.pprof"
  fi
}

# example NAME FILE [ARGS...]: runs NAME with ARGS; it must exit 0 and write FILE.
example() {
  local name=$1 file=$2; shift 2
  run "$name" "$@"
  local status=$?
  if ((status != 0)); then
    fail "$name${*:+ $*}: exit status $status"; show "$tmp/$name.out"; return 1
  fi
  if [[ ! -s "$tmp/$name/$file" ]]; then
    fail "$name${*:+ $*}: wrote no $file"; show "$tmp/$name.out"; return 1
  fi
}

if example hello_heap heap.pb.gz; then
  pprof_has hello_heap BuildIndex -top -nodecount=15 "$bin/hello_heap" heap.pb.gz
fi
if example request_labels labels.pb.gz labels.pb.gz; then
  pprof_has request_labels 'endpoint' -tags labels.pb.gz
  pprof_has request_labels 'tenant' -tags labels.pb.gz
fi
if example retention retention.pb.gz; then
  pprof_has retention "g_sessions" -top "$bin/retention" retention.pb.gz
fi
if example memory_events peak.pb.gz peak; then
  pprof_has memory_events LoadBatch -top "$bin/memory_events" peak.pb.gz
fi

# pprof_server: port 0, so parallel runs never collide; the URL is read from
# its first line (the test waits for that line, up to 60 s, not for a time).
mkdir -p "$tmp/pprof_server"
"$bin/pprof_server" --listen 127.0.0.1:0 --seconds 120 >"$tmp/pprof_server.out" 2>&1 &
server_pid=$!
url=
for _ in $(seq 600); do
  url="$(sed -n 's/^serving \(http[^ ]*\) for .*/\1/p' "$tmp/pprof_server.out")"
  [[ -n "$url" ]] && break
  kill -0 "$server_pid" 2>/dev/null || break
  sleep 0.1
done
if [[ -z "$url" ]]; then
  fail "pprof_server: printed no URL"; show "$tmp/pprof_server.out"
else
  pprof_has pprof_server 'Type: alloc_space' -top -sample_index=alloc_space "${url}allocs"
  if kill -0 "$server_pid" 2>/dev/null; then
    pass "pprof_server: still serving at $url after the fetch"
  else
    fail "pprof_server: exited while serving"; show "$tmp/pprof_server.out"
  fi
fi

if ((failures)); then
  echo "$failures example check(s) failed"
else
  echo "all example checks passed"
fi
exit "$failures"
