"""`skyfn-endpoint configure --multi-user NAME` (issue 23): the files it writes, their modes, that
they load and work together, and the settings' errors."""
from __future__ import annotations

import os
import stat

import pytest
from typer.testing import CliRunner

from endpoint_agent.cli import app
from endpoint_agent.config import ConfigError, load_config, parse_config
from endpoint_agent.multiuser.accounts import load_environment_file
from endpoint_agent.multiuser.configure import (FILES, is_multi_user, load_multi_user_config,
                                                parse_multi_user_config)
from endpoint_agent.multiuser.identity import IdentityMapper
from endpoint_agent.multiuser.templates import UserConfigRefused, UserConfigTemplate


def _configure(*args):
    return CliRunner().invoke(app, ["configure", *args])


def test_configure_multi_user_writes_the_files_with_their_modes_and_refuses_to_overwrite(home):
    result = _configure("--multi-user", "site")
    assert result.exit_code == 0, result.output
    d = home / "endpoints" / "site"
    assert sorted(p.name for p in d.iterdir()) == sorted(FILES)
    for name, mode in FILES.items():
        assert stat.S_IMODE(os.stat(d / name).st_mode) == mode, name
        assert str(d / name) in result.output
    (d / "user_environment").write_text("LANG=C.UTF-8\nEDITED=1\n")
    again = _configure("--multi-user", "site")
    assert again.exit_code == 1
    assert "exist; use --force to overwrite" in again.output and str(d / "config.yaml") in again.output
    assert "EDITED=1" in (d / "user_environment").read_text()  # nothing was written
    forced = _configure("--multi-user", "site", "--force")
    assert forced.exit_code == 0 and "EDITED" not in (d / "user_environment").read_text()
    single = _configure("plain")  # the single-user configure is as it was
    assert single.exit_code == 0 and sorted(p.name for p in (home / "endpoints" / "plain").iterdir()) == \
        ["config.yaml"]


def test_the_written_files_load_and_work_together(home):
    assert _configure("--multi-user", "site").exit_code == 0
    d = home / "endpoints" / "site"
    config = load_multi_user_config(d / "config.yaml")
    assert is_multi_user(d / "config.yaml") and config.multi_user is True
    assert config.path("identity_mapping_file") == d / "identity_mapping.yaml"
    assert config.path("audit_log") == d / "audit.log"
    assert (config.working_directory, config.deny_accounts, config.min_uid, config.idle_timeout,
            config.lane_idle_timeout) == ("{home}/.skyfn/work", ["root", "nobody"], 1000, 600.0, 3600.0)
    mapper = IdentityMapper.from_file(config.path("identity_mapping_file"), "site")
    assert mapper.map({"id": "u-1", "email": "alice@example.org"}).account == "alice"
    assert mapper.map({"id": "u-2", "email": "alice@example.com"}).account is None
    template = UserConfigTemplate.from_files(config.path("user_config_template"), config.path("user_config_schema"))
    local = template.render("alice", {"workers": 3})
    assert parse_config(local.config).provider == "local" and parse_config(local.config).workers == 3
    slurm = template.render("alice", {"partition": "debug", "nodes": 2, "walltime": "00:30:00"})
    parsed = parse_config(slurm.config)  # a user agent's config the single-user agent accepts
    assert parsed.provider == "slurm" and slurm.config["blocks"]["partition"] == "debug"
    assert parsed.scaling.nodes_per_block == 2
    with pytest.raises(UserConfigRefused, match="user_config.partition: 'debug\\\\nmax_workers: 999' does not match"):
        template.render("alice", {"partition": "debug\nmax_workers: 999"})
    with pytest.raises(UserConfigRefused, match="user_config.nodes: 0 is less than the minimum of 1"):
        template.render("alice", {"partition": "debug", "nodes": 0})
    assert load_environment_file(config.path("user_environment_file")) == {"LANG": "C.UTF-8"}
    with pytest.raises(ConfigError, match="unknown key 'multi_user'"):
        load_config(d / "config.yaml")  # a single-user agent never runs this config as root


@pytest.mark.parametrize("data,message", [
    ({}, "key 'multi_user' is missing; a multi-user endpoint's config.yaml says `multi_user: true`"),
    ({"multi_user": True, "idle_timeout": -1},
     "key 'idle_timeout': value -1 is not allowed (Input should be greater than 0)"),
    ({"multi_user": True, "idle_timout": 5}, "unknown key 'idle_timout' (value 5); allowed keys: multi_user, "),
    ({"multi_user": True, "working_directory": "work/{user}"},
     "key 'working_directory': value 'work/{user}' is not allowed (it must give an absolute path"),
    ({"multi_user": True, "working_directory": "/w/{uid}"},
     "key 'working_directory': value '/w/{uid}' is not allowed (only {home} and {user} may be used"),
    ({"multi_user": True, "deny_accounts": ["ok", "a b"]}, "'a b' is not an account or group name"),
    ({"multi_user": True, "min_uid": 0}, "key 'min_uid': value 0 is not allowed"),
    ({"multi_user": True, "lane_idle_timeout": 60},
     "key 'lane_idle_timeout': value 60 is not allowed (it is shorter than idle_timeout (600): a lane is unbound "
     "only once its user agent has stopped idle; set lane_idle_timeout to at least 600, or lower idle_timeout)"),
    ({"multi_user": True, "idle_timeout": 5, "lane_idle_timeout": 0},
     "key 'lane_idle_timeout': value 0 is not allowed (Input should be greater than 0)"),
])
def test_bad_settings_name_the_file_the_key_and_what_is_allowed(data, message):
    with pytest.raises(ConfigError) as info:
        parse_multi_user_config(data, "/etc/site/config.yaml")
    assert str(info.value).startswith("invalid multi-user endpoint configuration in /etc/site/config.yaml:")
    assert message in str(info.value)


def test_a_missing_or_broken_config_says_how_to_make_one(tmp_path):
    with pytest.raises(ConfigError, match="run `skyfn-endpoint configure --multi-user NAME` first"):
        load_multi_user_config(tmp_path / "config.yaml")
    (tmp_path / "config.yaml").write_text("multi_user: true\ndeny_accounts: [root\n")
    with pytest.raises(ConfigError, match="line 3, column 1: not valid YAML"):
        load_multi_user_config(tmp_path / "config.yaml")
