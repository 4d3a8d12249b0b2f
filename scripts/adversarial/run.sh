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
        (
            cd "$work" || exit 1
            ulimit -v 2000000
            command time -f '%e %M' -o "$work/time" timeout 60 "$bin" "${args[@]}" \
                >"$work/out" 2>"$work/err"
            echo $? >"$work/rc"
        )
        read -r seconds rss <"$work/time" 2>/dev/null || { seconds=?; rss=?; }
        rc=$(cat "$work/rc")
        said=$(grep -v '^Command exited' "$work/err" | head -c 150 | head -n 1 | tr -d '\033\007')
        printf '%-28s %-8s %4s %7s %9s  %s\n' "$name" "$command" "$rc" "$seconds" "$rss" "$said"
    done
done
rm -rf "$work"
