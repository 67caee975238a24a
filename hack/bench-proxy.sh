#!/usr/bin/env bash
# Measures the whole proxy (memory and Redis stores) against a bare httputil.ReverseProxy
# and the backend reached
# directly, in interleaved rounds (one round runs all three, one after the other), so a
# machine whose speed drifts affects each side alike. Prints every round and the
# medians, and the throughput of each relative to the bare reverse proxy (of the
# medians, and the median of each round's own ratio, which a host whose speed drifts
# between rounds disturbs less), with the process's CPU time and allocations a request.
#
# Usage: hack/bench-proxy.sh [ROUNDS] [BENCHTIME]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
rounds=${1:-7}
benchtime=${2:-2s}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
go test -c -o "$out.test" ./proxy/server/ >/dev/null
for i in $(seq "$rounds"); do
	"$out.test" -test.run '^$' -test.bench '^BenchmarkProxy$' -test.benchmem -test.benchtime "$benchtime" | grep '^BenchmarkProxy' | tee -a "$out"
done
rm -f "$out.test"
echo
awk '
{ name=$1; sub(/^BenchmarkProxy\//, "", name); sub(/-[0-9]+$/, "", name)
  for (f = 3; f < NF; f++) {
	if ($(f+1) == "ns/op") { ns[name]=ns[name] " " $f
		if (name == "bare-reverseproxy") roundBare = $f
		if (roundBare > 0) rat[name]=rat[name] " " 100 * roundBare / $f }
	if ($(f+1) == "p99-µs") p99[name]=p99[name] " " $f
	if ($(f+1) == "cpu-µs/op") cpu[name]=cpu[name] " " $f
	if ($(f+1) == "allocs/op") al[name]=al[name] " " $f
  } }
function median(list,   a, n, i, j, t) {
	n = split(list, a, " ")
	for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
	return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
END {
	bare = median(ns["bare-reverseproxy"])
	printf "%-30s %12s %14s %9s %11s %10s %10s\n", "median of rounds", "ns/op", "p99 µs (64c)", "vs bare", "per round", "cpu µs/op", "allocs/op"
	split("direct bare-reverseproxy tokenwarden-memory tokenwarden-memory-rules tokenwarden-memory-scheduled tokenwarden-memory-registry tokenwarden-redis tokenwarden-redis-typical", order, " ")
	for (k = 1; k <= 8; k++) { n = order[k]; if (!(n in ns)) continue
		m = median(ns[n]); printf "%-30s %12.0f %14.0f %8.0f%% %10.0f%% %10.1f %10.0f\n", n, m, median(p99[n]), 100 * bare / m, median(rat[n]), median(cpu[n]), median(al[n]) }
}' "$out"
