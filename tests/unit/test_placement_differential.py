"""Differential test (issue 15): skyfn's placement engine against the aAPP paper's algorithm
(tests/unit/aapp_reference.py, a transcription of the paper's `schedule` and `valid`), on
10,000 seeded random scripts and worker configurations.

Each case draws a script — tags (and sometimes `default`) with 1-3 blocks of `*` or worker
lists (sometimes naming a worker that does not exist), strategy any or best_first,
capacity_used and/or max_concurrent_invocations, affinity and anti-affinity, followup
default or fail or left out — writes it as YAML in one of the accepted layouts (the paper's
followup-beside-the-tag, the canonical one, ...) in the paper's notation or quoted, loads it
with skyfn's loader, builds the worker state (capacities, what runs where, some workers
offline), and asks both for every tag of the script and for a tag it does not define or an
untagged function, then places a few invocations in a row (the state evolving in both).

They must agree: on failure exactly; on which tag and block chose; for best_first on the
worker; for any, skyfn's worker is in the reference's valid set of that block; and skyfn's
explain trace lists, for every block walked, exactly the reference's valid workers.

Where skyfn deliberately differs from the paper the reference is adapted, by name
(docs/placement.md, "Differences from the paper"):
  MEMORY      the paper checks that the worker has the memory the function needs. skyfn
              counts slots, not memory: the agent (respect_capacity=True) rejects a worker
              with no free slot (= the paper, every function needing one unit, a worker's
              memory = its slots); the service (respect_capacity=False) has no such check,
              because endpoints queue work — the reference runs with memory_check=False.
  UNKNOWN_CAPACITY  a worker of capacity 0 has an unknown size in skyfn: neither the slot
              check nor capacity_used applies to it (reference: memory=None).
  OFFLINE     skyfn never picks an offline worker; the paper has no offline workers — the
              reference is given the online workers only.
  NO_DEFAULT_TAG  with no `default` tag, `followup: default` and unknown tags fall to
              skyfn's built-in `- workers: *` (any); the reference does the same.

The seed is printed on failure; rerun one case with SKYFN_DIFF_SEED=<seed> SKYFN_DIFF_CASES=1.
"""
from __future__ import annotations

import os
import random
import time

from skyfn.placement import LiveState, Scheduler, load_policy
from tests.unit import aapp_reference as paper

BASE_SEED = int(os.environ.get("SKYFN_DIFF_SEED", "150015"))
CASES = int(os.environ.get("SKYFN_DIFF_CASES", "10000"))
POOL = ("t0", "t1", "t2", "t3")          # function tags the scripts and the workers use
PERCENTS = (12.5, 25, 33.3, 50, 75, 100)


# --- random scripts ---------------------------------------------------------------------
def random_block(rng: random.Random, names: list[str]) -> dict:
    if rng.random() < 0.4:
        workers = None
    else:
        workers = rng.sample(names, rng.randint(1, len(names)))
        if rng.random() < 0.1:
            workers.insert(rng.randrange(len(workers) + 1), "ghost")   # named, never present
    cap = mci = None
    r = rng.random()
    if r < 0.25:
        cap = rng.choice(PERCENTS)
    elif r < 0.5:
        mci = rng.randint(1, 4)
    elif r < 0.65:
        cap, mci = rng.choice(PERCENTS), rng.randint(1, 4)
    affinity = [(t, rng.random() < 0.5) for t in rng.sample(POOL, rng.choice((0, 0, 1, 1, 2)))]
    return {"workers": workers, "strategy": rng.choice(("any", "best_first")), "capacity_used": cap,
            "max_concurrent_invocations": mci, "affinity": affinity}


def random_script(rng: random.Random, names: list[str]) -> dict:
    tags = rng.sample(POOL, rng.randint(1, 3)) + ([paper.DEFAULT] if rng.random() < 0.5 else [])
    script = {}
    for tag in tags:
        followup = rng.choice(("default", "fail", None)) if tag != paper.DEFAULT else rng.choice(("fail", None))
        script[tag] = {"blocks": [random_block(rng, names) for _ in range(rng.randint(1, 3))],
                       "followup": followup}
    return script


