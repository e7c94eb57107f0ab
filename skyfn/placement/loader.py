"""Load an aAPP policy from YAML text, all or nothing.

Accepted shapes (the paper's notation and plain YAML both work):

    divide:                       # a tag, mapped to its ordered blocks
      - workers: *                # `*` = every worker; or a list of names / `- wrk: name`
        strategy: best_first      # any | best_first | warm_first | shortest_backlog | round_robin
        invalidate: capacity_used 50%       # or max_concurrent_invocations N, overload, a map or a list
        affinity: impera, !heavy            # `tag` must run on the worker, `!tag` must not
      - workers: [w3]
      - followup: fail            # default | fail (also `followup:` beside `blocks:`)

The top level may also be a list of one-key maps (`- divide: ...`), where the paper's grammar
(`tag ::= id: (- block)* [followup: default|fail]`) puts a tag's followup beside the tag in its
list item (`- divide:` / `  - workers: *` / `  followup: fail`). YAML reads a bare `*`
as an alias and `!heavy` as a type tag, so a line-preserving pre-pass quotes them first.
Every problem is collected with its line, key and reason; any error rejects the policy
(PolicyError), warnings (affinity on a tag the policy does not define) ride along.
"""
from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Optional

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from skyfn.placement.model import (
    DATA_AFFINITY, DEFAULT_TAG, FOLLOWUPS, STRATEGIES, Block, Invalidate, Policy, PolicyError, Problem, TagPolicy,
)
from skyfn.placement.yaml_errors import describe as describe_yaml_error

MAX_POLICY_BYTES = 256 << 10
BLOCK_KEYS = ("workers", "strategy", "invalidate", "affinity")
TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}$")
WORKER_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:@/-]{0,127}$")

_INLINE = re.compile(r"^(?P<pre>\s*(?:-\s+)?(?P<key>affinity|workers|invalidate)\s*:[ \t]+)"
                     r"(?P<val>[^\s#].*?)(?P<post>[ \t]+#.*)?$")
_ITEM = re.compile(r"^(?P<pre>\s*-\s+)(?P<val>![^!\s#][^\s#]*|\*)(?P<post>[ \t]+#.*)?$")
_INVALIDATE_TEXT = re.compile(r"^(?P<name>[A-Za-z_]+)(?:\s*:\s*|\s+)(?P<value>\S+)$")


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _prepass(text: str) -> str:
    """Quote the paper's bare `*` and `!tag` (and `invalidate: capacity_used: 50%`) so YAML
    reads them as text. Lines are kept one for one, so marks still point at the user's lines."""
    out = []
    for line in text.splitlines():
        m = _INLINE.match(line)
        if m:
            key, val = m["key"], m["val"]
            new = val
            if val[0] in "\"'{":
                pass
            elif val[0] == "[" and val.endswith("]"):
                items = [i.strip() for i in val[1:-1].split(",")]
                new = "[" + ", ".join(_quote(i) if i.startswith("!") or i == "*" else i for i in items) + "]"
            elif val[0] == "[":
                pass  # a '[' not closed on its line: left to YAML, which reports where it was opened
            elif (key == "workers" and val == "*") or (key == "affinity" and "!" in val) or \
                    (key == "invalidate" and ":" in val):
                new = _quote(val)
            line = m["pre"] + new + (m["post"] or "")
        else:
            m = _ITEM.match(line)
            if m:
                line = m["pre"] + _quote(m["val"]) + (m["post"] or "")
        out.append(line)
    return "\n".join(out) + "\n"


_LIBYAML = getattr(yaml, "CSafeLoader", None)


def _compose(text: str) -> Optional[Node]:
    """The node tree of `text`: libyaml's parser when PyYAML was built with it (about three
    times faster); on a syntax error PyYAML's own parser again, which decides, and whose
    messages and context marks the error report is written from (yaml_errors.py)."""
    if _LIBYAML is not None:
        try:
            return yaml.compose(text, Loader=_LIBYAML)
        except yaml.YAMLError:
            pass
    return yaml.compose(text, Loader=yaml.SafeLoader)


