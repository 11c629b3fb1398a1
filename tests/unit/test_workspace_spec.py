"""The workspace schema (gateway and host alike) and the host's checks of it: bad input is an
``InvalidArgument`` naming the field; credentials are names, never values."""
from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest

from baton.errors import InvalidArgument
from baton.v1 import runs_pb2
from baton.workspace_spec import MAX_SETUP_COMMANDS, WorkspaceSpec, parse_workspace, workspace_dirs
from sandbox_host.providers._workspace import GIT_TOKEN_ENV, GIT_USERNAME_ENV, git_env, redactions
from sandbox_host.run_workspace import (GitCredential, WorkspaceSettings, check_start, load_git_credentials,
                                        spec_fields)

pytestmark = pytest.mark.unit


def _refused(obj: Any, dirs: tuple[str, ...] = ()) -> InvalidArgument:
    with pytest.raises(InvalidArgument) as refused:
        parse_workspace(obj, dirs=dirs)
    return refused.value


def test_a_git_workspace_round_trips_through_the_record() -> None:
    spec = parse_workspace({"git": "https://example.com/a/b.git", "ref": "release/1.2", "credential": "ci.bot",
                            "setup": ["make deps", "make"]}, dirs=())
    assert spec is not None
    raw = spec.to_record()
    assert json.loads(raw) == {"git": "https://example.com/a/b.git", "ref": "release/1.2",
                               "credential": "ci.bot", "setup": ["make deps", "make"]}
    assert WorkspaceSpec.from_record(raw) == spec
    assert WorkspaceSpec.from_record("") is None
    assert parse_workspace(None, dirs=()) is None


@pytest.mark.parametrize("url", ["https://h/x", "http://h:8080/x.git", "ssh://git@h/x", "git://h/x",
                                 "git@github.com:o/r.git"])
def test_remote_schemes_are_accepted(url: str) -> None:
    spec = parse_workspace({"git": url}, dirs=())
    assert spec is not None and spec.git == url


@pytest.mark.parametrize("obj, field, words", [
    ([], "workspace", "must be an object"),
    ({}, "workspace", "exactly one of git and dir"),
    ({"git": "https://h/x", "dir": "/tmp"}, "workspace", "exactly one of git and dir"),
    ({"git": "https://h/x", "branch": "main"}, "workspace.branch", "is not a workspace field"),
    ({"git": "ftp://h/x"}, "workspace.git", "schemes"),
    ({"git": "ext::sh -c evil"}, "workspace.git", "no leading '-', no whitespace"),
    ({"git": "-uhttps://h/x"}, "workspace.git", "no leading '-'"),
    ({"git": "https://user:pw@h/x"}, "workspace.git", "must not carry credentials"),
    ({"git": "https://tok@h/x"}, "workspace.git", "must not carry credentials"),
    ({"git": "https:///x"}, "workspace.git", "must name a host"),
    ({"git": "https://h/x", "ref": "--upload-pack=x"}, "workspace.ref", "git ref name"),
    ({"git": "https://h/x", "ref": "a b"}, "workspace.ref", "git ref name"),
    ({"git": "https://h/x", "ref": "a..b"}, "workspace.ref", "git ref name"),
    ({"git": "https://h/x", "ref": "x" * 300}, "workspace.ref", "at most"),
    ({"git": "https://h/x", "credential": "a/b"}, "workspace.credential", "credential name"),
    ({"git": "ssh://h/x", "credential": "c"}, "workspace.credential", "https and http"),
    ({"git": "https://h/x", "setup": "make"}, "workspace.setup", "tuple"),
    ({"git": "https://h/x", "setup": ["ok", 3]}, "workspace.setup[1]", "string"),
    ({"git": "https://h/x", "setup": [" "]}, "workspace.setup[0]", "must not be empty"),
    ({"git": "https://h/x", "setup": ["x"] * (MAX_SETUP_COMMANDS + 1)}, "workspace.setup", "at most 32"),
    ({"dir": "/srv/x", "ref": "main"}, "workspace.ref", "git workspace only"),
    ({"dir": "relative/path"}, "workspace.dir", "absolute"),
])
def test_bad_input_names_the_field(obj: Any, field: str, words: str) -> None:
    err = _refused(obj)
    assert err.field == field
    assert words in err.problem


def test_a_url_is_never_quoted_in_an_error() -> None:
    assert "pw" not in str(_refused({"git": "https://user:pw@h/x"}))


def test_dirs_and_local_repositories_only_inside_the_allow_list(tmp_path: pathlib.Path) -> None:
    allowed = tmp_path / "allowed"
    (allowed / "proj").mkdir(parents=True)
    (tmp_path / "other").mkdir()
    (allowed / "escape").symlink_to(tmp_path / "other")
    dirs = workspace_dirs(f"{allowed},{tmp_path / 'nonexistent'}")
    spec = parse_workspace({"dir": str(allowed / "proj" / ".." / "proj")}, dirs=dirs)
    assert spec is not None and spec.dir == str((allowed / "proj").resolve())
    for bad in ({"dir": str(tmp_path / "other")}, {"dir": str(allowed / "escape")},
                {"git": str(tmp_path / "other")}, {"git": f"file://{tmp_path / 'other'}"}):
        assert "BATON_WORKSPACE_DIRS" in _refused(bad, dirs).problem
    assert _refused({"dir": str(allowed / "proj")}, ()).field == "workspace.dir"  # empty list: none allowed
    local = parse_workspace({"git": f"file://{allowed / 'proj'}"}, dirs=dirs)
    assert local is not None and local.git == f"file://{(allowed / 'proj').resolve()}"
    assert workspace_dirs("/a:/b,/c") == ("/a", "/b", "/c")