def semantics(script: dict) -> dict:
    """The reference's view: an omitted followup is `default` (`fail` for the default tag)."""
    return {tag: {"blocks": t["blocks"],
                  "followup": t["followup"] or ("fail" if tag == paper.DEFAULT else "default")}
            for tag, t in script.items()}


# --- writing a script as YAML -----------------------------------------------------------
def block_lines(rng: random.Random, b: dict, dash: int) -> list[str]:
    pad, key = " " * dash, " " * (dash + 2)
    if b["workers"] is None:
        first = ["workers: " + rng.choice(("*", '"*"', "'*'"))]
    elif rng.random() < 0.3:
        first = ["workers:"] + [f"  - wrk: {w}" for w in b["workers"]]
    else:
        first = [f"workers: [{', '.join(b['workers'])}]"]
    lines = [pad + "- " + first[0]] + [key + line for line in first[1:]]
    if b["strategy"] != "any" or rng.random() < 0.5:
        lines.append(f"{key}strategy: {b['strategy']}")
    cap, mci = b["capacity_used"], b["max_concurrent_invocations"]
    if cap is not None and mci is not None:
        lines.append(key + rng.choice((f"invalidate: [capacity_used {cap:g}%, max_concurrent_invocations {mci}]",
                                       f"invalidate: {{capacity_used: {cap:g}%, max_concurrent_invocations: {mci}}}")))
    elif cap is not None:
        text = "overload" if cap == 100 and rng.random() < 0.5 else f"capacity_used {cap:g}%"
        lines.append(key + rng.choice((f"invalidate: {text}", f"invalidate: [{text}]")))
    elif mci is not None:
        lines.append(key + rng.choice((f"invalidate: max_concurrent_invocations {mci}",
                                       f"invalidate: {{max_concurrent_invocations: {mci}}}")))
    if b["affinity"]:
        items = [t if wanted else "!" + t for t, wanted in b["affinity"]]
        lines.append(key + rng.choice((f"affinity: {', '.join(items)}",               # the paper's bare !tag
                                       f"affinity: [{', '.join(items)}]",
                                       "affinity: " + '"' + ", ".join(items) + '"')))
    return lines


def to_yaml(rng: random.Random, script: dict) -> tuple[str, str]:
    """(YAML text, layout name). Lists are either all-paper layout or all-map layout."""
    as_list = rng.random() < 0.5
    out: list[str] = []
    layouts = []
    for tag, t in script.items():
        fu = t["followup"]
        if as_list:
            layout = rng.choice(("beside", "item", "last-block"))    # "beside" is the paper's layout
            head, dash = f"- {tag}:", rng.choice((2, 4))
        else:
            layout = rng.choice(("item", "blocks-map", "last-block"))
            head, dash = f"{tag}:", 2
        layouts.append(layout)
        out.append(head)
        if layout == "blocks-map":
            out.append("  blocks:")
            for b in t["blocks"]:
                out.extend(block_lines(rng, b, 4))
            if fu:
                out.append(f"  followup: {fu}")
            continue
        for b in t["blocks"]:
            out.extend(block_lines(rng, b, dash))
        if fu and layout == "item":
            out.append(" " * dash + f"- followup: {fu}")
        elif fu and layout == "last-block":
            out.append(" " * (dash + 2) + f"followup: {fu}")
        elif fu:
            out.append(f"  followup: {fu}")
    return "\n".join(out) + "\n", ("list" if as_list else "map") + ":" + ",".join(layouts)


