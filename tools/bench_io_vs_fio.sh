#!/usr/bin/env bash
# Compares `strata bench io` with fio (--ioengine=io_uring --direct=1) on the same file, block
# size, queue depth and job count, alternating the two tools, and prints a markdown table of
# median GB/s and the Strata/fio ratio. fio is a benchmark tool, not a Strata dependency: this
# script installs it with apt-get when it is missing.
#
# Usage: tools/bench_io_vs_fio.sh DIR [REPS] [FILE_SIZE]
#   DIR        directory on the drive to test (O_DIRECT must work there); a file is made and
#              removed there
#   REPS       repetitions per cell (default 5); odd ones run fio first, even ones Strata first
#   FILE_SIZE  benchmark file size, fio syntax (default 2G)
# Environment: STRATA=path/to/strata (default build/strata), BLOCKS="1M 8M", DEPTHS="8 32",
#              RAW=file to keep the per-run figures (TSV) in, FIO_EXTRA=more fio options.
#              Strata's staging buffers are 2 MiB transparent huge pages; to give fio the same
#              (physically contiguous buffers), reserve huge pages and pass
#              FIO_EXTRA=--iomem=shmhuge, e.g. echo 160 > /proc/sys/vm/nr_hugepages (enough for
#              queue depth x block size; set it back to 0 afterwards).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="${1:?usage: tools/bench_io_vs_fio.sh DIR [REPS] [FILE_SIZE]}"
reps="${2:-5}"
size="${3:-2G}"
strata="${STRATA:-$root/build/strata}"
blocks="${BLOCKS:-1M 8M}"
depths="${DEPTHS:-8 32}"

if ! command -v fio >/dev/null 2>&1; then
  echo "bench_io_vs_fio: installing fio" >&2
  sudo_cmd=()
  [ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends fio >&2
fi
[ -x "$strata" ] || { echo "bench_io_vs_fio: no strata program at $strata (build first)" >&2; exit 2; }

file="$dir/strata-vs-fio.dat"
raw="${RAW:-$(mktemp)}"
trap 'rm -f "$file"' EXIT
bytes=$(python3 -c "import sys; u={'K':1<<10,'M':1<<20,'G':1<<30}; s=sys.argv[1]; print(int(s[:-1])*u[s[-1]] if s[-1] in u else int(s))" "$size")

echo "bench_io_vs_fio: fio $(fio --version) ${FIO_EXTRA:-}, kernel $(uname -r), file $file ($size)" >&2
# Lay the file out once with real data so neither tool measures unwritten extents.
"$strata" bench io --file "$file" --file-size "$bytes" --mode write --no-copy-path --json >/dev/null

run_fio() {  # mode bs qd -> GB/s
  fio --name=bench --filename="$file" --size="$bytes" --rw="$1" --bs="$2" --iodepth="$3" \
    --ioengine=io_uring --direct=1 --numjobs=1 ${FIO_EXTRA:-} --output-format=json |
    python3 -c "import json,sys; j=json.load(sys.stdin)['jobs'][0]; print(j['$1']['bw_bytes']/1e9)"
}
run_strata() {  # mode bs qd -> GB/s
  local b
  b=$(python3 -c "print({'1M':1<<20,'8M':8<<20,'4M':4<<20,'2M':2<<20,'16M':16<<20,'128K':128<<10,'256K':256<<10,'512K':512<<10}['$2'])")
  "$strata" bench io --file "$file" --file-size "$bytes" --mode "$1" --block-size "$b" \
    --queue-depth "$3" --threads 1 --no-copy-path --json |
    python3 -c "import json,sys; print(json.load(sys.stdin)['$1_gbps'])"
}

: >"$raw"
for bs in $blocks; do
  for qd in $depths; do
    for rep in $(seq 1 "$reps"); do
      for mode in read write; do
        if [ $((rep % 2)) -eq 1 ]; then order="fio strata"; else order="strata fio"; fi
        for tool in $order; do
          gbps=$("run_$tool" "$mode" "$bs" "$qd")
          printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$bs" "$qd" "$mode" "$rep" "$tool" "$gbps" >>"$raw"
          echo "  $bs qd$qd $mode rep$rep $tool: $gbps GB/s" >&2
        done
      done
    done
  done
done

python3 - "$raw" <<'PY'
import collections, statistics, sys
rows = [line.split('\t') for line in open(sys.argv[1]).read().splitlines() if line]
cells = collections.defaultdict(lambda: collections.defaultdict(dict))
for bs, qd, mode, rep, tool, gbps in rows:
    cells[(bs, int(qd), mode)][int(rep)][tool] = float(gbps)
print("| block | QD | jobs | pass | fio GB/s (median) | Strata GB/s (median) | Strata/fio (medians) | Strata/fio (median of paired runs) |")
print("|---|---|---|---|---|---|---|---|")
order = {"read": 0, "write": 1}
for (bs, qd, mode) in sorted(cells, key=lambda k: (int(k[0][:-1]), k[1], order[k[2]])):
    reps = cells[(bs, qd, mode)]
    fio = statistics.median(r["fio"] for r in reps.values())
    st = statistics.median(r["strata"] for r in reps.values())
    paired = statistics.median(r["strata"] / r["fio"] for r in reps.values())
    print(f"| {bs}iB | {qd} | 1 | {mode} | {fio:.3f} | {st:.3f} | {st / fio:.1%} | {paired:.1%} |")
PY
echo "bench_io_vs_fio: per-run figures in $raw" >&2