def _settings(**creds: GitCredential) -> WorkspaceSettings:
    return WorkspaceSettings(credentials={"acme": creds}, build_timeout=30, max_bytes=1000)


def test_the_host_refuses_a_credential_its_tenant_does_not_have() -> None:
    raw = json.dumps({"git": "https://h/x", "credential": "ci"})
    settings = _settings(ci=GitCredential("bot", "tok-123456", "https://h/"))
    assert json.loads(check_start(raw, "acme", settings))["credential"] == "ci"
    with pytest.raises(InvalidArgument) as refused:
        check_start(raw, "other-tenant", settings)
    assert refused.value.field == "workspace.credential"
    assert "'ci'" in refused.value.problem and "tok-" not in str(refused.value)
    assert check_start("", "acme", settings) == ""


def test_the_spec_carries_the_credential_as_secrets_and_the_thread_for_session_agents() -> None:
    settings = _settings(ci=GitCredential("bot", "tok-123456", "https://h/"))
    rec = runs_pb2.RunRecord(run_id="r", thread_id="t1", tenant="acme",
                             agent=runs_pb2.AgentSpec(kind="claude-code"),
                             workspace_json=json.dumps({"git": "https://h/x", "ref": "v1", "credential": "ci",
                                                        "setup": ["make"]}))
    fields = spec_fields(rec, settings)
    assert fields == {"workspace": "https://h/x", "workspace_is_git": True, "git_ref": "v1", "setup": ("make",),
                      "secrets": {GIT_TOKEN_ENV: "tok-123456", GIT_USERNAME_ENV: "bot"}, "thread_dir": "t1",
                      "build_timeout": 30, "max_workspace_bytes": 1000, "rebuild_thread_dir": False}
    rec.agent.kind = "replay"
    assert spec_fields(rec, settings)["thread_dir"] is None
    assert spec_fields(runs_pb2.RunRecord(run_id="r"), settings) == {}
    assert "tok-123456" not in repr(settings)


def test_the_run_view_shows_the_workspace_by_name_only() -> None:
    from gateway._views import record_json

    ws = {"git": "https://h/x", "ref": "v1", "credential": "ci", "setup": ["make"]}
    rec = runs_pb2.RunRecord(run_id="r", thread_id="t1", workspace_json=json.dumps(ws))
    assert record_json(rec)["workspace"] == ws  # the credential's name; its secret is never in a record
    assert record_json(runs_pb2.RunRecord(run_id="r"))["workspace"] is None
    assert record_json(runs_pb2.RunRecord(run_id="r", workspace_json="not json"))["workspace"] is None


def test_git_gets_the_credential_as_an_origin_scoped_header_in_its_environment() -> None:
    secrets = {GIT_USERNAME_ENV: "bot", GIT_TOKEN_ENV: "tok-123456"}
    env = git_env("https://git.example.com:8443/o/r.git", secrets, "/tmp/h")
    assert env["GIT_CONFIG_COUNT"] == "1"
    assert env["GIT_CONFIG_KEY_0"] == "http.https://git.example.com:8443/.extraHeader"
    assert env["GIT_CONFIG_VALUE_0"].startswith("Authorization: Basic ")
    assert env["GIT_TERMINAL_PROMPT"] == "0" and env["HOME"] == "/tmp/h"
    hidden = redactions(secrets)
    assert "tok-123456" in hidden and env["GIT_CONFIG_VALUE_0"] in hidden
    assert "GIT_CONFIG_COUNT" not in git_env("https://h/x", {}, "/tmp/h")


def test_the_credentials_file_is_checked_without_quoting_a_token(tmp_path: pathlib.Path) -> None:
    good = tmp_path / "creds.json"
    good.write_text(json.dumps({"acme": {"ci": {"username": "bot", "token": "tok-1", "url": "https://git.example.com/acme/"},
                                         "ro": {"token": "tok-2", "url": "https://git.example.com/"}}}))
    creds = load_git_credentials(str(good))
    assert creds["acme"]["ci"] == GitCredential("bot", "tok-1", "https://git.example.com/acme/") and creds["acme"]["ro"].username == ""
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"acme": {"ci": {"username": "bot", "token": "tok-SECRET", "extra": 1}}}))
    with pytest.raises(ValueError) as refused:
        load_git_credentials(str(bad))
    assert "BATON_GIT_CREDENTIALS_FILE" in str(refused.value) and "tok-SECRET" not in str(refused.value)