# --- random worker configurations -------------------------------------------------------
def random_workers(rng: random.Random) -> list[dict]:
    workers = []
    for i in range(rng.randint(1, 6)):
        capacity = 0 if rng.random() < 0.15 else rng.randint(1, 6)
        top = (capacity or 4) + (1 if rng.random() < 0.2 else 0)     # sometimes over capacity (a queue)
        functions = [rng.choice(POOL + (None, None)) for _ in range(rng.randint(0, top))]
        workers.append({"name": f"w{i}", "capacity": capacity, "online": rng.random() < 0.9,
                        "functions": functions})
    return workers


def build_state(rng: random.Random, workers: list[dict]) -> LiveState:
    """The same workers in skyfn's state, starts (and some start+finish noise) in random order."""
    state = LiveState()
    for w in workers:
        state.upsert(w["name"], capacity=w["capacity"], online=w["online"])
    events = [(w["name"], tag) for w in workers for tag in w["functions"]]
    events += [(w["name"], rng.choice(POOL)) for w in workers if rng.random() < 0.3 for _ in ("noise",)]
    rng.shuffle(events)
    noise = len(events) - sum(len(w["functions"]) for w in workers)
    for name, tag in events:
        state.started(name, tag)
    # take the noise back out: one extra start per noisy worker, finished again
    counts: dict[tuple[str, str], int] = {}
    for w in workers:
        for tag in w["functions"]:
            counts[(w["name"], tag)] = counts.get((w["name"], tag), 0) + 1
    seen: dict[tuple[str, str], int] = {}
    for name, tag in events:
        seen[(name, tag)] = seen.get((name, tag), 0) + 1
    removed = 0
    for (name, tag), n in seen.items():
        for _ in range(n - counts.get((name, tag), 0)):
            assert state.finished(name, tag)
            removed += 1
    assert removed == noise
    return state


def conf_of(workers: list[dict]) -> list[dict]:
    """The paper's configuration: online workers only (OFFLINE), memory in slots, unknown
    capacity as unknown memory (UNKNOWN_CAPACITY)."""
    return [{"name": w["name"], "memory": w["capacity"] or None, "functions": list(w["functions"])}
            for w in workers if w["online"]]


# --- one comparison ---------------------------------------------------------------------
def agree(d, ref: paper.Outcome, tag, script: dict, how: str) -> None:
    """skyfn's decision `d` agrees with the paper's outcome `ref`."""
    if ref.worker is None:
        assert d.worker is None, f"{how}: the paper fails {tag!r}, skyfn chose {d.worker!r}"
        return
    assert d.worker is not None, f"{how}: skyfn failed {tag!r} ({d.reason}); the paper chose from " \
                                 f"{ref.tag!r} block {ref.block}: {ref.candidates}"
    want_tag = ref.tag if ref.tag in script else "(built-in default)"
    assert (d.policy_tag, d.block) == (want_tag, ref.block), \
        f"{how}: {tag!r} decided by {d.policy_tag!r} block {d.block}, the paper by {ref.tag!r} block {ref.block}"
    block = script.get(ref.tag, paper.IMPLICIT_DEFAULT)["blocks"][ref.block - 1]
    if block["strategy"] == "best_first":
        assert d.worker == ref.worker, f"{how}: best_first chose {d.worker!r}, the paper {ref.worker!r}"
    else:
        assert d.worker in ref.candidates, f"{how}: any chose {d.worker!r}, not in the paper's {ref.candidates}"


def compare(tag, script, workers, scheduler: Scheduler, rng: random.Random, memory_check: bool) -> None:
    """decide() and decide(explain=True) against the paper; the trace against every block it walked."""
    ref = paper.schedule(tag, script, conf_of(workers), rng, memory_check=memory_check)
    agree(scheduler.decide(tag), ref, tag, script, "decide")
    told = scheduler.decide(tag, explain=True)
    agree(told, ref, tag, script, "decide(explain=True)")
    got = [(t.policy_tag if t.policy_tag in script else paper.DEFAULT, t.number, t.valid) for t in told.trace]
    want = [(w.tag, w.number, w.valid) for w in ref.walked]
    assert got == want, f"explain trace of {tag!r}: skyfn {got} != paper {want}"


