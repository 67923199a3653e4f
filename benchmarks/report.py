"""Turns a suite's results into ``results.json`` (every raw number), ``results.md`` (tables) and PNG plots.

``docs/benchmarks.md`` embeds ``results.md`` between markers, so the prose
around the tables stays hand-written and the tables are always the latest run.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from pathlib import Path
from typing import Any

PLOT_NOTE = "plots skipped: matplotlib is not installed (pip install -e .[bench])"


def write_json(results: dict[str, Any], out: Path) -> Path:
    path = out / "results.json"
    path.write_text(json.dumps(results, indent=1, default=_jsonable, allow_nan=True) + "\n")
    return path


def _jsonable(x: Any) -> Any:
    if hasattr(x, "to_json"):
        return x.to_json()
    return str(x)


def _f(x: float | None, digits: int = 2) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return f"{x:.{digits}f}"


def _amount(x: float) -> str:
    """A total in prose: three significant digits, whole numbers with separators from 100 up."""
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def _err(x: float) -> str:
    return "inf (shape differs)" if math.isinf(x) else f"{x:.1e}"


def _ok(systems: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [s for s in systems if s["status"] == "ok"]


def workload_tables(w: dict[str, Any], plots: list[str], peak_gflops: float | None = None) -> list[str]:
    lines = [f"### {w['name']}", "", f"{w['description']}. {len(w['stream'])} shapes, {w['repeats']} interleaved rounds per shape; "
             f"measured in {w['seconds']:.0f} s.", ""]
    lines += [
        "| system | compilations | first result (s) | cold compile (s) | warm start (s) | stream end-to-end (s) | "
        "speedup vs eager (geomean) | peak memory (MB) | max rel. error |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in w["systems"]:
        if s["status"] != "ok":
            continue
        speed = f"{s['geomean_speedup']:.2f}x ± {s['geomean_speedup_spread'] * 100:.0f}%" if s["geomean_speedup"] else "—"
        lines.append(
            f"| {s['system']} | {s['compilations']} | {_f(s['first_result_s'])} | {_f(s['cold_compile_s'])} | {_f(s['warm_start_s'])} | "
            f"{_f(s['stream_s'])} | {speed} | {_f(s['peak_memory_mb'], 0)} | {_err(s['max_rel_err'])} |"
        )
    lines.append("")
    for s in w["systems"]:
        if s["status"] != "ok":
            lines.append(f"- **{s['system']}** {s['status']}: {s['reason']}")
        for note in s["notes"]:
            lines.append(f"- {s['system']}: {note}")
        prof = s.get("profile")
        if prof and "kernels" in prof:
            k = prof["kernels"]
            shape = "x".join(str(v) for v in prof.get("shape", {}).values())
            lines.append(
                f"- {s['system']} at {shape}: {k.get('memory_bound', 0)} memory-bound kernels, {k.get('library', 0)} library calls, "
                f"{k.get('fallback', 0)} fallbacks, workspace {prof['workspace_bytes'] / 2**20:.1f} MB ({prof.get('executor', '')} executor)"
            )
    lines.append("")
    lines += _compute_roof(w, peak_gflops)
    lines += _per_shape_table(w)
    for p in plots:
        lines += [f"![{Path(p).stem}]({p})", ""]
    return lines


def _compute_roof(w: dict[str, Any], peak_gflops: float | None) -> list[str]:
    """How close each system's stream comes to the machine's FMA peak, and the speedup that peak allows.

    A shape's matmuls and convolutions, computed the direct way, cannot take less than flop / peak
    seconds, so eager's median over that is the most a system doing that arithmetic could gain at
    that shape, with every other op free. A fast algorithm (the RAL's Winograd convolutions) does
    less arithmetic and can pass it: GFLOP/s here count the direct form's work.
    """
    ok = [s for s in _ok(w["systems"]) if s["median_ms"]]
    eager = next((s for s in ok if s["system"] == "eager"), None)
    gflop = w.get("gflop") or []
    if not peak_gflops or eager is None or len(gflop) != len(eager["median_ms"]) or not all(g > 0 for g in gflop):
        return []
    floor_ms = [g / peak_gflops * 1e3 for g in gflop]
    ceiling = math.exp(statistics.fmean(math.log(e / f) for e, f in zip(eager["median_ms"], floor_ms)))
    lines = [
        f"Compute roof: the stream's matmuls and convolutions are {_amount(sum(gflop))} GFLOP (torch.utils.flop_counter on eager); "
        f"at this machine's FMA peak ({peak_gflops:.0f} GFLOP/s) they alone take {_amount(sum(floor_ms))} ms per pass, so no system "
        f"computing them the direct way can be more than **{ceiling:.2f}x** faster than eager here (geomean over shapes, every other "
        "op free; Winograd convolutions do less arithmetic and can pass it, and their GFLOP/s count the direct form's work).",
        "",
        "| system | GFLOP/s over the stream | of FMA peak | speedup vs eager | of the roof's speedup |",
        "|---|---:|---:|---:|---:|",
    ]
    for s in ok:
        rate = sum(gflop) / (sum(s["median_ms"]) / 1e3)
        speed = s["geomean_speedup"]
        lines.append(
            f"| {s['system']} | {rate:.0f} | {rate / peak_gflops * 100:.0f}% | {_f(speed)}x | {_f(speed / ceiling * 100 if speed else None, 0)}% |"
        )
    return lines + [""]


def _per_shape_table(w: dict[str, Any]) -> list[str]:
    ok = [s for s in _ok(w["systems"]) if s["median_ms"]]
    if not ok:
        return []
    dims = list(w["stream"][0])
    lines = [
        "<details><summary>steady-state median latency per shape (ms; ± is the relative interquartile range)</summary>",
        "",
        "| " + " x ".join(dims) + " | " + " | ".join(s["system"] for s in ok) + " |",
        "|---|" + "---:|" * len(ok),
    ]
    for i, shape in enumerate(w["stream"]):
        cells = [f"{s['median_ms'][i]:.2f} ±{s['rel_iqr'][i] * 100:.0f}%" for s in ok]
        lines.append("| " + "x".join(str(v) for v in shape.values()) + " | " + " | ".join(cells) + " |")
    lines += ["", "</details>", ""]
    return lines


def machine_tables(m: dict[str, Any] | None) -> list[str]:
    if not m:
        return []
    lines = ["### Limits of the machine", ""]
    contention = m.get("contention", {})
    if any(c.get("contended") for c in contention.values()):
        lines += ["**Warning: another process competed for the cores during this run** (the contention probe saw a "
                  "multi-threaded LayerNorm slower than a one-thread one); rerun for quotable figures.", ""]
    bw = m.get("bandwidth")
    if bw:
        lines += ["| STREAM kernel (torch, all threads) | best GB/s | median GB/s | spread | one thread, best GB/s |", "|---|---:|---:|---:|---:|"]
        for name, k in bw["kernels"].items():
            one = bw.get("one_thread", {}).get(name, {})
            lines.append(f"| {name} | {_f(k['best_gbs'], 1)} | {_f(k['median_gbs'], 1)} | {_f(k['spread'] * 100, 0)}% | {_f(one.get('best_gbs'), 1)} |")
        lines += ["", f"Bandwidth used as the machine's limit below: **{_f(bw['headline_gbs'], 1)} GB/s** (best {bw['headline_kernel']}, "
                  f"arrays of {bw['array_mib']} MiB).", ""]
    compute = m.get("compute")
    if compute:
        one = compute["one_thread"]
        how = (f"{compute['threads']} x the one-thread figure: the all-thread runs reached only {_f(compute['all_threads']['best_gflops'], 0)}, "
               "another process held a core" if compute.get("contended") else f"best of {compute['runs']} runs, median {_f(compute['all_threads']['median_gflops'], 0)}")
        lines += [f"Compute limit: **{_f(compute['peak_gflops'], 0)} GFLOP/s** float32 FMA peak on {compute['threads']} threads "
                  f"({compute['vector_floats']}-float vectors; {how}; one thread {_f(one['best_gflops'], 0)}).", ""]
    gemm = m.get("gemm")
    if gemm:
        lines += ["| GEMM (float32, torch.matmul) | median GFLOP/s | best GFLOP/s | spread |", "|---|---:|---:|---:|"]
        for row in gemm["shapes"]:
            lines.append(f"| {row['name']} | {_f(row['median_gflops'], 0)} | {_f(row['best_gflops'], 0)} | {_f(row['spread'] * 100, 0)}% |")
        lines += ["", f"Peak: **{_f(gemm['peak_gflops'], 0)} GFLOP/s** ({gemm['peak_shape']}).", ""]
    mb = m.get("memory_bound")
    if mb:
        lines += [
            "| memory-bound op | size | eager GB/s | disc GB/s | eager / limit | disc / limit | disc speedup | disc max rel. error |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        for name, k in mb["kernels"].items():
            for r in k["sizes"]:
                size = " x ".join("x".join(str(d) for d in shape) for shape in r["input_shapes"][:1])
                e, d = r["eager"], r["disc"]
                lines.append(
                    f"| {name} | {size} | {_f(e['gbs'], 1)} | {_f(d['gbs'], 1)} | {_f(e['fraction_of_peak'] * 100, 0)}% | "
                    f"{_f(d['fraction_of_peak'] * 100, 0)}% | {_f(r['disc_speedup'], 2)}x | {_err(r['max_rel_error'])} |"
                )
        lines += ["", "GB/s = ideal bytes (each input and parameter read once, the output written once) / median time; "
                  "sizes that fit in cache can exceed the DRAM limit.", ""]
    return lines


def markdown(results: dict[str, Any], plots: dict[str, list[str]]) -> str:
    meta = results["meta"]
    lines = [
        f"## Suite `{meta['suite']}` — {meta['date']}",
        "",
        f"`{meta['command']}` on {meta['cpu']} ({meta['threads']} threads), device `{meta['device']}`, dtype {meta['dtype']}; "
        f"{meta['duration_s'] / 60:.1f} min in all.",
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()) + ".",
        "",
    ]
    if meta.get("skipped"):
        lines += ["Systems not run: " + "; ".join(f"{k} ({v})" for k, v in meta["skipped"].items()) + ".", ""]
    if meta.get("plot_note"):
        lines += [meta["plot_note"], ""]
    machine = results.get("machine") or {}
    peak = (machine.get("compute") or {}).get("peak_gflops") if meta.get("device", "cpu") == "cpu" else None
    lines += machine_tables(machine)
    for w in results["workloads"]:
        lines += workload_tables(w, plots.get(w["name"], []), peak)
    return "\n".join(lines) + "\n"


def embed_in_docs(doc: Path, suite: str, md: str, rel_to: Path) -> None:
    """Replace the ``<!-- results:SUITE -->`` block of ``doc`` (appended if absent) with ``md``."""
    begin, end = f"<!-- results:{suite} -->", f"<!-- /results:{suite} -->"
    # Image links in results.md are relative to its folder; in the doc they must be relative to the doc.
    md = re.sub(r"\]\((plots/[^)]+)\)", lambda m: f"]({(rel_to / m.group(1)).as_posix()})", md)
    block = f"{begin}\n{md}{end}"
    text = doc.read_text() if doc.exists() else "# Benchmarks\n"
    if begin in text and end in text:
        text = text[: text.index(begin)] + block + text[text.index(end) + len(end) :]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    doc.write_text(text)


# --------------------------------------------------------------------------- plots


def make_plots(results: dict[str, Any], out: Path) -> tuple[dict[str, list[str]], str]:
    """Three PNGs per workload; returns {workload: [relative paths]} and a note if plotting was skipped."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return {}, PLOT_NOTE
    (out / "plots").mkdir(parents=True, exist_ok=True)
    made: dict[str, list[str]] = {}
    for w in results["workloads"]:
        ok = [s for s in _ok(w["systems"]) if s["median_ms"]]
        if not ok:
            continue
        paths = []
        for kind, draw in (("latency", _plot_latency), ("cumulative", _plot_cumulative), ("speedup", _plot_speedup)):
            fig, ax = plt.subplots(figsize=(8, 4.2), dpi=90)
            draw(ax, w, ok)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7, loc="best")
            fig.tight_layout()
            rel = f"plots/{w['name']}-{kind}.png"
            fig.savefig(out / rel)
            plt.close(fig)
            paths.append(rel)
        made[w["name"]] = paths
    return made, ""


