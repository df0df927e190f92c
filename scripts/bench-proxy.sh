#!/usr/bin/env bash
# bench-proxy.sh [STORE...]  idemproxy under wrk against a plain stdlib
# httputil.ReverseProxy in front of the same upstream, in the same run.
#
# STOREs are any of memory, bolt, redis, postgres (default: the first
# three; redis is a private redis-server on a free port, no persistence;
# postgres is the server at $BENCH_POSTGRES_URL, default
# postgres://postgres@127.0.0.1:5432/test?sslmode=disable, in a schema of
# this run's own, dropped at the end with psql), each with
# idemproxy's defaults (-replay-cache auto: a replay cache on Redis and PostgreSQL),
# and with a suffix: -cache (-replay-cache 1s) or -nocache
# (-replay-cache 0), e.g. redis-nocache. For each store and
# each workload the plain proxy and idemproxy are measured in alternating
# runs (plain, idemproxy, plain, idemproxy, ...) and the ratio of their mean
# requests/s is printed, with each proxy's CPU time per request (from
# /proc, user+system), which a loaded machine disturbs far less:
#
#   new     scripts/wrk-newkeys.lua: every request a new Idempotency-Key, so
#           idemproxy runs it upstream and stores the response.
#           Goal: at least 0.90x the plain proxy.
#   replay  scripts/wrk-replay.lua: 64 keys executed once beforehand, then
#           replayed from the store without the upstream. Goal: at least 2x.
#
# Each line also gives both proxies' median and 99th percentile latency as
# wrk saw them. With BENCH_UPSTREAM_DELAY (a Go duration, e.g. 20ms) the
# upstream waits that long before answering each request, as an API
# waiting on its database does: the run is then bound by latency rather
# than by the CPU, and the latencies show what idemproxy adds to a request.
#
# Environment: BENCH_DURATION seconds per run (default 5), BENCH_ROUNDS
# pairs of runs (default 3), BENCH_CONNS connections (default 64),
# BENCH_THREADS wrk threads (default 1), BENCH_PPROF a directory: idemproxy
# is built with -tags pprof and a CPU profile of its first run of each
# store and workload is written there (STORE-WORKLOAD.pprof; read it with
# go tool pprof). Every process runs on this
# machine, wrk included: on a small or shared machine they compete for the
# CPU, which the load averages printed before each store show.
#
# Needs Go, curl, python3 (to pick free ports), wrk (Debian package wrk,
# installed here when missing and run as root) and, for redis, redis-server.
set -euo pipefail
cd "$(dirname "$0")/.."

