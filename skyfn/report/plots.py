"""The report's figures (matplotlib, Agg backend, imported only here): throughput, tasks in
flight (and waiting for inputs, when any did) with worker utilization, latency per stage
(the waiting stage among them) as stacked bars and as CDFs, and the backlog per endpoint.
`render` returns name -> PNG path (when written to a directory) or PNG bytes."""
from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Optional

from skyfn.report.analysis import STAGES

COLORS = {"service": "#4c72b0", "waiting": "#937860", "queue": "#dd8452", "dispatch": "#55a868", "run": "#c44e52",
          "return": "#8172b3"}
FIGURES = ("throughput", "in_flight", "stages", "stages_cdf", "backlog")


def render(summary: dict[str, Any], series: dict[str, Any], out_dir: Optional[Path]) -> dict[str, Any]:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    out: dict[str, Any] = {}
    if not series:
        return out
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
    for name in FIGURES:
        fig = globals()[f"_{name}"](plt, summary, series)
        fig.tight_layout()
        if out_dir is not None:
            path = out_dir / f"{name}.png"
            fig.savefig(path, dpi=110)
            out[name] = path
        else:
            buf = io.BytesIO()
            fig.savefig(buf, format="png", dpi=110)
            out[name] = buf.getvalue()
        plt.close(fig)
    return out


def _throughput(plt, summary, s):
    fig, ax = plt.subplots(figsize=(7.5, 3.2))
    ax.step(s["t"], s["completions_per_s"], where="mid", color="#4c72b0")
    ax.fill_between(s["t"], s["completions_per_s"], step="mid", alpha=0.25, color="#4c72b0")
    ax.set(xlabel="seconds since the first task", ylabel="tasks completed / s",
           title=f"Throughput (mean {summary['throughput']['mean_per_s']:.0f}/s, "
                 f"peak {summary['throughput']['peak_per_s']:.0f}/s)")
    ax.grid(alpha=0.3)
    return fig


def _in_flight(plt, summary, s):
    fig, ax = plt.subplots(figsize=(7.5, 3.2))
    ax.plot(s["t"], s["in_flight"], label="in flight (created, not final)", color="#dd8452")
    ax.plot(s["t"], s["running"], label="running", color="#55a868")
    if summary.get("waiting", {}).get("tasks"):
        ax.plot(s["t"], s["waiting"], label="waiting for inputs", color=COLORS["waiting"])
    ax.set(xlabel="seconds since the first task", ylabel="tasks (time average)")
    ax2 = ax.twinx()
    ax2.plot(s["t"], s["utilization"] * 100, color="#c44e52", ls="--", label="worker utilization")
    ax2.set_ylabel("utilization %")
    ax2.set_ylim(0, max(105, float(s["utilization"].max() * 100) + 5))
    ll = summary["littles_law"]
    ax.set_title(f"In flight and utilization (Little: L={ll['L_mean_in_flight']:.1f}, "
                 f"λW={ll['lambda_W']:.1f}, ratio {ll['ratio']:.2f})")
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="upper right", fontsize=8)
    ax.grid(alpha=0.3)
    return fig


def _stages(plt, summary, s):
    fig, ax = plt.subplots(figsize=(7.5, 3.2))
    eps = list(summary["endpoints"].items())
    labels = ["all"] + [name for name, _ in eps]
    values = [{st: summary["stages_ms"][st]["mean"] for st in STAGES}] + [e["stages_mean_ms"] for _, e in eps]
    bottom = [0.0] * len(labels)
    for st in STAGES:
        heights = [0.0 if v[st] != v[st] else v[st] for v in values]  # NaN -> 0
        ax.bar(labels, heights, bottom=bottom, label=st, color=COLORS[st])
        bottom = [b + h for b, h in zip(bottom, heights)]
    ax.set(ylabel="mean latency (ms)", title="Latency per stage (mean, stacked)")
    ax.legend(fontsize=8, ncol=len(STAGES), loc="upper center", bbox_to_anchor=(0.5, -0.12))
    ax.grid(axis="y", alpha=0.3)
    return fig


def _stages_cdf(plt, summary, s):
    import numpy as np

    fig, ax = plt.subplots(figsize=(7.5, 3.2))
    for st in STAGES:
        v = s["stage_values_ms"][st]
        if v.size:
            ax.plot(np.maximum(v, 1e-3), np.arange(1, v.size + 1) / v.size, label=st, color=COLORS[st])
    ax.set_xscale("log")
    ax.set(xlabel="ms (log)", ylabel="fraction of tasks", title="Latency per stage (CDF)", ylim=(0, 1.02))
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    return fig


def _backlog(plt, summary, s):
    fig, ax = plt.subplots(figsize=(7.5, 3.2))
    for name, values in s["backlog"].items():
        ax.plot(s["t"], values, label=name)
    ax.set(xlabel="seconds since the first task", ylabel="tasks queued (time average)",
           title="Backlog per endpoint (queued, not yet dispatched)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return fig
