#!/usr/bin/env python3
"""A stand-in for qsub / qstat / qdel that plays back recorded outputs (installed under
those names, as symlinks, in a directory put first on PATH).

$FAKE_PBS_SCENARIO names a JSON file {"qsub": [reply, ...], "qstat": [...], "qdel": [...]};
a reply is {"stdout": FILE or "", "stderr": FILE or "", "text": "...", "err": "...", "rc": 0}
(FILE names are relative to this directory). Each call takes the next reply of its
command; the last one repeats. Every call is appended to $FAKE_PBS_SCENARIO.calls.jsonl as
{"cmd", "argv", "script"} (the submitted script's text for qsub).
"""
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    cmd = Path(sys.argv[0]).name
    scenario = Path(os.environ["FAKE_PBS_SCENARIO"])
    replies = json.loads(scenario.read_text()).get(cmd) or [{"rc": 0}]
    log = scenario.with_name(scenario.name + ".calls.jsonl")
    n = 0
    if log.exists():
        n = sum(1 for line in log.read_text().splitlines() if json.loads(line)["cmd"] == cmd)
    reply = replies[min(n, len(replies) - 1)]
    script = None
    if cmd == "qsub" and len(sys.argv) > 1 and Path(sys.argv[-1]).is_file():
        script = Path(sys.argv[-1]).read_text()
    with log.open("a") as f:
        f.write(json.dumps({"cmd": cmd, "argv": sys.argv[1:], "script": script}) + "\n")
    out = (HERE / reply["stdout"]).read_text() if reply.get("stdout") else reply.get("text", "")
    err = (HERE / reply["stderr"]).read_text() if reply.get("stderr") else reply.get("err", "")
    sys.stdout.write(out)
    sys.stderr.write(err)
    return int(reply.get("rc", 0))


if __name__ == "__main__":
    sys.exit(main())