def run_case(seed: int) -> None:
    rng = random.Random(seed)
    workers = random_workers(rng)
    names = [w["name"] for w in workers]
    script = random_script(rng, names)
    text, layout = to_yaml(rng, script)
    memory_check = rng.random() < 0.5                 # MEMORY: agent (True) or service (False)
    try:
        policy = load_policy(text, source=f"case {seed}")
        sem = semantics(script)
        assert {t: tp.followup for t, tp in policy.tags.items()} == {t: s["followup"] for t, s in sem.items()}
        state = build_state(rng, workers)
        scheduler = Scheduler(policy, state, seed=seed, respect_capacity=memory_check)
        for tag in [*script, rng.choice(("t_undefined", None))]:   # both fall to the default tag
            compare(tag, sem, workers, scheduler, rng, memory_check)
        for _ in range(3):                            # place in a row: both states evolve alike
            tag = rng.choice([*script, None])
            ref = paper.schedule(tag, sem, conf_of(workers), rng, memory_check=memory_check)
            d = scheduler.place(tag)
            agree(d, ref, tag, sem, "place")
            if d.worker is not None:
                next(w for w in workers if w["name"] == d.worker)["functions"].append(tag)
    except AssertionError as exc:
        state_text = {w["name"]: {k: w[k] for k in ("capacity", "online", "functions")} for w in workers}
        raise AssertionError(
            f"differential case seed={seed} (rerun: SKYFN_DIFF_SEED={seed} SKYFN_DIFF_CASES=1 pytest "
            f"{__file__}) layout={layout} respect_capacity={memory_check}\n{exc}\n--- script ---\n{text}"
            f"--- workers ---\n{state_text}") from None
    except Exception as exc:  # a crash or a rejected script is a failure of this seed too
        raise AssertionError(f"differential case seed={seed} (rerun: SKYFN_DIFF_SEED={seed} SKYFN_DIFF_CASES=1 "
                             f"pytest {__file__}) layout={layout}: {type(exc).__name__}: {exc}\n"
                             f"--- script ---\n{text}") from None


def test_skyfn_agrees_with_the_paper_on_10000_random_cases():
    start, cpu = time.perf_counter(), time.process_time()
    for i in range(CASES):
        run_case(BASE_SEED + i)
    print(f"{CASES} differential cases from seed {BASE_SEED} in {time.perf_counter() - start:.1f} s "
          f"({time.process_time() - cpu:.1f} s CPU)")


# --- the test's own checks: it exercises what it claims ---------------------------------
def test_the_generator_covers_every_feature_and_both_outcomes():
    """Over the first 1,000 seeds: every layout, `*` and lists, both strategies, both
    invalidations, affinity and anti-affinity, every followup, and both successes and
    failures for each strategy — so agreement above is not vacuous."""
    seen: set[str] = set()
    for i in range(1000):
        rng = random.Random(BASE_SEED + i)
        workers = random_workers(rng)
        script = random_script(rng, [w["name"] for w in workers])
        text, layout = to_yaml(rng, script)
        seen.update(layout.replace(":", ",").split(","))
        sem = semantics(script)
        for t in script.values():
            seen.add(f"followup={t['followup']}")
            for b in t["blocks"]:
                seen.add("workers=*" if b["workers"] is None else "workers=list")
                seen.add(f"strategy={b['strategy']}")
                seen.update(k for k in ("capacity_used", "max_concurrent_invocations") if b[k] is not None)
                seen.update("affinity" if wanted else "anti-affinity" for _, wanted in b["affinity"])
        memory_check = rng.random() < 0.5
        for tag in [*script, None]:
            ref = paper.schedule(tag, sem, conf_of(workers), random.Random(0), memory_check=memory_check)
            if ref.worker is None:
                seen.add("fail")
            else:
                strategy = sem.get(ref.tag, paper.IMPLICIT_DEFAULT)["blocks"][ref.block - 1]["strategy"]
                seen.add(f"chosen-by-{strategy}" + ("-via-followup" if ref.tag != (tag if tag in sem else "default")
                                                    else ""))
    assert seen >= {"list", "map", "beside", "item", "last-block", "blocks-map", "workers=*", "workers=list",
                    "strategy=any", "strategy=best_first", "capacity_used", "max_concurrent_invocations",
                    "affinity", "anti-affinity", "followup=default", "followup=fail", "followup=None", "fail",
                    "chosen-by-any", "chosen-by-best_first", "chosen-by-any-via-followup",
                    "chosen-by-best_first-via-followup"}, seen


