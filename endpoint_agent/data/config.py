"""The `data:` section of an endpoint's config.yaml: the endpoint's stores (skyfn.data).

    data:
      default: redis            # the store tasks' large arguments and results go to by reference
      redis:                    # the endpoint's Redis: started beside the agent, or an existing one
        start: auto             # auto: start redis-server if it is installed; true; false (use host/port)
        host: 127.0.0.1
        port: 0                 # 0 with start: any free port
        password_file: ~/.redis-pass   # default with start: generated in the endpoint directory (0600)
        tls: false
      direct:                   # serve this endpoint's objects to other endpoints peer to peer (store "direct")
        rendezvous: rdv.example.org:7300   # endpoint_agent/data/object_server.py DirectData: name, directory, token_file, ...
      stores:                   # more named stores, one connector each
        scratch: {connector: file, directory: /lustre/scratch/me/skyfn}

A Redis store always has a password. Unknown keys and connector names are errors that
list the allowed ones.
"""
from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from endpoint_agent.data.object_server import DirectData, parse_direct_config
from skyfn.data.connectors import CONNECTORS
from skyfn.data.globus_config import GlobusSettings, parse_globus

STORE_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"


class RedisData(BaseModel):
    model_config = ConfigDict(extra="forbid")

    start: Union[Literal["auto"], bool] = "auto"
    host: str = "127.0.0.1"
    port: int = Field(default=0, ge=0, le=65535)
    password_file: Optional[str] = None
    username: Optional[str] = None
    db: int = Field(default=0, ge=0, le=15)
    tls: bool = False
    tls_ca_certs: Optional[str] = None
    maxmemory: Optional[str] = Field(default=None, pattern=r"^[0-9]+[kmgKMG]?[bB]?$")
    chunk_bytes: int = Field(default=8 << 20, ge=1 << 20, le=512 << 20)  # 8 MiB measured fastest

    @model_validator(mode="after")
    def _existing(self) -> "RedisData":
        if self.start is False and (not self.port or not self.password_file):
            raise ValueError("an existing Redis (start: false) needs port and password_file (a Redis store always "
                             "has a password)")
        return self


class DataConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    default: Optional[str] = Field(default=None, pattern=STORE_NAME)
    redis: Optional[RedisData] = None
    stores: dict[str, dict[str, Any]] = Field(default_factory=dict)
    globus: Optional[GlobusSettings] = None   # GlobusFile staging (skyfn.data.globus_config, endpoint_agent/data/staging.py)
    direct: Optional[DirectData] = None       # the object server of the direct path (endpoint_agent/data/object_server.py)

    @field_validator("direct", mode="before")
    @classmethod
    def _direct(cls, value: Any) -> Any:
        return None if value is None else parse_direct_config(value)

    @field_validator("globus", mode="before")
    @classmethod
    def _globus(cls, value: Any) -> Any:
        return None if value is None else parse_globus(value)

    @field_validator("stores")
    @classmethod
    def _stores(cls, stores: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        import re

        for name, spec in stores.items():
            if not re.match(STORE_NAME, name):
                raise ValueError(f"store name {name!r}: use letters, digits, '.', '_' or '-' (at most 64)")
            if not isinstance(spec, dict) or "connector" not in spec:
                raise ValueError(f"store {name!r} needs 'connector' (one of {', '.join(sorted(CONNECTORS))})")
            if spec["connector"] not in CONNECTORS:
                raise ValueError(f"store {name!r}: unknown connector {spec['connector']!r}; allowed: "
                                 f"{', '.join(sorted(CONNECTORS))}")
            if name == "redis":
                raise ValueError("store name 'redis' is the endpoint's own Redis (data: redis:); choose another name")
            if name == "direct":
                raise ValueError("store name 'direct' is the endpoint's direct store (data: direct:); choose another "
                                 "name")
        return stores

    @model_validator(mode="after")
    def _default(self) -> "DataConfig":
        names = set(self.stores) | ({"redis"} if self.redis is not None else set()) | (
            {"direct"} if self.direct is not None else set())
        if self.default is not None and self.default not in names:
            raise ValueError(f"default {self.default!r} is not a store of this endpoint; its stores: "
                             f"{', '.join(sorted(names)) or 'none (add data: redis: or data: stores:)'}")
        return self
