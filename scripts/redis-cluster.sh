#!/usr/bin/env bash
# redis-cluster.sh start DIR   start a 3-master Redis Cluster (no replicas,
#                              no persistence) on free ports under DIR and
#                              print its addresses, comma-separated;
# redis-cluster.sh stop DIR    shut it down.
#
#   export IDEMPOTENCY_TEST_REDIS_CLUSTER=$(scripts/redis-cluster.sh start /tmp/rc)
#   go test ./redisstore -run Cluster
#   scripts/redis-cluster.sh stop /tmp/rc
set -euo pipefail

usage() { echo "usage: $0 start|stop DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
cmd=$1
dir=$2

# free_port prints a port that is free on 127.0.0.1 together with the port
# 10000 above it, which a cluster node uses for its bus (so the node's port
# must be at most 55535; an ephemeral port from the kernel often is not).
free_port() {
	python3 - <<'PY'
import random, socket
for _ in range(1000):
    p = random.randint(20000, 45000)
    socks = []
    try:
        for q in (p, p + 10000):
            s = socket.socket()
            s.bind(("127.0.0.1", q))
            socks.append(s)
    except OSError:
        continue
    finally:
        for s in socks:
            s.close()
    print(p)
    break
else:
    raise SystemExit("no free port pair")
PY
}

case $cmd in
start)
	mkdir -p "$dir"
	if [ -e "$dir/ports" ]; then
		echo "$0: $dir/ports exists; stop that cluster first" >&2
		exit 1
	fi
	ports=()
	for i in 1 2 3; do
		p=$(free_port)
		ports+=("$p")
		mkdir -p "$dir/$p"
		redis-server --port "$p" --bind 127.0.0.1 --cluster-enabled yes \
			--cluster-config-file "$dir/$p/nodes.conf" --dir "$dir/$p" \
			--save '' --appendonly no --maxmemory-policy noeviction \
			--daemonize yes --pidfile "$dir/$p/redis.pid" --logfile "$dir/$p/redis.log" >/dev/null
	done
	printf '%s\n' "${ports[@]}" >"$dir/ports"
	# On any failure below, report it and shut the nodes down again.
	fail() {
		echo "$0: $*" >&2
		"$0" stop "$dir"
		exit 1
	}
	addrs=()
	for p in "${ports[@]}"; do
		up=
		for _ in $(seq 100); do
			if redis-cli -p "$p" ping >/dev/null 2>&1; then
				up=1
				break
			fi
			sleep 0.1
		done
		[ -n "$up" ] || fail "node $p did not start: $(tail -3 "$dir/$p/redis.log" 2>/dev/null)"
		addrs+=("127.0.0.1:$p")
	done
	redis-cli --cluster create "${addrs[@]}" --cluster-replicas 0 --cluster-yes >"$dir/create.log" 2>&1 ||
		fail "cluster create failed: $(cat "$dir/create.log")"
	for p in "${ports[@]}"; do
		ok=
		for _ in $(seq 200); do
			if redis-cli -p "$p" cluster info 2>/dev/null | grep -q '^cluster_state:ok'; then
				ok=1
				break
			fi
			sleep 0.1
		done
		[ -n "$ok" ] || fail "node $p never reached cluster_state:ok"
	done
	(IFS=,; echo "${addrs[*]}")
	;;
stop)
	[ -e "$dir/ports" ] || exit 0
	while read -r p; do
		redis-cli -p "$p" shutdown nosave >/dev/null 2>&1 || true
		# Wait (bounded) for the pid file's process to go away.
		if [ -e "$dir/$p/redis.pid" ]; then
			pid=$(cat "$dir/$p/redis.pid")
			for _ in $(seq 50); do
				kill -0 "$pid" 2>/dev/null || break
				sleep 0.1
			done
		fi
	done <"$dir/ports"
	rm -f "$dir/ports"
	;;
*)
	usage
	;;
esac