duration=${BENCH_DURATION:-5}
rounds=${BENCH_ROUNDS:-3}
conns=${BENCH_CONNS:-64}
threads=${BENCH_THREADS:-1}
stores=("$@")
[[ ${#stores[@]} -gt 0 ]] || stores=(memory bolt redis)

if ! command -v wrk >/dev/null 2>&1; then
	if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
		apt-get install -y wrk >/dev/null || { apt-get update >/dev/null && apt-get install -y wrk >/dev/null; }
	else
		echo "bench-proxy: wrk is not installed (Debian: apt-get install wrk)" >&2
		exit 1
	fi
fi

dir=$(mktemp -d)
pids=()
redis_port=
pg_schema=
pg_base=${BENCH_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test?sslmode=disable}
cleanup() {
	if [[ -n $pg_schema ]]; then psql -q "$pg_base" -c "DROP SCHEMA IF EXISTS $pg_schema CASCADE" >/dev/null 2>&1 || true; fi
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	if [[ -n $redis_port ]]; then redis-cli -p "$redis_port" shutdown nosave >/dev/null 2>&1 || true; fi
	rm -rf "$dir"
}
trap cleanup EXIT

freeport() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'; }

waitport() { # waitport PORT PID
	for _ in $(seq 200); do
		if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
		kill -0 "$2" 2>/dev/null || { echo "bench-proxy: process $2 exited before listening on $1" >&2; return 1; }
		sleep 0.05
	done
	echo "bench-proxy: nothing listens on $1" >&2
	return 1
}

stop() { # stop PID
	kill "$1" 2>/dev/null || true
	wait "$1" 2>/dev/null || true
}

# cputicks PID: user+system CPU time of a process, in clock ticks.
cputicks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# measure PORT PID SCRIPT RUNID: one wrk run against the proxy on PORT
# (process PID); prints its requests/s and the proxy's CPU microseconds per
# request (warns on non-2xx responses).
measure() {
	local out before after
	before=$(cputicks "$2")
	out=$(WRK_RUN=$4 wrk --latency -t "$threads" -c "$conns" -d "${duration}s" -s "scripts/$3" "http://127.0.0.1:$1/orders")
	after=$(cputicks "$2")
	if grep -q 'Non-2xx' <<<"$out"; then
		echo "bench-proxy: $(grep 'Non-2xx' <<<"$out" | tr -s ' ') from port $1 ($3)" >&2
	fi
	awk -v ticks=$((after - before)) -v hz="$(getconf CLK_TCK)" '
		function ms(v) { # a wrk duration (850.00us, 1.23ms, 1.02s, 2.00m) in milliseconds
			if (v ~ /us$/) return v * 0.001
			if (v ~ /ms$/) return v + 0
			if (v ~ /m$/) return v * 60000
			if (v ~ /s$/) return v * 1000
			return v + 0
		}
		/requests in/ {n = $1}
		/^Requests\/sec:/ {rps = $2}
		$1 == "50%" {p50 = ms($2)}
		$1 == "99%" {p99 = ms($2)}
		END {printf "%s %.1f %.3f %.3f\n", rps, (n > 0 ? ticks / hz * 1e6 / n : 0), p50, p99}' <<<"$out"
}

echo "== building idemproxy and benchupstream"
pprof_dir=${BENCH_PPROF:-}
if [[ -n $pprof_dir ]]; then
	mkdir -p "$pprof_dir"
	go build -tags pprof -o "$dir/idemproxy" ./cmd/idemproxy
else
	go build -o "$dir/idemproxy" ./cmd/idemproxy
fi
go build -o "$dir/benchupstream" ./scripts/benchupstream

up_port=$(freeport)
"$dir/benchupstream" -listen "127.0.0.1:$up_port" -delay "${BENCH_UPSTREAM_DELAY:-0}" &
pids+=($!)
waitport "$up_port" $!
plain_port=$(freeport)
"$dir/benchupstream" -listen "127.0.0.1:$plain_port" -proxy "http://127.0.0.1:$up_port" &
plain_pid=$!
pids+=($plain_pid)
waitport "$plain_port" $plain_pid

echo "== $(nproc) CPUs; wrk -t $threads -c $conns -d ${duration}s; $rounds alternating pairs per line; upstream delay ${BENCH_UPSTREAM_DELAY:-0}; go $(go env GOVERSION)"
summary=()
for store in "${stores[@]}"; do
	extra=()
	base=$store
	if [[ $store == *-nocache ]]; then
		base=${store%-nocache}
		extra=(-replay-cache 0)
	elif [[ $store == *-cache ]]; then
		base=${store%-cache}
		extra=(-replay-cache 1s)
	fi
	case $base in
	memory) url=memory ;;
	bolt) url="bolt:$dir/bench.db" ;;
	redis)
		if [[ -z $redis_port ]]; then
			redis_port=$(freeport)
			redis-server --port "$redis_port" --bind 127.0.0.1 --dir "$dir" --save '' --appendonly no \
				--maxmemory-policy noeviction --daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" >/dev/null
			for _ in $(seq 100); do
				redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break
				sleep 0.1
			done
		fi
		url="redis://127.0.0.1:$redis_port/0?prefix=bench:"
		;;
	postgres)
		pg_schema=${pg_schema:-bench_proxy_$$}
		sep='?'
		[[ $pg_base == *\?* ]] && sep='&'
		url="$pg_base${sep}schema=$pg_schema"
		;;
	*)
		echo "bench-proxy: unknown store $store (memory, bolt, redis, postgres, with -cache or -nocache)" >&2
		exit 2
		;;
	esac
	proxy_port=$(freeport)
	pprof_port=$(freeport)
	IDEMPROXY_PPROF=${pprof_dir:+127.0.0.1:$pprof_port} "$dir/idemproxy" -listen "127.0.0.1:$proxy_port" -admin "" -upstream "http://127.0.0.1:$up_port" \
		-store "$url" "${extra[@]}" -log-level warn 2>>"$dir/idemproxy.log" &
	ppid=$!
	pids+=($ppid)
	waitport "$proxy_port" $ppid
	echo "-- store $store (load average: $(cut -d' ' -f1-3 /proc/loadavg))"

	for workload in new replay; do
		script=wrk-newkeys.lua
		run="$store-$$-$RANDOM"
		if [[ $workload == replay ]]; then
			script=wrk-replay.lua
			# Execute each key once, then check that it replays.
			for i in $(seq 0 63); do
				curl -s -o /dev/null -X POST -H "Idempotency-Key: \"replay-$run-$i\"" -H 'Content-Type: application/json' \
					--data '{"sku":"A-1","qty":2,"note":"bench"}' "http://127.0.0.1:$proxy_port/orders"
			done
			if ! curl -s -D - -o /dev/null -X POST -H "Idempotency-Key: \"replay-$run-7\"" -H 'Content-Type: application/json' \
				--data '{"sku":"A-1","qty":2,"note":"bench"}' "http://127.0.0.1:$proxy_port/orders" | grep -qi '^Idempotent-Replayed: true'; then
				echo "bench-proxy: store $store does not replay the prepared keys" >&2
				exit 1
			fi
		fi
		plain=() idem=()
		for r in $(seq "$rounds"); do
			# New keys: a fresh set each run. Replays: the prepared keys.
			id=$run
			[[ $workload == new ]] && id=$run-$r
			plain+=("$(measure "$plain_port" "$plain_pid" "$script" "$id-plain")")
			prof=
			if [[ -n $pprof_dir && $r == 1 ]]; then
				curl -s -o "$pprof_dir/$store-$workload.pprof" \
					"http://127.0.0.1:$pprof_port/debug/pprof/profile?seconds=$((duration > 2 ? duration - 1 : 1))" &
				prof=$!
			fi
			idem+=("$(measure "$proxy_port" "$ppid" "$script" "$id")")
			if [[ -n $prof ]]; then wait "$prof" || echo "bench-proxy: no profile from idemproxy" >&2; fi
		done
		line=$(python3 - "$store" "$workload" "$(printf '%s,' "${plain[@]}")" "$(printf '%s,' "${idem[@]}")" <<'PY'
import sys
store, wl = sys.argv[1], sys.argv[2]
def runs(arg):
    return [tuple(float(v) for v in r.split()) for r in arg.split(",") if r.strip()]
plain, idem = runs(sys.argv[3]), runs(sys.argv[4])
mean = lambda xs: sum(xs) / len(xs)
p, i = mean([r[0] for r in plain]), mean([r[0] for r in idem])
pc, ic = mean([r[1] for r in plain]), mean([r[1] for r in idem])
med = lambda xs: sorted(xs)[len(xs) // 2]
p50p, p50i = med([r[2] for r in plain]), med([r[2] for r in idem])
p99p, p99i = med([r[3] for r in plain]), med([r[3] for r in idem])
goal = 0.90 if wl == "new" else 2.0
r = i / p
print(f"{store:7} {wl:7} plain {p:7.0f} req/s {pc:5.1f} us/req | idemproxy {i:7.0f} req/s {ic:5.1f} us/req | "
      f"ratio {r:4.2f}x (goal >= {goal:.2f}x: {'met' if r >= goal else 'NOT met'}) | CPU per request {ic / pc:4.2f}x"
      f" | latency ms p50/p99: plain {p50p:.2f}/{p99p:.2f}, idemproxy {p50i:.2f}/{p99i:.2f}"
      f" | runs req/s: plain {' '.join(f'{x[0]:.0f}' for x in plain)}; idemproxy {' '.join(f'{x[0]:.0f}' for x in idem)}")
PY
)
		echo "$line"
		summary+=("$line")
	done
	stop "$ppid"
done

echo
echo "== summary (load average now: $(cut -d' ' -f1-3 /proc/loadavg))"
printf '%s\n' "${summary[@]}"
if [[ -s $dir/idemproxy.log ]]; then
	echo "== idemproxy warnings"
	tail -n 20 "$dir/idemproxy.log"
fi
