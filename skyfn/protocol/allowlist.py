"""Endpoint function allowlists: which functions an endpoint agrees to run.

An endpoint's owner lists them in its config.yaml (`allowed_functions`); the agent reports
the list to the service when it registers and with every heartbeat. Each entry is a
function id, or an owner and a function name (any function that owner registered under
that name, including later versions). The service refuses a submission of any other
function to that endpoint (403), and the agent refuses, before deserializing anything, a
task that reaches it anyway. No list (None) means every function may run; an empty list
means none may.
"""
from __future__ import annotations

from typing import Iterable, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

MAX_ALLOWED_FUNCTIONS = 10_000
UUID_PATTERN = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
REFUSED = "function not allowed on this endpoint"


class AllowedFunction(BaseModel):
    """One entry: {function_id} or {owner, name}."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    function_id: Optional[str] = Field(default=None, pattern=UUID_PATTERN, description="a registered function's id")
    owner: Optional[str] = Field(default=None, min_length=1, max_length=256, description="the user who registered it")
    name: Optional[str] = Field(default=None, min_length=1, max_length=256, description="its registered name")

    @model_validator(mode="after")
    def _one_form(self) -> "AllowedFunction":
        if self.function_id is not None:
            if self.owner is not None or self.name is not None:
                raise ValueError("give either function_id, or owner and name, not both")
        elif self.owner is None or self.name is None:
            raise ValueError("an entry without function_id needs both owner and name")
        return self

    def matches(self, function_id: str, owner: str | None, name: str | None) -> bool:
        if self.function_id is not None:
            return self.function_id.lower() == function_id.lower()
        return owner is not None and name is not None and self.owner == owner and self.name == name

    def __str__(self) -> str:
        return self.function_id if self.function_id is not None else f"{self.owner}/{self.name}"


def permits(entries: Optional[Iterable[AllowedFunction]], function_id: str, owner: str | None = None,
            name: str | None = None) -> bool:
    """Whether a function (its id, and its owner and name when known) may run."""
    if entries is None:
        return True
    return any(e.matches(function_id, owner, name) for e in entries)


def refusal(endpoint: str, function_id: str, owner: str | None = None, name: str | None = None) -> str:
    """The message of a refusal, the same at the service and at the agent."""
    what = f"function {function_id}" + (f" ({owner}/{name})" if owner and name else "")
    return (f"{REFUSED}: {what} is not in the allowed_functions of endpoint {endpoint}; ask the endpoint's owner to "
            "add its id (or its owner and name) to allowed_functions in the endpoint's config.yaml, or run it on "
            "another endpoint")
