#!/bin/sh
# Run every fuzz target (or those named) for FUZZ_TIME seconds each and
# print one line per target: its time, executions, corpus size, and
# whether it found a crash. New inputs go to fuzz/work/TARGET (not
# committed); the committed seeds in fuzz/corpus/TARGET are read only.
# A crash leaves its input in fuzz/artifacts/TARGET/ and fails the run.
# Needs the nightly toolchain and cargo-fuzz (README, "Fuzzing").
set -u
cd "$(dirname "$0")/.."
FUZZ_TIME=${FUZZ_TIME:-15}
targets=${*:-$(ls fuzz/fuzz_targets | sed 's/\.rs$//')}
cargo +nightly fuzz build -O >/dev/null || exit 1
status=0
printf '%-14s %6s %12s %8s %s\n' target seconds executions corpus result
for t in $targets; do
	mkdir -p "fuzz/work/$t"
	log="fuzz/work/$t.log"
	if cargo +nightly fuzz run -O "$t" "fuzz/work/$t" "fuzz/corpus/$t" -- \
		-max_total_time="$FUZZ_TIME" -rss_limit_mb=2048 -timeout=10 \
		-print_final_stats=1 >"$log" 2>&1; then
		result=ok
	else
		result="CRASH (see $log, fuzz/artifacts/$t/)"
		status=1
	fi
	runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
	secs=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -1)
	units=$(ls "fuzz/work/$t" | wc -l)
	printf '%-14s %6s %12s %8s %s\n' "$t" "${secs:-$FUZZ_TIME}" "${runs:-?}" "$units" "$result"
done
exit $status