def _line(node: Node) -> int:
    return node.start_mark.line + 1


def _is_followup(name: str, value: Node) -> bool:
    """A `followup: default|fail` entry among tags (a `followup:` holding blocks is a tag of that name)."""
    return name == "followup" and isinstance(value, ScalarNode)


def _suggest(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


class _Loader:
    def __init__(self, source: str):
        self.source = source
        self.errors: list[Problem] = []
        self.warnings: list[Problem] = []
        self.affinity_refs: list[tuple[str, Node, str]] = []  # checked once every tag is known

    def err(self, node: Optional[Node], key: str, reason: str) -> None:
        self.errors.append(Problem(_line(node) if node is not None else None, key, reason))

    # --- scalars ---------------------------------------------------------------------
    def scalar(self, node: Node, key: str, what: str) -> Optional[str]:
        if not isinstance(node, ScalarNode):
            self.err(node, key, f"expected {what}, got a {'list' if isinstance(node, SequenceNode) else 'map'}")
            return None
        tag = node.tag
        if tag.startswith("!") and not tag.startswith("!!"):  # `!heavy` read as a YAML tag
            return tag + (" " + node.value if node.value else "")
        return node.value

    def pairs(self, node: MappingNode, key: str) -> list[tuple[str, Node, Node]]:
        """(name, key node, value node) for each entry; duplicate keys are errors."""
        seen: dict[str, int] = {}
        out = []
        for k, v in node.value:
            name = self.scalar(k, key, "a key")
            if name is None:
                continue
            if name in seen:
                self.err(k, f"{key}.{name}" if key else name, f"duplicate key (first on line {seen[name]})")
                continue
            seen[name] = _line(k)
            out.append((name, k, v))
        return out

    # --- top level -------------------------------------------------------------------
    def load(self, text: str) -> Policy:
        if len(text.encode()) > MAX_POLICY_BYTES:
            raise PolicyError([Problem(None, "", f"policy of {len(text.encode())} bytes exceeds "
                                                 f"{MAX_POLICY_BYTES} bytes")], self.source)
        try:
            root = _compose(_prepass(text))
        except yaml.YAMLError as exc:
            line, reason = describe_yaml_error(exc)
            raise PolicyError([Problem(line, "", reason)], self.source) from None
        if root is None:
            raise PolicyError([Problem(None, "", "empty policy: define at least one tag with its blocks")],
                              self.source)
        entries: list[tuple[str, Node, Node]] = []
        beside: dict[str, tuple[Node, Node]] = {}  # tag -> (key, value) of the followup written beside it
        if isinstance(root, MappingNode):
            entries = self.pairs(root, "")
        elif isinstance(root, SequenceNode):
            seen: dict[str, int] = {}
            for item in root.value:
                if not isinstance(item, MappingNode):
                    self.err(item, "", "each list item must be `tag: [blocks]`")
                    continue
                here = self.pairs(item, "")
                followups = [(k, v) for name, k, v in here if _is_followup(name, v)]
                here = [(name, k, v) for name, k, v in here if not _is_followup(name, v)]
                if followups:  # the paper's layout: `- tag:` then its blocks, then `followup:` beside the tag
                    k = followups[0][0]
                    if not here:
                        self.err(k, "followup", "followup beside no tag: put it in the tag's own list item, "
                                                "indented like the tag name (`- f_tag:` / `  - workers: ...` / "
                                                "`  followup: fail`)")
                    elif len(here) > 1:
                        self.err(k, "followup", f"followup beside {len(here)} tags "
                                                f"({', '.join(n for n, _, _ in here)}) in one list item: give "
                                                "each tag its own `- tag:` item with its followup")
                    else:
                        beside[here[0][0]] = followups[0]
                for name, k, v in here:
                    if name in seen:
                        self.err(k, name, f"tag defined twice (first on line {seen[name]})")
                        continue
                    seen[name] = _line(k)
                    entries.append((name, k, v))
        else:
            self.err(root, "", "a policy maps tags to their blocks (`divide:` then `- workers: ...`)")
        tags: dict[str, TagPolicy] = {}
        for name, k, v in entries:
            if _is_followup(name, v):  # top-level map: a followup that belongs to no tag
                self.err(k, "followup", "followup at the top level belongs to no tag: put it after the tag's "
                                        "last block (`  - followup: fail`), or write the policy as a list with "
                                        "the followup beside its tag (`- f_tag:` / `  - workers: ...` / "
                                        "`  followup: fail`)")
                continue
            if not TAG_RE.match(name):
                self.err(k, name, "a tag name is letters, digits, '_', '.', ':' or '-' (no leading '!')")
                continue
            tp = self.tag(name, k, v, beside.get(name))
            if tp is not None:
                tags[name] = tp
        if not entries and not self.errors:
            self.err(root, "", "empty policy: define at least one tag with its blocks")
        self.check_affinity_tags(tags)
        if self.errors:
            raise PolicyError(self.errors, self.source)
        return Policy(tags=tags, warnings=tuple(self.warnings), source=self.source, text=text)

    # --- one tag ---------------------------------------------------------------------
    def tag(self, name: str, knode: Node, node: Node,
            beside: Optional[tuple[Node, Node]] = None) -> Optional[TagPolicy]:
        """One tag's blocks and followup; `beside` is a followup written next to the tag
        in its list item (the paper's layout), as (key node, value node)."""
        followup, fnode = None, None
        block_nodes: list[Node] = []
        if isinstance(node, SequenceNode):
            for i, item in enumerate(node.value):
                if isinstance(item, MappingNode) and len(item.value) == 1 and \
                        isinstance(item.value[0][0], ScalarNode) and item.value[0][0].value == "followup":
                    if i != len(node.value) - 1:
                        self.err(item, f"{name}.followup", "followup comes after the last block")
                    followup, fnode = item.value[0][1], item.value[0][0]
                else:
                    block_nodes.append(item)
        elif isinstance(node, MappingNode):
            for key, k, v in self.pairs(node, name):
                if key == "blocks":
                    if isinstance(v, SequenceNode):
                        block_nodes = list(v.value)
                    else:
                        self.err(v, f"{name}.blocks", "expected a list of blocks")
                elif key == "followup":
                    followup, fnode = v, k
                elif key in BLOCK_KEYS:
                    self.err(k, f"{name}.{key}", "a tag holds a list of blocks: write `- workers: ...` "
                                                 "(a dash before the first key of each block)")
                    return None
                else:
                    self.err(k, f"{name}.{key}", "unknown key (expected 'blocks' and 'followup')"
                                                 + _suggest(key, ("blocks", "followup")))
        else:
            self.err(node, name, "expected a list of blocks under the tag")
            return None
        blocks = []
        for i, bn in enumerate(block_nodes, 1):
            is_last = i == len(block_nodes)
            b, inner_followup = self.block(name, i, bn, is_last)
            if inner_followup is not None:
                if followup is not None:
                    self.err(inner_followup[0], f"{name}.followup", "followup given twice")
                followup, fnode = inner_followup[1], inner_followup[0]
            if b is not None:
                blocks.append(b)
        if beside is not None:
            if fnode is not None:
                self.err(beside[0], f"{name}.followup", f"followup given twice (also on line {_line(fnode)}): "
                                                        "keep one")
            else:
                fnode, followup = beside
        if not block_nodes:
            self.err(node, name, "the tag has no blocks: give at least one `- workers: ...`")
        fu = "fail" if name == DEFAULT_TAG else "default"
        if followup is not None:
            text = self.scalar(followup, f"{name}.followup", "default or fail")
            if text is not None:
                if text not in FOLLOWUPS:
                    self.err(followup, f"{name}.followup", f"bad followup {text!r}: use 'default' or 'fail'"
                             + _suggest(text, FOLLOWUPS))
                elif name == DEFAULT_TAG and text == "default":
                    self.err(followup, f"{name}.followup", "the default tag cannot follow up to itself: "
                                                           "use 'fail' or leave followup out")
                else:
                    fu = text
        return TagPolicy(name=name, blocks=tuple(blocks), followup=fu, line=_line(knode))

    # --- one block -------------------------------------------------------------------
    def block(self, tag: str, i: int, node: Node, is_last: bool):
        where = f"{tag}[{i}]"
        if not isinstance(node, MappingNode):
            self.err(node, where, "a block is a map with 'workers' (and optional strategy, invalidate, affinity)")
            return None, None
        n_errors = len(self.errors)
        workers: Optional[tuple[str, ...]] = None
        have_workers = False
        strategy = "any"
        invalidate = None
        require: tuple[str, ...] = ()
        forbid: tuple[str, ...] = ()
        inner_followup = None
        for key, k, v in self.pairs(node, where):
            path = f"{where}.{key}"
            if key == "workers":
                have_workers = True
                workers = self.workers(path, v)
            elif key == "strategy":
                text = self.scalar(v, path, "a strategy name")
                if text is not None:
                    if text in STRATEGIES:
                        strategy = text
                    else:
                        self.err(v, path, f"unknown strategy {text!r} (expected one of: {', '.join(STRATEGIES)})"
                                 + _suggest(text, STRATEGIES))
            elif key == "invalidate":
                invalidate = self.invalidate(path, v)
            elif key == "affinity":
                require, forbid = self.affinity(path, v)
            elif key == "followup":
                if is_last:
                    inner_followup = (k, v)
                else:
                    self.err(k, path, "followup belongs to the tag: put it after the last block")
            else:
                self.err(k, path, f"unknown key (expected one of: {', '.join(BLOCK_KEYS)})"
                         + _suggest(key, BLOCK_KEYS + ("followup",)))
        if not have_workers:
            self.err(node, where, "missing workers: give `workers: *` or a list of worker names")
        if len(self.errors) != n_errors:
            return None, inner_followup
        return Block(workers=workers, strategy=strategy, invalidate=invalidate, require=require,
                     forbid=forbid, line=_line(node)), inner_followup

    def workers(self, path: str, node: Node) -> Optional[tuple[str, ...]]:
        if isinstance(node, ScalarNode):
            text = self.scalar(node, path, "'*' or a list of worker names")
            if text == "*":
                return None
            self.err(node, path, f"expected '*' or a list of worker names, got {text!r} "
                                 f"(write `workers: [{text}]` for one worker)")
            return None
        if not isinstance(node, SequenceNode):
            self.err(node, path, "expected '*' or a list of worker names")
            return None
        names: list[str] = []
        for item in node.value:
            name = None
            if isinstance(item, MappingNode):  # APP's `- wrk: name`
                pairs = self.pairs(item, path)
                if len(pairs) == 1 and pairs[0][0] == "wrk":
                    name = self.scalar(pairs[0][2], f"{path}.wrk", "a worker name")
                else:
                    self.err(item, path, "a worker is a name or `wrk: name`")
                    continue
            else:
                name = self.scalar(item, path, "a worker name")
            if name is None:
                continue
            if name == "*":
                self.err(item, path, "'*' stands alone: write `workers: *`, not inside a list")
            elif not WORKER_RE.match(name):
                self.err(item, path, f"bad worker name {name!r}")
            elif name in names:
                self.err(item, path, f"worker {name!r} listed twice")
            else:
                names.append(name)
        if not node.value:
            self.err(node, path, "empty worker list: name at least one worker or use `*`")
        return tuple(names)

    def percent(self, path: str, node: Node, text: str) -> Optional[float]:
        raw = text.strip()
        num = raw[:-1].strip() if raw.endswith("%") else raw
        try:
            value = float(num)
        except ValueError:
            value = None
        if value is None or not (0 < value <= 100):
            self.err(node, path, f"bad percentage {raw!r}: give a number above 0 and at most 100, e.g. 50%")
            return None
        return value

    def count(self, path: str, node: Node, text: str) -> Optional[int]:
        try:
            value = int(text.strip())
        except ValueError:
            value = None
        if value is None or value < 1:
            self.err(node, path, f"bad count {text.strip()!r}: give a whole number of at least 1")
            return None
        return value

    def invalidate(self, path: str, node: Node) -> Optional[Invalidate]:
        found: dict[str, object] = {}

        def put(name: str, value_text: Optional[str], at: Node) -> None:
            key = f"{path}.{name}"
            if name in found:
                self.err(at, key, "given twice")
                return
            if name == "overload":
                if value_text not in (None, "true", "True"):
                    self.err(at, key, "overload takes no value")
                    return
                found["capacity_used"] = 100.0
                found[name] = True
            elif name == "capacity_used":
                if value_text is None:
                    self.err(at, key, "missing percentage, e.g. capacity_used 50%")
                elif "capacity_used" in found:
                    self.err(at, key, "given twice (overload is capacity_used 100%)")
                else:
                    found[name] = self.percent(key, at, value_text)
            elif name == "max_concurrent_invocations":
                if value_text is None:
                    self.err(at, key, "missing count, e.g. max_concurrent_invocations 10")
                else:
                    found[name] = self.count(key, at, value_text)
            else:
                self.err(at, key, "unknown invalidation (expected capacity_used N%, "
                                  "max_concurrent_invocations N or overload)"
                         + _suggest(name, ("capacity_used", "max_concurrent_invocations", "overload")))

        def one(item: Node) -> None:
            if isinstance(item, ScalarNode):
                text = (self.scalar(item, path, "an invalidation") or "").strip()
                if text == "overload":
                    put("overload", None, item)
                    return
                m = _INVALIDATE_TEXT.match(text)
                if m:
                    put(m["name"], m["value"], item)
                else:
                    put(text or "(empty)", None, item)
            elif isinstance(item, MappingNode):
                for name, k, v in self.pairs(item, path):
                    put(name, self.scalar(v, f"{path}.{name}", "a value"), v)
            else:
                self.err(item, path, "expected an invalidation")

        if isinstance(node, SequenceNode):
            for item in node.value:
                one(item)
        else:
            one(node)
        if any(v is None for v in found.values()):
            return None
        return Invalidate(capacity_used=found.get("capacity_used"),
                          max_concurrent_invocations=found.get("max_concurrent_invocations"))

    def affinity(self, path: str, node: Node) -> tuple[tuple[str, ...], tuple[str, ...]]:
        items: list[tuple[str, Node]] = []
        if isinstance(node, SequenceNode):
            for item in node.value:
                text = self.scalar(item, path, "a tag or !tag")
                if text is not None:
                    items.extend((t, item) for t in re.split(r"[,\s]+", text.strip()) if t)
        else:
            text = self.scalar(node, path, "a list of tags")
            if text is not None:
                items.extend((t, node) for t in re.split(r"[,\s]+", text.strip()) if t)
        require: list[str] = []
        forbid: list[str] = []
        for text, at in items:
            neg = text.startswith("!")
            name = text[1:] if neg else text
            if not TAG_RE.match(name):
                self.err(at, path, f"bad affinity entry {text!r}: write `tag` or `!tag`")
                continue
            bucket = forbid if neg else require
            if name not in bucket:
                bucket.append(name)
        for name in set(require) & set(forbid):
            self.err(node, path, f"affinity both requires and forbids {name!r}")
        if not items and isinstance(node, (SequenceNode, ScalarNode)):
            self.err(node, path, "empty affinity: list tags (`tag` or `!tag`) or leave the key out")
        self.affinity_refs.extend((n, node, path) for n in [*require, *forbid])
        return tuple(require), tuple(forbid)

    def check_affinity_tags(self, tags: dict[str, TagPolicy]) -> None:
        for name, node, path in self.affinity_refs:
            if name not in tags and name != DATA_AFFINITY:  # `data`: where the task's refs live
                self.warnings.append(Problem(_line(node), path,
                                             f"affinity on tag {name!r}, which this policy does not define "
                                             f"(functions tagged {name!r} use the default blocks)"))


def load_policy(text: str, source: str = "<policy>") -> Policy:
    """Parse and validate `text`; return the Policy or raise PolicyError naming every problem."""
    return _Loader(source).load(text)


def load_policy_file(path: str | Path) -> Policy:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise PolicyError([Problem(None, "", f"cannot read {p}: {exc.strerror or exc}")], str(p)) from None
    return load_policy(text, source=str(p))
