#!/usr/bin/env bash
# bench-redis.sh [N]  Guard.Do throughput on redisstore at 64 workers
# against redis-benchmark SET at 64 clients, on one private redis-server
# (free port, temp dir, no persistence) in the same run. Prints both rates
# and their ratio: a new request costs two commands (Begin, Complete), so
# without pipelining 50% would be the ceiling; the goal is at least 45%.
# redisstore pipelines concurrent operations (see its doc), so it can pass
# 50%. N (default 100000) is the number of requests of each side.
set -euo pipefail
cd "$(dirname "$0")/.."

n=${1:-100000}
dir=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
redis-server --port "$port" --bind 127.0.0.1 --dir "$dir" --save '' --appendonly no \
	--maxmemory-policy noeviction --daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" >/dev/null
cleanup() {
	redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
	rm -rf "$dir"
}
trap cleanup EXIT
for _ in $(seq 100); do
	redis-cli -p "$port" ping >/dev/null 2>&1 && break
	sleep 0.1
done

export IDEMPOTENCY_TEST_REDIS_URL=redis://127.0.0.1:$port/0
echo "== go test -run '^\$' -bench 'GuardDo/new/workers=64' -benchtime ${n}x ./redisstore (redis on :$port)"
out=$(go test -run '^$' -bench 'GuardDo/new/workers=64$' -benchtime "${n}x" -count 1 ./redisstore)
echo "$out" | grep Benchmark
nsop=$(echo "$out" | awk '/BenchmarkGuardDo\/new\/workers=64/ {print $3; exit}')
rt=$(echo "$out" | awk '/BenchmarkGuardDo\/new\/workers=64/ {print $5; exit}')
go_rps=$(awk -v ns="$nsop" 'BEGIN {printf "%.0f", 1e9/ns}')

echo "== redis-benchmark -p $port -t set -c 64 -n $n -q"
rb=$(redis-benchmark -p "$port" -t set -c 64 -n "$n" --csv)
echo "$rb"
set_rps=$(echo "$rb" | awk -F'","' '/^"SET"/ {print $2; exit}' | tr -d '"')

awk -v g="$go_rps" -v s="$set_rps" -v rt="$rt" 'BEGIN {
	printf "Guard.Do new requests, 64 workers: %d req/s (%s commands/req)\n", g, rt
	printf "redis-benchmark SET, 64 clients:   %d req/s\n", s
	printf "ratio: %.1f%% (goal >= 45%%; 2 commands per request, pipelined under load)\n", 100*g/s
}'
