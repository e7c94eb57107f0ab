"""The PBS provider against recorded OpenPBS outputs (tests/agent/data/pbs): fake `qsub`,
`qstat` and `qdel` on PATH play them back and record their argv, so the provider's real
subprocess code runs. No PBS server can be installed here."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from endpoint_agent.providers import JobState, ProviderError
from endpoint_agent.providers.pbs import PBSProvider, parse_qstat_json, parse_qstat_plain

DATA = Path(__file__).resolve().parent / "data" / "pbs"


class FakePBS:
    def __init__(self, tmp: Path):
        self.bin = tmp / "bin"
        self.bin.mkdir()
        for cmd in ("qsub", "qstat", "qdel"):
            (self.bin / cmd).symlink_to(DATA / "fake_pbs.py")
        self.scenario = tmp / "scenario.json"
        self.set()

    def set(self, **replies):
        self.scenario.write_text(json.dumps(replies))
        log = self.scenario.with_name(self.scenario.name + ".calls.jsonl")
        if log.exists():
            log.unlink()

    def calls(self, cmd: str | None = None) -> list[dict]:
        log = self.scenario.with_name(self.scenario.name + ".calls.jsonl")
        if not log.exists():
            return []
        rows = [json.loads(line) for line in log.read_text().splitlines()]
        return [r for r in rows if cmd is None or r["cmd"] == cmd]


@pytest.fixture
def pbs(tmp_path, monkeypatch):
    fake = FakePBS(tmp_path)
    monkeypatch.setenv("PATH", f"{fake.bin}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_PBS_SCENARIO", str(fake.scenario))
    return fake


@pytest.fixture
def provider(tmp_path):
    return PBSProvider(queue="workq", account="proj42", cpus_per_node=32, select_options="ngpus=4",
                       script_dir=tmp_path / "blocks", worker_init="module load conda\nconda activate skyfn",
                       scheduler_options="#PBS -l filesystems=home:eagle")


def test_qsub_script_and_job_id(pbs, provider):
    pbs.set(qsub=[{"stdout": "qsub.out"}])
    job = provider.submit("exec mpiexec -n 2 -ppn 1 python -m endpoint_agent.manager --block b1.c0de", 2, 5400,
                          "skyfn-b1.c0de-long-endpoint-name")
    assert job == "4711.pbs-head"
    (call,) = pbs.calls("qsub")
    script_path = Path(call["argv"][-1])
    assert call["argv"] == [str(script_path)] and script_path.parent == provider.script_dir
    base = str(script_path)[:-len(".submit")]
    lines = call["script"].splitlines()
    assert lines[:10] == [
        "#!/bin/bash",
        "#PBS -N skyfn-b1.c0de-l",  # 15 characters at most
        "#PBS -l select=2:ncpus=32:ngpus=4",
        "#PBS -l walltime=01:30:00",
        f"#PBS -o {base}.out",
        f"#PBS -e {base}.err",
        "#PBS -l place=scatter",
        "#PBS -q workq",
        "#PBS -A proj42",
        "#PBS -l filesystems=home:eagle",
    ]
    text = call["script"]
    assert text.index("conda activate skyfn") < text.index("exec mpiexec -n 2 -ppn 1")


def test_qsub_error_is_clear(pbs, provider):
    pbs.set(qsub=[{"stderr": "qsub_unknown_queue.err", "rc": 170}])
    with pytest.raises(ProviderError) as e:
        provider.submit("true", 1, 60, "b")
    assert "qsub" in str(e.value) and "exited with code 170" in str(e.value) and "Unknown queue" in str(e.value)
    pbs.set(qsub=[{"text": "\n", "rc": 0}])
    with pytest.raises(ProviderError, match="printed no job id"):
        provider.submit("true", 1, 60, "b")


def test_qstat_json_states(pbs, provider):
    pbs.set(qsub=[{"text": "4711.pbs-head\n"}, {"text": "4712.pbs-head\n"}, {"text": "4713.pbs-head\n"}],
            qstat=[{"stdout": "qstat_json_queued_running.json"}, {"stdout": "qstat_json_finished.json"}])
    ids = [provider.submit("true", 1, 60, f"b{i}") for i in range(3)]
    # first poll: 4713 not listed yet (and not known to qstat): still ours, so not UNKNOWN
    assert provider.status(ids) == {"4711.pbs-head": JobState.RUNNING, "4712.pbs-head": JobState.PENDING,
                                    "4713.pbs-head": JobState.COMPLETED}
    assert pbs.calls("qstat")[0]["argv"] == ["-f", "-F", "json", "-x", *ids]
    # second: finished with exit 0, deleted by qdel (substate 91), killed at walltime (Exit_status -29)
    assert provider.status(ids) == {"4711.pbs-head": JobState.COMPLETED, "4712.pbs-head": JobState.CANCELLED,
                                    "4713.pbs-head": JobState.FAILED}


def test_qstat_unknown_job_is_not_an_error(pbs, provider):
    pbs.set(qsub=[{"stdout": "qsub.out"}], qstat=[{"stderr": "qstat_unknown.err", "rc": 153}])
    job = provider.submit("true", 1, 60, "b")
    # ours, gone from the server without history: it ended
    assert provider.status([job, "4799.pbs-head"]) == {job: JobState.COMPLETED, "4799.pbs-head": JobState.UNKNOWN}


def test_qstat_server_down_raises(pbs, provider):
    pbs.set(qstat=[{"stderr": "qstat_no_server.err", "rc": 15}])
    with pytest.raises(ProviderError) as e:
        provider.status(["4711.pbs-head"])
    msg = str(e.value)
    assert "qstat -f -F json -x 4711.pbs-head" in msg and "code 15" in msg and "cannot connect to server" in msg


def test_qstat_without_json_falls_back_to_the_table(pbs, provider):
    pbs.set(qstat=[{"stderr": "qstat_no_json.err", "rc": 2}, {"stdout": "qstat_plain.out"}])
    ids = ["4711.pbs-head", "4712.pbs-head", "4714.pbs-head-long.cluster.example.org"]
    assert provider.status(ids) == {ids[0]: JobState.RUNNING, ids[1]: JobState.PENDING, ids[2]: JobState.PENDING}
    assert [c["argv"] for c in pbs.calls("qstat")] == [["-f", "-F", "json", "-x", *ids], ids]
    assert provider.status_format == "plain"  # remembered: no more JSON attempts
    provider.status(ids)
    assert pbs.calls("qstat")[-1]["argv"] == ids


def test_invalid_json_falls_back_in_auto_mode(pbs, provider):
    pbs.set(qstat=[{"text": '{"Jobs": {"4711.pbs-head": {"Variable_List": {"X": "a"b"}}}}'},
                   {"stdout": "qstat_plain.out"}])
    assert provider.status(["4711.pbs-head"]) == {"4711.pbs-head": JobState.RUNNING}


def test_qdel(pbs, provider):
    pbs.set(qsub=[{"stdout": "qsub.out"}], qdel=[{"rc": 0}, {"stderr": "qdel_finished.err", "rc": 35},
                                                 {"stderr": "qdel_unauthorized.err", "rc": 159},
                                                 {"stderr": "qstat_no_server.err", "rc": 15}],
            qstat=[{"stderr": "qstat_unknown.err", "rc": 153}])
    job = provider.submit("true", 1, 60, "b")
    assert provider.cancel([job]) == {job: True}
    assert pbs.calls("qdel")[0]["argv"] == [job]
    assert provider.status([job]) == {job: JobState.CANCELLED}   # gone after our qdel
    assert provider.cancel([job]) == {job: True}                 # already finished: fine
    assert provider.cancel(["4712.pbs-head"]) == {"4712.pbs-head": False}  # refused for that job
    with pytest.raises(ProviderError, match="(?s)qdel 4713.pbs-head` exited with code 15: .*cannot connect"):
        provider.cancel(["4713.pbs-head"])


def test_parsers_on_recordings():
    jobs = parse_qstat_json((DATA / "qstat_json_finished.json").read_text())
    assert jobs == {"4711.pbs-head": JobState.COMPLETED, "4712.pbs-head": JobState.CANCELLED,
                    "4713.pbs-head": JobState.FAILED}
    assert parse_qstat_plain((DATA / "qstat_plain.out").read_text()) == {
        "4711.pbs-head": JobState.RUNNING, "4712.pbs-head": JobState.PENDING, "4714.pbs-head-lo*": JobState.PENDING}
