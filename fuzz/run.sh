#!/usr/bin/env bash
# fuzz/run.sh BUILD_DIR [TARGET...] - run libFuzzer targets for a bounded time
# (`make fuzz` calls it after building BUILD_DIR with -DKVS_BUILD_FUZZ=ON).
#
# Each target (default: every BUILD_DIR/fuzz_*) runs for FUZZ_SECONDS
# (default 60) on a fresh copy of its committed seed corpus fuzz/corpus/NAME
# (the copy is BUILD_DIR/fuzz-run/NAME/corpus, so the committed corpus never
# grows), with its dictionary fuzz/dicts/NAME.dict if there is one, up to
# FUZZ_JOBS (default: the CPU count) targets at a time. A crash, leak,
# sanitizer report, timeout or out-of-memory fails the run; the input that
# caused it is saved as fuzz/crashes/NAME-crash-<sha1> (not committed) and
# the end of the target's log is printed. Exit status 0 only if every target
# ran clean. A table of executions per target ends the output.
set -uo pipefail

if [ $# -lt 1 ]; then
  echo "usage: $0 BUILD_DIR [TARGET...]" >&2
  exit 2
fi
build=$(cd "$1" && pwd) || exit 2
shift
root=$(cd "$(dirname "$0")/.." && pwd)
secs=${FUZZ_SECONDS:-60}
jobs=${FUZZ_JOBS:-$(nproc)}
crashes="$root/fuzz/crashes"
mkdir -p "$crashes"

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for bin in "$build"/fuzz_*; do
    [ -x "$bin" ] && targets+=("$(basename "$bin")")
  done
fi
if [ ${#targets[@]} -eq 0 ]; then
  echo "fuzz: no fuzz_* executables in $build" >&2
  exit 1
fi

# Sanitizer reports must end the run (libFuzzer then saves the input).
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"

run_one() {
  local t=$1 name=${1#fuzz_}
  local work="$build/fuzz-run/$name"
  rm -rf "$work"
  mkdir -p "$work/corpus"
  if [ -d "$root/fuzz/corpus/$name" ]; then
    cp -R "$root/fuzz/corpus/$name/." "$work/corpus/"
  fi
  local args=(-max_total_time="$secs" -rss_limit_mb=2048 -timeout=30 -print_final_stats=1
              -artifact_prefix="$crashes/$name-")
  [ -f "$root/fuzz/dicts/$name.dict" ] && args+=(-dict="$root/fuzz/dicts/$name.dict")
  "$build/$t" "${args[@]}" "$work/corpus" >"$work/log" 2>&1
  echo $? >"$work/rc"
}

start=$(date +%s)
running=0
for t in "${targets[@]}"; do
  if [ ! -x "$build/$t" ]; then
    echo "fuzz: $build/$t not found" >&2
    exit 1
  fi
  echo "fuzz: $t for ${secs}s"
  run_one "$t" &
  running=$((running + 1))
  if [ "$running" -ge "$jobs" ]; then
    wait -n
    running=$((running - 1))
  fi
done
wait

failed=0
printf '\n%-22s %12s %10s %8s %s\n' target execs "exec/s" corpus result
for t in "${targets[@]}"; do
  name=${t#fuzz_}
  work="$build/fuzz-run/$name"
  rc=$(cat "$work/rc" 2>/dev/null || echo 1)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log" | tail -1)
  speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$work/log" | tail -1)
  files=$(find "$work/corpus" -type f | wc -l)
  result=ok
  if [ "$rc" != 0 ] || grep -qE 'ERROR: (Address|Leak|Thread|Memory)Sanitizer|runtime error:|property violated|libFuzzer: (deadly signal|timeout|out-of-memory)' "$work/log"; then
    result="FAILED (exit $rc)"
    failed=1
  fi
  printf '%-22s %12s %10s %8s %s\n' "$t" "${execs:-?}" "${speed:-?}" "$files" "$result"
done
echo "fuzz: ${#targets[@]} targets, ${secs}s each, $(( $(date +%s) - start ))s wall"

if [ "$failed" != 0 ]; then
  for t in "${targets[@]}"; do
    name=${t#fuzz_}
    work="$build/fuzz-run/$name"
    if [ "$(cat "$work/rc" 2>/dev/null || echo 1)" != 0 ]; then
      echo
      echo "==== $t: last lines of $work/log"
      grep -vE '^#[0-9]+' "$work/log" | tail -60
    fi
  done
  echo
  echo "fuzz: FAILED; the inputs are in fuzz/crashes/ (reproduce: $build/fuzz_NAME fuzz/crashes/FILE)"
  exit 1
fi
