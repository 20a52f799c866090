#!/usr/bin/env bash
# Runs each of ephd's fuzz targets (fuzz/, logic in ephd-fuzz/) for a
# bounded time and records what happened: a Markdown table of target,
# seconds, executions, executions per second, corpus size and crashes, with
# the paths of any crashing inputs, printed and written to
# fuzz/results/<UTC time>.md. Exits 1 when any target crashed (or failed to
# run), 0 otherwise.
#
# Needs:
#   - the stable Rust toolchain and a C++ compiler (libFuzzer is built from
#     source by the libfuzzer-sys crate);
#   - cargo-fuzz (`cargo install cargo-fuzz`; this script installs it from
#     crates.io when `cargo fuzz` is missing);
#   - RUSTC_BOOTSTRAP=1, which this script sets: cargo-fuzz passes
#     nightly-only -Z flags (sanitizer, coverage instrumentation), and this
#     project has only stable. Nothing else uses it.
#
# Environment (all optional):
#   FUZZ_SECONDS    seconds per target (default 60)
#   FUZZ_TARGETS    space-separated targets (default: every target)
#   FUZZ_SANITIZER  address (default) or none
#   FUZZ_RESULTS    the record to write (default fuzz/results/<UTC time>.md)
#   CARGO_TARGET_DIR  as usual (default fuzz/target)
#
# Bounded: one fuzzing process at a time, each under `timeout` (its own
# -max_total_time plus a margin); no network; it stops only what it started.
# The corpus grows in fuzz/corpus/<target>/ (git-ignored); fuzz/seeds/ and
# fuzz/regressions/ are read as extra corpora and never written.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

seconds=${FUZZ_SECONDS:-60}
targets=${FUZZ_TARGETS:-"decode_requests store_ops snapshot etcd_db"}
sanitizer=${FUZZ_SANITIZER:-address}
stamp=$(date -u +%Y-%m-%dT%H%M%SZ)
results=${FUZZ_RESULTS:-fuzz/results/$stamp.md}
export RUSTC_BOOTSTRAP=1

# Longest input per target: the decode target needs room for deep nesting
# (a frame length of 0xffff takes the rest of the input); the others read
# only as much as their op or snapshot choices use.
max_len() {
  case $1 in
    decode_requests) echo 65536 ;;
    snapshot) echo 8192 ;;
    etcd_db) echo 65536 ;;
    *) echo 4096 ;;
  esac
}

# Extra libFuzzer options and sanitizer settings per target. None today:
# every target runs with leak detection, per input and at exit (store_ops
# found a leak that way: index entries removed by compaction were never
# freed; fuzz/results/2026-11-30T221135Z.md and the fix in
# src/mvcc/index.rs).
extra_options() { :; }
asan_options() { :; }

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz.sh: installing cargo-fuzz from crates.io" >&2
  cargo install cargo-fuzz --locked
fi

# cargo-fuzz builds every crate with `--cfg fuzzing`, which in the vendored
# h2 (third_party/h2, a path dependency, so its lints are not capped as a
# registry crate's are) compiles an undocumented module that h2's own
# `deny(missing_docs)` then refuses. Lints are not what fuzzing checks
# (clippy in scripts/test.sh does): cap them at warnings for these builds.
export RUSTFLAGS="${RUSTFLAGS:-} --cap-lints=warn"
build_flags=(--sanitizer "$sanitizer" --debug-assertions)
echo "fuzz.sh: building the targets ($sanitizer sanitizer, debug assertions)" >&2
cargo fuzz build "${build_flags[@]}"

mkdir -p fuzz/logs "$(dirname "$results")"
failed=0
rows=()
findings=()
for target in $targets; do
  corpus=fuzz/corpus/$target
  artifacts=fuzz/artifacts/$target
  log=fuzz/logs/$target.log
  mkdir -p "$corpus" "$artifacts"
  before=$(find "$artifacts" -type f | sort)
  extra=()
  for dir in fuzz/seeds/$target fuzz/regressions/$target; do
    if [ -d "$dir" ] && [ -n "$(ls -A "$dir")" ]; then extra+=("$dir"); fi
  done
  echo "fuzz.sh: $target for ${seconds}s (log: $log)" >&2
  set +e
  ASAN_OPTIONS=$(asan_options "$target") timeout --kill-after=30 $((seconds + 120)) \
    cargo fuzz run "${build_flags[@]}" "$target" "$corpus" "${extra[@]}" -- \
    -max_total_time="$seconds" -max_len="$(max_len "$target")" \
    -timeout=30 -rss_limit_mb=4096 -print_final_stats=1 \
    -artifact_prefix="$artifacts/" $(extra_options "$target") >"$log" 2>&1
  status=$?
  set -e
  # libFuzzer's final stats; the last progress line ("#N ...") if it died
  # before printing them.
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  if [ -z "$execs" ]; then
    execs=$(grep -oE '^#[0-9]+' "$log" | tail -1 | tr -d '#')
  fi
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  units=$(find "$corpus" -type f | wc -l)
  new=$(comm -13 <(echo "$before") <(find "$artifacts" -type f | sort) | sed '/^$/d')
  crashes=$(echo -n "$new" | grep -c . || true)
  if [ "$status" -ne 0 ] && [ "$crashes" -eq 0 ]; then
    findings+=("- $target: exited $status without an artifact; see $log")
    failed=1
  fi
  if [ "$crashes" -gt 0 ]; then
    failed=1
    while read -r a; do
      reason=$(grep -m1 -E '^(==[0-9]+==ERROR|thread .* panicked|ERROR: libFuzzer)' "$log" || true)
      findings+=("- $target: \`$a\` ${reason:+— $reason}")
    done <<<"$new"
  fi
  rows+=("| $target | $seconds | ${execs:-?} | ${rate:-?} | $units | $crashes |")
done

{
  echo "# Fuzzing run $stamp"
  echo
  echo "- commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . 2>/dev/null || echo ' (with local changes)')"
  echo "- toolchain: $(rustc --version), $(cargo fuzz --version), RUSTC_BOOTSTRAP=1"
  echo "- sanitizer: $sanitizer; debug assertions on; machine: $(nproc) cores"
  echo
  echo "| target | seconds | executions | exec/s | corpus | crashes |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: |"
  printf '%s\n' "${rows[@]}"
  echo
  if [ "${#findings[@]}" -gt 0 ]; then
    echo "Findings:"
    printf '%s\n' "${findings[@]}"
  else
    echo "No crashes."
  fi
} | tee "$results"
echo "fuzz.sh: wrote $results" >&2
exit "$failed"
