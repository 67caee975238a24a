#!/usr/bin/env bash
# Measures the response cache's cost: BenchmarkHandlerCache's rows (the cache off,
# configured with every request a miss, and every request a hit) in interleaved
# rounds, one run of the test binary a round, so that a host whose speed drifts
# affects each row alike. Prints every round, the load average before and after, the
# medians of CPU, allocations and bytes a request, and the median of each round's own
# CPU ratio of miss to off. With BENCHSTAT set to a benchstat binary, it also prints
# benchstat's table of the rounds.
#
# Usage: hack/bench-cache.sh [ROUNDS] [BENCHTIME]    (default 7 rounds of 2000x)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
rounds=${1:-7}
benchtime=${2:-2000x}
out=$(mktemp)
trap 'rm -f "$out" "$out.test"' EXIT
go test -c -o "$out.test" ./proxy/server/ >/dev/null
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for i in $(seq "$rounds"); do
	"$out.test" -test.run '^$' -test.bench '^BenchmarkHandlerCache$' -test.benchmem -test.benchtime "$benchtime" | grep '^BenchmarkHandlerCache' | tee -a "$out"
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
awk '
{ name=$1; sub(/^BenchmarkHandlerCache\//, "", name); sub(/-[0-9]+$/, "", name)
  for (f = 3; f < NF; f++) {
	if ($(f+1) == "cpu-µs/op") { cpu[name]=cpu[name] " " $f
		if (name == "off") roundOff = $f
		if (name == "miss" && roundOff > 0) rat = rat " " 100 * $f / roundOff }
	if ($(f+1) == "B/op") by[name]=by[name] " " $f
	if ($(f+1) == "allocs/op") al[name]=al[name] " " $f
  } }
function median(list,   a, n, i, j, t) {
	n = split(list, a, " ")
	for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
	return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
END {
	printf "%-18s %10s %10s %10s %10s\n", "median of rounds", "cpu µs/op", "vs off", "allocs/op", "B/op"
	off = median(cpu["off"])
	split("off miss hit", order, " ")
	for (k = 1; k <= 3; k++) { n = order[k]; if (!(n in cpu)) continue
		m = median(cpu[n]); printf "%-18s %10.1f %+9.1f%% %10.0f %10.0f\n", n, m, 100 * m / off - 100, median(al[n]), median(by[n]) }
	if (rat != "") printf "miss against off, the median of each round'"'"'s own ratio: %+.1f%%\n", median(rat) - 100
}' "$out"
if [ -n "${BENCHSTAT:-}" ]; then
	echo
	"$BENCHSTAT" "$out"
fi
