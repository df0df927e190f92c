#!/usr/bin/env bash
# bench-core.sh: Guard.Do on our MemoryStore against the seed's own Guard and
# MemoryStore (../shared/seed), in one binary and one run.
#
# Usage: scripts/bench-core.sh [count] [benchtime]     (defaults: 6, 1s)
# Prints the raw benchmark lines, then benchstat's comparison if benchstat is
# installed (go install golang.org/x/perf/cmd/benchstat@latest).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
seed=${SEED_DIR:-$root/../shared/seed}
count=${1:-6}
benchtime=${2:-1s}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/seed"
for f in store.go guard.go; do
  sed 's/^package idempotency$/package seed/' "$seed/$f" >"$tmp/seed/$f"
done
cp "$root/scripts/corebench/bench_test.go" "$tmp/bench_test.go"
cat >"$tmp/go.mod" <<MOD
module corebench

go 1.26

require github.com/archlab/idempotency v0.0.0

replace github.com/archlab/idempotency => $root
MOD
cp "$root/go.sum" "$tmp/go.sum"
cd "$tmp"
go mod tidy >/dev/null 2>&1 || true
# One binary, run count times with -count 1: each round measures the seed
# and ours back to back, so load from other work on the machine falls on
# both alike instead of on whichever ran during a busy spell.
go test -c -tags corebench -o "$tmp/corebench.test" .
for _ in $(seq "$count"); do
  "$tmp/corebench.test" -test.run '^$' -test.bench "${BENCH:-.}" -test.benchmem -test.count 1 -test.benchtime "$benchtime"
done | tee "$tmp/out.txt"
if command -v benchstat >/dev/null 2>&1; then
  echo
  benchstat -col /impl "$tmp/out.txt"
fi
