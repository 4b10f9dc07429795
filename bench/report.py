"""Turns a benchmark run (bench.py's dict) into the machine description, a table, a .md/.json and a PNG.

Rates are decimal GB/s; "ours ÷ this" is ours' median rate over the row's (above 1: ours is faster).
No measuring here.
"""

import datetime
import json
import os
import platform
import socket
import statistics
import subprocess


def loadavg():
    return os.getloadavg()


def _first(path, prefix, sep=":"):
    """The value of the first line of a key-value file that starts with prefix."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(prefix):
                    return line.split(sep, 1)[1].strip()
    except OSError:
        pass
    return "?"


def _cmd(*argv):
    try:
        return subprocess.run(argv, check=False, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"


def machine(data_dir):
    """What the numbers depend on: CPU, cores, memory, kernel, file system, versions, load."""
    mem_kb = int(_first("/proc/meminfo", "MemTotal").split()[0])
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            thp = f.read().split("[")[1].split("]")[0]  # the bracketed choice is the one in force
    except (OSError, IndexError):
        thp = "?"
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    commit = _cmd("git", "-C", root, "rev-parse", "--short", "HEAD")
    dirty = _cmd("git", "-C", root, "status", "--porcelain", "--untracked-files=no")
    return {
        "host": socket.gethostname(),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "cpu": _first("/proc/cpuinfo", "model name") + ", " + _first("/proc/cpuinfo", "cache size") + " cache",
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "memory_gib": round(mem_kb / 2**20, 1),
        "kernel": platform.release(),
        "os": _first("/etc/os-release", "PRETTY_NAME", "=").strip('"'),
        "filesystem": _cmd("findmnt", "-no", "FSTYPE", "-T", data_dir),
        "transparent_hugepages": thp,
        "python": platform.python_version(),
        "commit": commit + ("+dirty" if dirty and dirty != "?" else ""),
        "loadavg_start": loadavg(),
    }


def _rates(row, key):
    """Per-repetition GB/s of one row (load rows: load + first touch; save rows: save)."""
    if key == "load":
        times = [a + b for a, b in zip(row["load"], row["touch"])]
    else:
        times = row["save"]
    return [row["bytes"] / t / 1e9 for t in times if t > 0]


def summarize(rows, key):
    """Adds median/min/max rates, and the ratio of ours' median to each row's, to every row."""
    for r in rows:
        if key in r and not r.get("missing") and not r.get("error"):
            rates = _rates(r, key)
            r["gbps"] = statistics.median(rates)
            r["gbps_min"], r["gbps_max"] = min(rates), max(rates)
            if key == "load":
                r["load_only_gbps"] = statistics.median(r["bytes"] / t / 1e9 for t in r["load"])
                r["touch_resident_s"] = statistics.median(r["touch_resident"])
    # Ratios within a group (the transport, for network rows "HTTP: ..."), against ours, else the reference.
    base_label = "ours"
    for group in {_group(r) for r in rows}:
        members = [r for r in rows if _group(r) == group and "gbps" in r]
        base = next((r for r in members if r["system"] == "ours" and r["label"].endswith("ours")), None)
        if base is None:  # ours missing: compare with the reference so the column still says something
            base = next((r for r in members if r["system"] == "ref"), None)
            base_label = "reference"
        for r in members:
            if base:
                r["ratio"] = base["gbps"] / r["gbps"]
    return base_label


def _group(row):
    return row["label"].split(":")[0] if ": " in row["label"] else ""


def _gb(x):
    return f"{x / 1e9:.2f}"


def _table(rows, key, title):
    base_label = summarize(rows, key)
    out = []
    if key == "load":
        out.append(
            f"| {title} | GB/s median | min–max | {base_label} ÷ this | GB/s w/o touch | "
            "touch s (resident) | peak RSS GB (private / mapped) |"
        )
        out.append("|---|---:|---:|---:|---:|---:|---:|")
    else:
        out.append(
            f"| {title} | GB/s median | min–max | {base_label} ÷ this | file GB | peak RSS GB over the state dict |"
        )
        out.append("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        if "gbps" not in r:
            why = r.get("missing") or r.get("error", "?")
            out.append(f"| {r['label']} | — | {why[:120]} |" + " |" * (4 if key == "load" else 3))
            continue
        ratio = f"{r['ratio']:.2f}×" if "ratio" in r else "—"
        rate = f"| {r['label']} | {r['gbps']:.2f} | {r['gbps_min']:.2f}–{r['gbps_max']:.2f} | {ratio}"
        peak = r.get("load_peak") or ((r["peak_rss"] or 0) - r["rss_base"])
        if key == "load":
            mem = (
                "—"
                if r["peak_rss"] is None
                else f"{_gb(peak)} ({_gb(r.get('anon_held', 0))} / {_gb(r.get('file_mapped', 0))})"
            )
            out.append(f"{rate} | {r['load_only_gbps']:.2f} | {r['touch_resident_s']:.3f} | {mem} |")
        else:
            out.append(f"{rate} | {_gb(r['file_bytes'])} | {_gb(peak)} |")
    return "\n".join(out)


def targets(run):
    """Issue 6's targets, checked against this run's medians (needs ours; call after table())."""
    load = {r["label"]: r for r in run["load"] if "gbps" in r}
    save = {r["label"]: r for r in run["save"] if "gbps" in r}
    ours, ours_save = load.get("ours"), save.get("ours")
    if not ours:
        return "Targets: not checked (ours did not run)."
    lines = []

    def check(what, got, want, ok):
        lines.append(f"- {what}: {got} (target {want}) — {'met' if ok else 'NOT met'}")

    ref = load.get("reference tensorizer 2.12.1")
    if ref:
        check("load vs reference", f"{ours['gbps'] / ref['gbps']:.2f}×", "≥ 3×", ours["gbps"] >= 3 * ref["gbps"])
    peers = [r for r in load.values() if r["system"] == "peer"]
    if peers:
        best = max(peers, key=lambda r: r["gbps"])
        check(
            f"load vs best peer ({best['label']})",
            f"{ours['gbps'] / best['gbps']:.2f}×",
            "≥ 1.3×",
            ours["gbps"] >= 1.3 * best["gbps"],
        )
        # Every load row's time includes one checksum pass, so no loader can beat that pass alone.
        touched = [r for r in load.values() if r.get("touch_resident_s", 0) > 1e-3]  # not cat (no result)
        if touched:
            ceiling = max(r["bytes"] / r["touch_resident_s"] / 1e9 for r in touched)
            lines.append(
                f"  (ceiling for any loader timed this way — bytes ÷ the fastest checksum pass over resident "
                f"memory: {ceiling:.1f} GB/s = {ceiling / best['gbps']:.2f}× {best['label']})"
            )
    mapped = load.get("ours, mmap=True")
    if mapped and ref and peers:
        lines.append(
            f"  (ours, mmap=True: {mapped['gbps'] / ref['gbps']:.2f}× reference, "
            f"{mapped['gbps'] / best['gbps']:.2f}× best peer)"
        )
    read = load.get("read() into fresh buffer")
    if read:
        check(
            "load vs read() into a fresh buffer",
            f"{ours['gbps'] / read['gbps']:.0%}",
            "≥ 90%",
            ours["gbps"] >= 0.9 * read["gbps"],
        )
    peak = ours.get("load_peak") or ours["peak_rss"] - ours["rss_base"]
    check(
        "load peak memory",
        f"{peak / ours['bytes']:.2f}× tensor bytes",
        "≤ 1.10×",
        peak <= 1.1 * ours["bytes"],
    )
    if ours_save and "reference tensorizer 2.12.1" in save:
        r = save["reference tensorizer 2.12.1"]
        check(
            "save vs reference",
            f"{ours_save['gbps'] / r['gbps']:.2f}×",
            "≥ 2×",
            ours_save["gbps"] >= 2 * r["gbps"],
        )
    if ours_save and "torch.save" in save:
        r = save["torch.save"]
        check(
            "save vs torch.save",
            f"{ours_save['gbps'] / r['gbps']:.2f}×",
            "> 1×",
            ours_save["gbps"] > r["gbps"],
        )
    return "Targets (issue 6), from the medians above:\n" + "\n".join(lines)


def table(run):
    parts = []
    if run.get("coldstart"):
        import coldstart

        parts.append(
            "Headline: a fresh process, one load with default options, first touch of every page\n\n"
            + coldstart.table(run["coldstart"])
        )
    if run.get("gpu"):
        import gpu

        parts.append("GPU: a fresh process per load into CUDA tensors\n\n" + gpu.table(run["gpu"]))
    parts.append(
        "Secondary: repeats inside one warmed-up process\n\n"
        + _table(run["load"], "load", "Load to CPU, page-cached file")
    )
    if run["save"]:
        parts.append(_table(run["save"], "save", "Save (to page cache, no fsync)"))
    if run.get("net_fresh"):
        parts.append(_table(run["net_fresh"], "load", "Network load (loopback), a fresh process per load, defaults"))
        cached = [r for r in run["net_fresh"] if r.get("page_cache_before")]
        if cached:
            parts.append(
                "Page cache before each load (read through first, untimed): "
                + "; ".join(
                    f"{r['label']} {min(r['page_cache_before']):.0%}–{max(r['page_cache_before']):.0%}" for r in cached
                )
            )
    if run["net"]:
        parts.append(_table(run["net"], "load", "Network load (loopback), repeats in one process"))
    return "\n\n".join(parts)


def _notes(run):
    m = run["machine"]
    return (
        f"Machine: {m['cpu']}, {m['usable_cores']} usable cores, {m['memory_gib']} GiB, Linux {m['kernel']} "
        f"({m['os']}), data on {m['filesystem']}, THP {m['transparent_hugepages']}, Python {m['python']}, "
        f"commit {m['commit']}; load average {m['loadavg_start'][0]:.2f} at start, "
        f"{m['loadavg_end'][0]:.2f} at end.\n\n"
        f"Test set: {run['size_gb']} GB of bf16/fp16 transformer-shaped tensors; each row a fresh process, "
        f"{run['warmup']} warm-up + {run['reps']} timed repetitions. Before the loads every file is dropped "
        "from the page cache and read back once with `cat`, so all start from the same page-cache state "
        "(the folios readahead makes, as after a download or a first read). Load times include one checksum pass "
        'over every byte of the result (so lazy mappings pay for their page faults); "touch s" is that '
        "pass on already-resident memory, to subtract if wanted. Peak RSS of a load is the process's "
        "high-water mark during its first load (the warm-up) less its size just before it (of a save: the process's "
        "maximum less its size with the state dict built); private / mapped is anonymous memory vs "
        "mapped file pages held by one loaded result."
    )


def _versions(run):
    seen = {}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    for r in run["load"] + run["save"]:
        if r.get("version"):
            where = os.path.dirname(r.get("module_file", "?")).replace(root, "")
            seen[f"{r['system']} {os.path.basename(where)}"] = f"{r['version']} ({where})"
        if r.get("torch"):
            seen["torch"] = r["torch"]
    return "\n".join(f"- {k}: {v}" for k, v in seen.items())


def chart(run, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sections = [(k, [r for r in run[k] if "gbps" in r]) for k in ("load", "save", "net") if run[k]]
    sections = [(k, rows) for k, rows in sections if rows]
    heights = [max(1.5, 0.35 * len(rows) + 0.8) for _, rows in sections]
    fig, axes = plt.subplots(
        len(sections), 1, figsize=(9, sum(heights)), gridspec_kw={"height_ratios": heights}, squeeze=False
    )
    colors = {"ours": "tab:red", "ref": "tab:blue", "peer": "tab:green", "baseline": "tab:gray"}
    titles = {"load": "Load to CPU (page cache), GB/s", "save": "Save, GB/s", "net": "Network load, GB/s"}
    for ax, (key, rows) in zip(axes[:, 0], sections):
        y = range(len(rows))
        med = [r["gbps"] for r in rows]
        err = [[m - r["gbps_min"] for m, r in zip(med, rows)], [r["gbps_max"] - m for m, r in zip(med, rows)]]
        ax.barh(y, med, xerr=err, color=[colors.get(r["system"], "k") for r in rows], capsize=3)
        ax.set_yticks(list(y), [r["label"] for r in rows], fontsize=8)
        ax.invert_yaxis()
        ax.set_title(titles[key], fontsize=10)
        for i, r in enumerate(rows):
            ax.text(r["gbps_max"], i, f"  {r['gbps']:.2f}", va="center", fontsize=7)
    m = run["machine"]
    fig.suptitle(f"{run['size_gb']} GB, {m['cpu']}, {m['usable_cores']} cores — median, min–max", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(run, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    m = run["machine"]
    stem = os.path.join(out_dir, f"{m['date'][:10]}-{m['host']}")
    with open(stem + ".json", "w") as f:
        json.dump(run, f, indent=1)
    md = (
        f"# Benchmark {m['date']} on {m['host']}\n\n{_notes(run)}\n\n{table(run)}\n\n{targets(run)}\n\n"
        f"Versions:\n{_versions(run)}\n\n![chart]({os.path.basename(stem)}.png)\n"
    )
    with open(stem + ".md", "w") as f:
        f.write(md)
    written = [stem + ".md", stem + ".json"]
    try:
        chart(run, stem + ".png")
        written.append(stem + ".png")
    except Exception as e:  # a chart failure must not lose the numbers
        print(f"bench: no chart ({e})")
    return written