def test_a_disagreement_names_its_seed(monkeypatch):
    """A deliberately wrong engine (best_first picking the last valid worker it saw) is
    caught, and the failure carries the seed and the script."""
    from skyfn.placement import scheduler as sched

    real = sched.Scheduler._choose

    def last(self, strategy, valid, *args, **kwargs):
        return valid[-1] if strategy == "best_first" else real(self, strategy, valid, *args, **kwargs)

    monkeypatch.setattr(sched.Scheduler, "_choose", last)
    for i in range(200):
        try:
            run_case(BASE_SEED + i)
        except AssertionError as exc:
            message = str(exc)
            assert message.startswith(f"differential case seed={BASE_SEED + i} (rerun: SKYFN_DIFF_SEED=")
            assert "best_first chose" in message and "--- script ---" in message
            return
    raise AssertionError("the wrong engine went unnoticed for 200 cases")


def test_the_paper_reference_on_its_own():
    """The reference itself, on hand-made cases (so a mistake in it cannot hide behind agreement)."""
    script = {"f": {"blocks": [{"workers": ["a", "b"], "strategy": "best_first", "capacity_used": 50,
                                "max_concurrent_invocations": None, "affinity": []},
                               {"workers": ["c"], "strategy": "any", "capacity_used": None,
                                "max_concurrent_invocations": 1, "affinity": [("g", False)]}],
                    "followup": "fail"},
              "default": {"blocks": [{"workers": None, "strategy": "best_first", "capacity_used": None,
                                      "max_concurrent_invocations": None, "affinity": [("f", True)]}],
                          "followup": "fail"}}
    conf = [{"name": "a", "memory": 2, "functions": ["f", None]}, {"name": "b", "memory": 4, "functions": ["f"]},
            {"name": "c", "memory": 1, "functions": []}]
    rng = random.Random(0)
    out = paper.schedule("f", script, conf, rng)
    assert (out.worker, out.tag, out.block, out.candidates) == ("b", "f", 1, ["b"])  # a: 2 of 2 used
    conf[1]["functions"].append("g")                                               # b: 2 of 4 = 50%
    out = paper.schedule("f", script, conf, rng)
    assert (out.worker, out.block) == ("c", 2)
    conf[2]["functions"].append(None)                                              # c: full, and 1 running
    assert paper.schedule("f", script, conf, rng).worker is None                   # followup fail
    assert paper.schedule("f", script, conf, rng, memory_check=False).worker is None   # still mci 1
    out = paper.schedule(None, script, conf, rng)                                  # default: runs an f
    assert (out.worker, out.tag) == ("b", "default")                               # a is full (memory)
    assert paper.schedule(None, script, conf, rng, memory_check=False).worker == "a"
    script["f"]["followup"] = "default"
    assert [(w.tag, w.number, w.valid) for w in paper.schedule("f", script, conf, rng).walked] == \
        [("f", 1, []), ("f", 2, []), ("default", 1, ["b"])]
    del script["default"]
    out = paper.schedule("zzz", script, conf, rng)                                 # implicit default: `*`, any
    assert out.tag == "default" and out.candidates == ["b"]
