"""Refusals: what ends a task FAILED on a multi-user endpoint before anything of it runs.

A `TaskRefused` is about one task (its identity maps to no account, the account is denied,
its user variables fail the schema); its message is the reason to report with FAILED. A
problem of the administrator's files is a `ConfigError` (endpoint_agent.errors) instead: it
stops the endpoint at start, not one task.
"""
from __future__ import annotations


class TaskRefused(Exception):
    """A task this endpoint will not run; str(exc) is the reason to report."""
