"""Host fix-ups podman/crun need on some machines (run as root):

`python -m endpoint_agent.containers.hostprep` — on a cgroup v1+v2 hybrid host whose
cgroup v2 mount has controllers enabled (here: hugetlb), crun refuses every container
("cgroups in hybrid mode not supported, drop all controllers from cgroupv2"). Mounting
each such controller as a cgroup v1 hierarchy moves it off cgroup v2. Idempotent; lasts
until reboot.
"""
from __future__ import annotations

import os
import subprocess
import sys

from endpoint_agent.containers.runtime import cgroup_hybrid_controllers


def fix_cgroup_hybrid() -> list[str]:
    done = []
    for ctrl in cgroup_hybrid_controllers():
        target = f"/sys/fs/cgroup/{ctrl}"
        os.makedirs(target, exist_ok=True)
        subprocess.run(["mount", "-t", "cgroup", "-o", ctrl, "cgroup", target], check=True)
        done.append(ctrl)
    return done


def main() -> int:
    if os.geteuid() != 0:
        print("hostprep: needs root", file=sys.stderr)
        return 1
    done = fix_cgroup_hybrid()
    print(f"mounted as cgroup v1: {', '.join(done)}" if done else "nothing to do")
    return 0


if __name__ == "__main__":
    sys.exit(main())
