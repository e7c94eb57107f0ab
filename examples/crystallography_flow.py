"""Serial crystallography as a skyfn flow (the funcX paper's SSX pipeline), on the
embedded runtime: acquire images -> process each image (spot finding and indexing, a
Map over the images) -> solve (merge the indexed images into one unit cell) -> extract
metadata and plot, in parallel.

The scientific functions are stand-ins that do real numpy work: `acquire` renders
synthetic still diffraction images (Bragg spots of a rotated 2D lattice with random
structure-factor intensities, Poisson background, a beamstop), `process_image` finds
spots (robust threshold, connected components, centroids) and indexes them (cell
spacing and orientation from nearest-neighbour vectors), `solve` merges the indexed
images into a unit cell with its spread, `extract_metadata` writes a JSON record and
`plot` a PNG summary. Run it with

    skyfn local up --detach
    skyfn flow run examples/crystallography_flow.py --input '{"images": 8}'

or `python -m examples.crystallography_flow`.
"""
from __future__ import annotations

import json
import sys

from skyfn.flows import Flow, Map, Parallel, Step

INPUT = {"images": 8, "size": 160, "cell": 11.0, "seed": 7, "workdir": "~/.skyfn/ssx"}


def acquire(params):
    """Render `images` synthetic still diffraction patterns; returns one record per image."""
    import os

    import numpy as np

    n, size = int(params.get("images", 8)), int(params.get("size", 160))
    cell, seed = float(params.get("cell", 11.0)), int(params.get("seed", 7))
    workdir = os.path.expanduser(params.get("workdir", "~/.skyfn/ssx"))
    os.makedirs(workdir, exist_ok=True)
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float64)
    centre = (size - 1) / 2.0
    span = int(size / cell) + 2
    hk = np.array([(h, k) for h in range(-span, span + 1) for k in range(-span, span + 1) if (h, k) != (0, 0)],
                  dtype=np.float64)
    records = []
    for i in range(n):
        angle = float(rng.uniform(0.0, np.pi / 2))
        this_cell = cell * float(rng.normal(1.0, 0.01))      # crystal-to-crystal variation
        rot = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
        pos = hk @ (rot.T * this_cell) + centre
        q = np.hypot(*(pos - centre).T)
        keep = (q > 2.5 * cell) & (q < 0.45 * size)           # beamstop inside, detector edge outside
        pos, q = pos[keep], q[keep]
        intensity = rng.exponential(1.0, len(pos)) * np.exp(-(q / (0.3 * size)) ** 2) * 900.0
        image = rng.poisson(20.0, (size, size)).astype(np.float64)
        for (x, y), amp in zip(pos, intensity):
            image += amp * np.exp(-((xx - x) ** 2 + (yy - y) ** 2) / (2 * 1.2 ** 2))
        image[np.hypot(xx - centre, yy - centre) < 1.5 * cell] = 0.0  # beamstop shadow
        path = os.path.join(workdir, f"still_{i:04d}.npy")
        np.save(path, image.astype(np.float32))
        records.append({"index": i, "path": path, "true_angle_deg": round(float(np.degrees(angle)), 3),
                        "true_cell": round(this_cell, 4)})
    return records


def process_image(record):
    """Spot finding and indexing of one still: spot count, cell spacing, orientation."""
    import numpy as np

    image = np.load(record["path"]).astype(np.float64)
    valid = image > 0
    background = np.median(image[valid])
    sigma = 1.4826 * np.median(np.abs(image[valid] - background))
    mask = valid & (image > background + 6.0 * max(sigma, 1.0))
    pixels = [tuple(p) for p in np.argwhere(mask)]
    index = {p: n for n, p in enumerate(pixels)}
    parent = list(range(len(pixels)))

    def find(a):
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for (y, x), n in index.items():                 # 8-connected components
        for dy, dx in ((0, 1), (1, -1), (1, 0), (1, 1)):
            m = index.get((y + dy, x + dx))
            if m is not None:
                parent[find(n)] = find(m)
    groups = {}
    for (y, x), n in index.items():
        groups.setdefault(find(n), []).append((y, x))
    spots = []
    for members in groups.values():
        if len(members) < 2:
            continue
        ys, xs = np.array(members).T
        w = image[ys, xs] - background
        spots.append((float((xs * w).sum() / w.sum()), float((ys * w).sum() / w.sum()), float(w.sum())))
    out = {"index": record["index"], "path": record["path"], "spots": len(spots), "indexed": False, "cell": None, "angle_deg": None,
           "mean_intensity": round(float(np.mean([s[2] for s in spots])), 2) if spots else 0.0}
    if len(spots) < 6:
        return out
    xy = np.array([(s[0], s[1]) for s in spots])
    d = xy[:, None, :] - xy[None, :, :]
    dist = np.hypot(d[..., 0], d[..., 1])
    np.fill_diagonal(dist, np.inf)
    nearest = dist.argmin(axis=1)
    vectors = d[np.arange(len(xy)), nearest]
    lengths = np.hypot(vectors[:, 0], vectors[:, 1])
    cell = float(np.median(lengths))
    good = np.abs(lengths - cell) < 0.15 * cell
    # Orientation modulo the lattice's 90-degree symmetry, averaged on the circle (angle x 4).
    theta = np.arctan2(vectors[good, 1], vectors[good, 0]) * 4.0
    angle = float(np.degrees(np.arctan2(np.sin(theta).mean(), np.cos(theta).mean()) / 4.0)) % 90.0
    out.update(indexed=bool(good.sum() >= 6), cell=round(cell, 4), angle_deg=round(angle, 3))
    return out


