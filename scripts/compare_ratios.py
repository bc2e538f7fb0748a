#!/usr/bin/env python3
"""router-index's speed over the best peer's on every row of `compare`'s
output, the median of several runs of each mode, with the range.

    scripts/compare_ratios.py --idle idle1.txt idle2.txt ... --loaded loaded1.txt ...

Latencies are compared as the best peer's time over router-index's,
throughputs as router-index's over the best peer's: above 1, router-index
is ahead.
"""
import re
import statistics
import sys

OURS = "router-index"


def number(cell):
    m = re.match(r"([0-9.]+)\s*([kM]?)", cell.strip())
    if not m:
        return None
    scale = {"": 1, "k": 1e3, "M": 1e6}[m.group(2)]
    return float(m.group(1)) * scale


def rows(path):
    """{row name: ratio} for one run of compare."""
    out = {}
    title, head, table = None, None, []

    def flush():
        if not title or not head:
            return
        ours = next((r for r in table if r[0] == OURS), None)
        peers = [r for r in table if r[0] != OURS]
        if ours is None or not peers:
            return
        for j, h in enumerate(head):
            if j == 0:
                continue
            lower = "(us)" in h
            higher = "/s" in h
            if not (lower or higher):
                continue
            mine = number(ours[j])
            theirs = [number(p[j]) for p in peers]
            theirs = [t for t in theirs if t]
            if not mine or not theirs:
                continue
            best = min(theirs) if lower else max(theirs)
            ratio = best / mine if lower else mine / best
            out[f"{title} {h}"] = ratio

    for line in open(path):
        line = line.rstrip("\n")
        if line.startswith("### "):
            flush()
            title = re.sub(r" \(.*", "", line[4:])
            head, table = None, []
        elif line.startswith("|") and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if head is None:
                head = cells
            else:
                table.append(cells)
    flush()
    return out


def main():
    modes, mode = {"idle": [], "loaded": []}, None
    for a in sys.argv[1:]:
        if a in ("--idle", "--loaded"):
            mode = a[2:]
        elif mode:
            modes[mode].append(rows(a))
        else:
            sys.exit(__doc__)
    names = []
    for runs in modes.values():
        for r in runs:
            names += [n for n in r if n not in names]

    def cell(runs, n):
        xs = sorted(r[n] for r in runs if n in r)
        if not xs:
            return "-"
        return f"{statistics.median(xs):.2f}x ({xs[0]:.2f}-{xs[-1]:.2f})"

    print("| row | idle (median, range) | loaded (median, range) |")
    print("|---|---:|---:|")
    for n in names:
        print(f"| {n} | {cell(modes['idle'], n)} | {cell(modes['loaded'], n)} |")


if __name__ == "__main__":
    main()