_MARKERS = "os^vD<>pXh*"


def _plot_latency(ax: Any, w: dict[str, Any], ok: list[dict[str, Any]]) -> None:
    order = sorted(range(len(w["x"])), key=lambda i: w["x"][i])
    for j, s in enumerate(ok):
        ax.plot([w["x"][i] for i in order], [s["median_ms"][i] for i in order], marker=_MARKERS[j % len(_MARKERS)], ms=4, lw=1, label=s["system"])
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(w["x_label"])
    ax.set_ylabel("median latency (ms)")
    ax.set_title(f"{w['name']}: steady-state latency")


def _plot_cumulative(ax: Any, w: dict[str, Any], ok: list[dict[str, Any]]) -> None:
    for s in ok:
        total = s["prepare_s"]
        ys = [total]
        for t in s["cold_call_s"]:
            total += t
            ys.append(total)
        ax.step(range(len(ys)), ys, where="post", label=f"{s['system']} ({s['compilations']} compiles)")
    ax.set_yscale("symlog", linthresh=1.0)
    ax.set_xlabel("requests served (stream order)")
    ax.set_ylabel("cumulative wall time incl. compilation (s)")
    ax.set_title(f"{w['name']}: what a user waits for over the stream")


def _plot_speedup(ax: Any, w: dict[str, Any], ok: list[dict[str, Any]]) -> None:
    peers = [s for s in ok if s["system"] != "eager" and s["speedup"]]
    n = len(w["stream"])
    width = 0.8 / max(len(peers), 1)
    for j, s in enumerate(peers):
        ax.bar([i + j * width for i in range(n)], s["speedup"], width=width, label=s["system"])
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(n)])
    ax.set_xticklabels(["x".join(str(v) for v in sh.values()) for sh in w["stream"]], rotation=70, fontsize=6)
    ax.set_ylabel("speedup over eager (median)")
    ax.set_title(f"{w['name']}: speedup per shape")