def solve(results):
    """Merge the indexed stills: consensus unit cell and its spread."""
    import os

    import numpy as np

    indexed = [r for r in results if r["indexed"]]
    if not indexed:
        raise ValueError(f"none of the {len(results)} images could be indexed: nothing to merge")
    cells = np.array([r["cell"] for r in indexed])
    return {"images": len(results), "indexed": len(indexed), "indexing_rate": round(len(indexed) / len(results), 3),
            "cell": round(float(np.median(cells)), 4), "cell_sigma": round(float(cells.std()), 4),
            "spots": int(sum(r["spots"] for r in results)), "workdir": os.path.dirname(results[0]["path"]),
            "per_image": [[r["index"], r["spots"], r["cell"], r["angle_deg"]] for r in results]}


def extract_metadata(solution):
    """Write the run's metadata record (what a beamline would publish to a catalog)."""
    import datetime
    import json as _json
    import os

    workdir = solution["workdir"]
    record = {k: v for k, v in solution.items() if k != "per_image"}
    record["created"] = datetime.datetime.now(datetime.timezone.utc).isoformat()
    path = os.path.join(workdir, "metadata.json")
    with open(path, "w") as f:
        _json.dump(record, f, indent=2)
    return {"metadata": path, "cell": solution["cell"], "indexed": solution["indexed"]}


def plot(solution):
    """A PNG summary: spots per image (bars) with each image's cell spacing (dots)."""
    import os
    import struct
    import zlib

    import numpy as np

    rows = solution["per_image"]
    width, height = 40 + 24 * len(rows), 200
    canvas = np.full((height, width, 3), 255, dtype=np.uint8)
    top = max(r[1] for r in rows) or 1
    cells = [r[2] for r in rows if r[2]]
    lo, hi = (min(cells), max(cells)) if cells else (0.0, 1.0)
    for n, (_, spots, cell, _) in enumerate(rows):
        x0 = 20 + 24 * n
        h = int(150 * spots / top)
        canvas[180 - h:180, x0:x0 + 16] = (70, 110, 200)
        if cell:
            y = 170 - int(140 * (cell - lo) / ((hi - lo) or 1.0))
            canvas[max(y - 2, 0):y + 3, x0 + 5:x0 + 11] = (220, 60, 40)
    canvas[180:182, 10:width - 10] = 0
    raw = b"".join(b"\x00" + canvas[y].tobytes() for y in range(height))

    def chunk(tag, data):
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))
    path = os.path.join(solution["workdir"], "ssx_summary.png")
    with open(path, "wb") as f:
        f.write(png)
    return {"plot": path, "width": width, "height": height}


def build(endpoint: str = "local") -> Flow:
    return Flow(
        "ssx",
        Step(acquire, endpoint),
        Map(Step(process_image, endpoint).retry(errors=["TaskFailed"], max_attempts=2), name="process",
            max_concurrency=4),
        Step(solve, endpoint),
        Parallel(Step(extract_metadata, endpoint), Step(plot, endpoint), name="publish"),
    )


flow = build()


def main(argv: list[str] | None = None) -> int:
    from skyfn import Client

    params = dict(INPUT, **(json.loads(argv[0]) if argv else {}))
    with Client() as client:
        output = flow.run(client, params).result(timeout=600)
    print(json.dumps(output, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
