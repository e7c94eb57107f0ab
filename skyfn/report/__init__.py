"""Reports built from task events (DESIGN.md 11): ``skyfn report`` and ``Client.report()``.

Light to import; numpy and matplotlib load only when a report is built
(skyfn/report/analysis.py computes, plots.py draws PNGs, page.py writes one
self-contained HTML file).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

from skyfn.report.since import parse_since

__all__ = ["Report", "build", "parse_since"]

PathLike = Union[str, "os.PathLike[str]"]


@dataclass
class Report:
    """What a report found (``summary``), its series, and the files it wrote."""
    summary: dict[str, Any]
    series: dict[str, Any] = field(repr=False)
    pngs: dict[str, Path] = field(default_factory=dict)
    html: Optional[Path] = None

    def _repr_html_(self) -> str:  # notebooks
        from skyfn.report import page, plots

        images = plots.render(self.summary, self.series, None)
        return page.html(self.summary, images, standalone=False)

    def text(self) -> str:
        from skyfn.report.page import text

        return text(self.summary)


def build(client, since=None, endpoint: Optional[str] = None, html: Optional[PathLike] = None,
          png_dir: Optional[PathLike] = None, limit: int = 20_000) -> Report:
    """Fetch the caller's tasks since `since` (GET /tasks) and the endpoints, analyse the
    events, and write PNGs to `png_dir` and/or one HTML file to `html`."""
    from skyfn.report import analysis

    start = parse_since(since)
    endpoints = client.list_endpoints()
    endpoint_id = None
    if endpoint:
        endpoint_id = client.endpoint_id(endpoint)
    tasks = client.tasks(since=start, endpoint_id=endpoint_id, limit=limit)
    names = {e["endpoint_id"]: e.get("name") or e["endpoint_id"] for e in endpoints}
    summary, series = analysis.analyse(tasks, endpoints, since=start, names=names)
    report = Report(summary, series)
    if png_dir is not None or html is not None:
        from skyfn.report import page, plots

        images = plots.render(summary, series, Path(png_dir) if png_dir is not None else None)
        report.pngs = {k: v for k, v in images.items() if isinstance(v, Path)}
        if html is not None:
            report.html = Path(html)
            report.html.parent.mkdir(parents=True, exist_ok=True)
            report.html.write_text(page.html(summary, images, standalone=True))
    return report
