#!/usr/bin/env python3
"""router-index's speed over the best peer's on every row of `compare`'s
output, the median of several runs of each mode, with the range.

    scripts/compare_ratios.py --idle idle1.txt idle2.txt ... --loaded loaded1.txt ...
    scripts/compare_ratios.py --tables idle.txt loaded.txt

Latencies and bytes are compared as the best peer's over router-index's,
throughputs as router-index's over the best peer's: above 1, router-index
is ahead. `--tables` instead merges one idle and one loaded run into the
tables of docs/BENCHMARKS.md: both modes' latencies, the idle run's other
columns.
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


def tables(path):
    """[(title line, header cells, [row cells], trailing text lines)]."""
    out = []
    for line in open(path):
        line = line.rstrip("\n")
        if line.startswith("### "):
            out.append([line[4:], None, [], []])
        elif not out:
            continue
        elif line.startswith("|---"):
            continue
        elif line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if out[-1][1] is None:
                out[-1][1] = cells
            else:
                out[-1][2].append(cells)
        elif line.strip():
            out[-1][3].append(line.strip())
    return out


def merged(idle, loaded):
    for (title, head, body, notes), (_, lhead, lbody, lnotes) in zip(tables(idle), tables(loaded)):
        # W3's title counts the trace's unreadable lines; none is no news.
        print(f"#### {title.replace(' (0 unreadable lines)', '')}\n")
        if head[0] != "index":
            print("| " + " | ".join(head) + " |")
            print("|" + "---:|" * len(head))
            for r in body:
                print("| " + " | ".join(r) + " |")
            print()
            continue
        lat = [j for j, h in enumerate(head) if "(us)" in h]
        rest = [j for j in range(1, len(head)) if j not in lat]
        cols = [f"idle {head[j]}" for j in lat] + [f"loaded {head[j]}" for j in lat]
        cols += [f"{head[j]} (idle)" for j in rest]
        print("| index | " + " | ".join(cols) + " |")
        print("|---|" + "---:|" * len(cols))
        lrows = {r[0]: r for r in lbody}
        for r in body:
            lr = lrows.get(r[0], ["-"] * len(r))
            cells = [r[j] for j in lat] + [lr[j] for j in lat] + [r[j] for j in rest]
            print(f"| {r[0]} | " + " | ".join(cells) + " |")
        for n, ln in zip(notes, lnotes + [""] * len(notes)):
            extra = f" (loaded run: {ln.split(': ', 1)[-1]})" if ln else ""
            print(f"\n{n}{extra}")
        print()


def rows(path):
    """{row name: ratio} for one run of compare."""
    out = {}
    for title, head, body, _ in tables(path):
        if not head or head[0] != "index":
            continue
        title = re.sub(r" \(.*", "", title)
        ours = next((r for r in body if r[0] == OURS), None)
        peers = [r for r in body if r[0] != OURS]
        if ours is None or not peers:
            continue
        for j, h in enumerate(head[1:], start=1):
            # Memory counts as a latency does: less is better.
            lower, higher = "(us)" in h or "bytes per" in h, "/s" in h
            if not (lower or higher):
                continue
            mine = number(ours[j])
            theirs = [t for t in (number(p[j]) for p in peers) if t]
            if not mine or not theirs:
                continue
            best = min(theirs) if lower else max(theirs)
            out[f"{title} {h}"] = best / mine if lower else mine / best
    return out


def main():
    if sys.argv[1:2] == ["--tables"] and len(sys.argv) == 4:
        merged(sys.argv[2], sys.argv[3])
        return
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
