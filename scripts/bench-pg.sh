#!/usr/bin/env bash
# bench-pg.sh: pgstore's Guard.Do on new keys against pgbench sending the
# same statements (Begin's INSERT ... ON CONFLICT and the UPDATE that draws
# a new row's token, then Complete's UPDATE with the returned token) at the
# same client count, on the same server, interleaved in one run. Prints
# requests/s of each and the ratio (goal: pgstore >= 80% of pgbench).
# pgstore sends Begin's two statements as one batch (one round trip, one
# implicit transaction); pgbench cannot read a result in pipeline mode, so
# its script wraps them in BEGIN and COMMIT: two more round trips on its
# side, which favours pgstore at low client counts.
#
#   IDEMPOTENCY_TEST_POSTGRES_URL=postgres://... scripts/bench-pg.sh
#
# BENCH_SECONDS (default 5) is the duration of each measurement;
# BENCH_CLIENTS (default "1 8 64") the client counts; BENCH_ROUNDS (default
# 2) how many times each pair is measured, alternating which goes first,
# keeping the best of each side (on a shared machine the noise only ever
# slows a run down). The server must allow 64 more connections than it has
# in use.
set -euo pipefail
cd "$(dirname "$0")/.."

url=${IDEMPOTENCY_TEST_POSTGRES_URL:?set IDEMPOTENCY_TEST_POSTGRES_URL to a PostgreSQL URL}
secs=${BENCH_SECONDS:-5}
clients=${BENCH_CLIENTS:-1 8 64}
rounds=${BENCH_ROUNDS:-2}
command -v pgbench >/dev/null || { echo "bench-pg.sh: pgbench is not installed" >&2; exit 1; }

tmp=$(mktemp -d)
schema="idem_bench_$(date +%s)_$$"
cleanup() {
	psql "$url" -qc "DROP SCHEMA IF EXISTS $schema CASCADE" >/dev/null 2>&1 || true
	rm -rf "$tmp"
}
trap cleanup EXIT

psql "$url" -qc "CREATE SCHEMA $schema"
IDEMPOTENCY_TEST_POSTGRES_URL=$url PGSTORE_BENCH_SCHEMA=$schema PGSTORE_PGBENCH_SCRIPT=$tmp/request.sql \
	go test -count=1 -run '^TestPgbenchScript$' ./pgstore >/dev/null
test -s "$tmp/request.sql"
go test -c -o "$tmp/pgstore.test" ./pgstore

# go_ops N prints Guard.Do new-key requests/s at N workers.
go_ops() {
	local out ns
	out=$(IDEMPOTENCY_TEST_POSTGRES_URL=$url "$tmp/pgstore.test" -test.run '^$' \
		-test.bench "^BenchmarkGuardDo\$/^Do/new-key/workers=$1\$" -test.benchtime "${secs}s" -test.count 1)
	ns=$(awk '/^BenchmarkGuardDo\/Do\/new-key\/workers=/ {for (i = 1; i < NF; i++) if ($(i+1) == "ns/op") print $i}' <<<"$out")
	if [ -z "$ns" ]; then
		echo "$out" >&2
		echo "bench-pg.sh: no Go benchmark result for $1 workers" >&2
		exit 1
	fi
	awk -v ns="$ns" 'BEGIN { printf "%.1f\n", 1e9 / ns }'
}

# pgbench_tps N prints pgbench's requests/s (transactions of the script) at
# N clients.
pgbench_tps() {
	local out tps
	out=$(pgbench -n -M prepared -c "$1" -j "$(($1 < 2 ? $1 : 2))" -T "$secs" -f "$tmp/request.sql" "$url" 2>&1)
	tps=$(awk '/^tps = / {print $3}' <<<"$out")
	if [ -z "$tps" ] || grep -q 'aborted' <<<"$out"; then
		echo "$out" >&2
		echo "bench-pg.sh: pgbench failed for $1 clients" >&2
		exit 1
	fi
	echo "$tps"
}

best() { awk -v a="$1" -v b="$2" 'BEGIN { print (a > b ? a : b) }'; }

printf '%-8s %14s %14s %8s\n' clients pgstore/s pgbench/s ratio
for c in $clients; do
	g=0 p=0
	for ((r = 0; r < rounds; r++)); do
		# Plain assignments, so that set -e stops on a failed measurement.
		if ((r % 2 == 0)); then
			v=$(go_ops "$c")
			w=$(pgbench_tps "$c")
		else
			w=$(pgbench_tps "$c")
			v=$(go_ops "$c")
		fi
		g=$(best "$g" "$v")
		p=$(best "$p" "$w")
	done
	awk -v c="$c" -v g="$g" -v p="$p" 'BEGIN { printf "%-8s %14.0f %14.0f %7.0f%%\n", c, g, p, 100 * g / p }'
done
