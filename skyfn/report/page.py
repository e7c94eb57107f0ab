"""The report as one self-contained HTML file (figures inlined as data: URIs) and as text."""
from __future__ import annotations

import base64
import html as _html
import time
from pathlib import Path
from typing import Any

from skyfn.report.analysis import STAGES

TITLES = {"throughput": "Throughput", "in_flight": "Tasks in flight and worker utilization",
          "stages": "Latency per stage", "stages_cdf": "Latency per stage (CDF)", "backlog": "Backlog per endpoint"}


def _fmt(v: Any, digits: int = 2) -> str:
    if isinstance(v, float):
        return "–" if v != v else f"{v:,.{digits}f}"
    return _html.escape(str(v))


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


def text(summary: dict[str, Any]) -> str:
    lines = [f"{summary['tasks']} tasks since {_when(summary['since'])}: "
             + ", ".join(f"{k} {v}" for k, v in sorted(summary["states"].items()))]
    if summary.get("window"):
        w, tp, ll, ut = summary["window"], summary["throughput"], summary["littles_law"], summary["utilization"]
        lines.append(f"window {w['seconds']:.2f} s; throughput mean {tp['mean_per_s']:.1f}/s, peak {tp['peak_per_s']:.1f}/s")
        lines.append(f"Little's law (steady middle half): L = {_fmt(ll['L_mean_in_flight'])}, "
                     f"lambda*W = {_fmt(ll['lambda_W'])}, ratio {_fmt(ll['ratio'])}")
        lines.append(f"worker utilization mean {ut['mean'] * 100:.0f}%, peak {ut['peak'] * 100:.0f}% "
                     f"of {ut['workers']:.0f} workers ({ut['workers_from']})")
        wt = summary.get("waiting") or {}
        if wt.get("tasks"):
            lines.append(f"{wt['tasks']} tasks waited for their inputs (stage 'waiting', not counted in 'service'); "
                         f"peak {wt['peak']:.1f} waiting at once (bin average)")
        lines.append("stage (ms)   " + "  ".join(f"{s:>9}" for s in ("p50", "p95", "mean")))
        for st in STAGES:
            v = summary["stages_ms"][st]
            lines.append(f"{st:<12} " + "  ".join(f"{_fmt(v[k]):>9}" for k in ("p50", "p95", "mean")))
    return "\n".join(lines)


def html(summary: dict[str, Any], images: dict[str, Any], standalone: bool = True) -> str:
    rows = "".join(f"<tr><th>{st}</th>" + "".join(f"<td>{_fmt(summary['stages_ms'][st][k])}</td>"
                                                  for k in ("p50", "p95", "p99", "mean")) + "</tr>"
                   for st in STAGES) if summary.get("window") else ""
    eps = "".join(f"<tr><th>{_html.escape(name)}</th><td>{e['tasks']}</td><td>{_fmt(e['peak_backlog'], 1)}</td>"
                  + "".join(f"<td>{_fmt(e['stages_mean_ms'][st])}</td>" for st in STAGES) + "</tr>"
                  for name, e in summary["endpoints"].items())
    figs = []
    for name, img in images.items():
        data = img.read_bytes() if isinstance(img, Path) else img
        figs.append(f'<figure><img alt="{TITLES.get(name, name)}" src="data:image/png;base64,'
                    f'{base64.b64encode(data).decode()}"><figcaption>{TITLES.get(name, name)}</figcaption></figure>')
    body = (f"<h1>skyfn report</h1><pre>{_html.escape(text(summary))}</pre>"
            f"<h2>Latency per stage (ms)</h2><table><tr><th></th><th>p50</th><th>p95</th><th>p99</th><th>mean</th></tr>{rows}</table>"
            f"<h2>Endpoints</h2><table><tr><th></th><th>tasks</th><th>peak backlog</th>"
            + "".join(f"<th>{st} (ms)</th>" for st in STAGES) + f"</tr>{eps}</table>" + "".join(figs))
    if not standalone:
        return f"<div class='skyfn-report'>{body}</div>"
    style = ("body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;color:#222}"
             "table{border-collapse:collapse;margin:.5rem 0}td,th{border:1px solid #ccc;padding:.2rem .5rem;"
             "text-align:right}figure{margin:1rem 0}img{max-width:100%}pre{background:#f6f6f6;padding:.6rem}")
    return (f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>skyfn report</title>"
            f"<style>{style}</style></head><body>{body}</body></html>")
