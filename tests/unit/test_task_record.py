"""The interchange's task record (endpoint_agent/task_record.py): new_record puts each field at
its T_ name, so a field added to one and not the other fails here."""
from __future__ import annotations

import inspect

from endpoint_agent import task_record
from endpoint_agent.task_record import (T_FN, T_ID, T_MGR, T_PACK, T_PAYLOAD, T_RECV, T_ROUTE, T_TRIES, T_WALL,
                                        new_record)


def test_new_record_puts_every_field_at_its_name():
    t = new_record("tid", "fid", "payload", 30.0, 7, 123.5, ("none", 0, 0))
    assert (t[T_ID], t[T_FN], t[T_PAYLOAD], t[T_WALL], t[T_PACK], t[T_RECV]) == \
        ("tid", "fid", "payload", 30.0, 7, 123.5)
    assert (t[T_TRIES], t[T_ROUTE], t[T_MGR]) == (0, ("none", 0, 0), None)


def test_the_names_cover_the_record_exactly():
    names = [n for n in vars(task_record) if n.startswith("T_")]
    record = new_record("a", "f", "", None, 1, 0.0, ())
    assert sorted(getattr(task_record, n) for n in names) == list(range(len(record)))
    assert len(inspect.signature(new_record).parameters) == len(names) - 2  # tries and manager start empty
