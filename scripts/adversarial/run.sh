#!/usr/bin/env bash
# Run the release cudamem on every hostile input gen.py writes, each under
# 2 GB of virtual memory and 60 s, one line per run:
#   case  command  exit  seconds  max-RSS-KB  first line of stderr
# Nothing may exit >= 100, be killed at 60 s, or pass 2 GB.
#
# usage: scripts/adversarial/run.sh [CASES_DIR]   (from the repository root,
# after `cargo build --release -p harness --bin cudamem`)
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
bin="$root/target/release/cudamem"
cases=${1:-$(mktemp -d)}
python3 "$root/scripts/adversarial/gen.py" "$cases"
work=$(mktemp -d)

# Run cudamem with the arguments given, within the bounds; set rc, seconds,
# rss (KB) and said (the first line of stderr).
measure() {
    (
        cd "$work" || exit 1
        ulimit -v 2000000
        command time -f '%e %M' -o "$work/time" timeout 60 "$bin" "$@" \
            >"$work/out" 2>"$work/err"
        echo $? >"$work/rc"
    )
    read -r seconds rss < <(tail -n 1 "$work/time") || { seconds=?; rss=?; }
    rc=$(cat "$work/rc")
    said=$(grep -v '^Command exited' "$work/err" | head -c 150 | head -n 1 | tr -d '\033\007')
}

printf '%-28s %-8s %4s %7s %9s  %s\n' case command exit seconds rss_kb stderr
for file in "$cases"/*; do
    name=$(basename "$file")
    commands=("replay")
    case "$name" in pk_*|proto*) commands+=("explain");; esac
    for command in "${commands[@]}"; do
        if [ "$command" = replay ]; then
            args=(replay "$file" --json)
        else
            args=(explain --snapshot "$file")
        fi
        measure "${args[@]}"
        printf '%-28s %-8s %4s %7s %9s  %s\n' "$name" "$command" "$rc" "$seconds" "$rss" "$said"
    done
done
# Arguments built to cost a lot, on a small trace.
small="$cases/small.csv"
snap="$cases/pk_escape.pickle"
while IFS= read -r line; do
    read -r -a args <<<"$line"
    measure "${args[@]}"
    printf '%-37s %4s %7s %9s  %s\n' "${args[*]:0:4}" "$rc" "$seconds" "$rss" "$said"
done <<EOF2
replay $small --stitch-large 8589932544MiB
replay $small --stitch-large 0 --policy stitch
replay $small --stitch-large 1GiB --policy stitch
replay $cases/csv_live_huge.csv --stitch-large 1GiB --stitch-align-large --policy stitch
replay $cases/csv_live_huge.csv --stitch-large 48MiB --policy stitch
replay $cases/csv_live_huge.csv --capacity 64GiB --policy stitch
replay $small --capacity 16383PiB
replay $small --capacity 2MiB
heap --size 1GiB
heap --size 1TiB --threads 4294967295
explain --snapshot $snap --profile h100
explain --snapshot $snap --lmem 4KiB
explain --snapshot $snap --report $snap
replay $small --report $small
EOF2
rm -rf "$work"
