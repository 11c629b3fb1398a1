"""Agent credentials come from the host's environment, reach only the agent that needs them,
and a host without them refuses the run up front, naming the variable (never a value)."""
from __future__ import annotations

import pathlib

import pytest

from baton.errors import InvalidArgument
from sandbox_host.agents import prepare_agent
from sandbox_host.deps import HostDeps, HostSettings

ENV = {"ANTHROPIC_API_KEY": "sk-ant-secret-value", "OPENAI_API_KEY": "sk-openai-secret", "HOME": "/root",
       "BATON_PROVIDER": "local"}


def _deps(env: dict[str, str]) -> HostDeps:
    return HostDeps(host_id="h", cc=None, session=None, log=None, transcripts=None, providers={},
                    settings=HostSettings.from_env(env))


def test_host_settings_keep_only_agent_credentials_and_hide_them_from_repr() -> None:
    settings = HostSettings.from_env(ENV)
    assert dict(settings.secrets) == {"ANTHROPIC_API_KEY": "sk-ant-secret-value", "OPENAI_API_KEY": "sk-openai-secret"}
    assert "sk-ant-secret-value" not in repr(settings)


def test_each_agent_gets_only_its_own_credential() -> None:
    deps = _deps(ENV)
    claude = prepare_agent("claude-code", {}, prompt="hi")
    codex = prepare_agent("codex", {}, prompt="hi")
    assert deps.agent_secrets(claude) == {"ANTHROPIC_API_KEY": "sk-ant-secret-value"}
    assert deps.agent_secrets(codex) == {"OPENAI_API_KEY": "sk-openai-secret"}


def test_a_host_without_the_credential_refuses_naming_the_variable_not_a_value() -> None:
    deps = _deps({"OPENAI_API_KEY": "sk-openai-secret"})
    with pytest.raises(InvalidArgument) as refused:
        deps.agent_secrets(prepare_agent("claude-code", {}, prompt="hi"))
    assert refused.value.field == "agent.kind"
    assert "ANTHROPIC_API_KEY or CLAUDE_CODE_OAUTH_TOKEN" in refused.value.problem
    assert "sk-" not in str(refused.value)


# --- per-tenant credentials (BATON_TENANT_SECRETS_DIR) ---------------------------------------


def _tenant_dir(root: pathlib.Path, files: dict[str, str]) -> str:
    for rel, value in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(value)
    return str(root)


def test_a_tenants_own_credential_wins_over_the_hosts_and_other_tenants_keep_the_hosts(tmp_path: pathlib.Path) -> None:
    secrets = _tenant_dir(tmp_path, {"acme/ANTHROPIC_API_KEY": "sk-ant-acme\n", "initech/OPENAI_API_KEY": "sk-oai-initech"})
    deps = _deps({**ENV, "BATON_TENANT_SECRETS_DIR": secrets})
    claude = prepare_agent("claude-code", {}, prompt="hi")
    assert deps.agent_secrets(claude, "acme") == {"ANTHROPIC_API_KEY": "sk-ant-acme"}
    assert deps.agent_secrets(claude, "globex") == {"ANTHROPIC_API_KEY": "sk-ant-secret-value"}
    assert deps.agent_secrets(claude, "initech") == {"ANTHROPIC_API_KEY": "sk-ant-secret-value"}
    assert deps.agent_secrets(claude, "") == {"ANTHROPIC_API_KEY": "sk-ant-secret-value"}
    assert "sk-ant-acme" not in repr(deps.settings)


def test_a_tenants_alternative_credential_replaces_the_hosts_whole_group(tmp_path: pathlib.Path) -> None:
    # acme's own OAuth token: it must not also get the host's API key (the CLI would prefer
    # the key and bill the shared account).
    secrets = _tenant_dir(tmp_path, {"acme/CLAUDE_CODE_OAUTH_TOKEN": "oauth-acme"})
    deps = _deps({**ENV, "BATON_TENANT_SECRETS_DIR": secrets})
    assert deps.agent_secrets(prepare_agent("claude-code", {}, prompt="hi"), "acme") == {
        "CLAUDE_CODE_OAUTH_TOKEN": "oauth-acme"}


def test_a_tenant_with_its_own_key_runs_on_a_host_without_a_shared_one(tmp_path: pathlib.Path) -> None:
    secrets = _tenant_dir(tmp_path, {"acme/OPENAI_API_KEY": "sk-oai-acme"})
    deps = _deps({"BATON_TENANT_SECRETS_DIR": secrets})
    codex = prepare_agent("codex", {}, prompt="hi")
    assert deps.agent_secrets(codex, "acme") == {"OPENAI_API_KEY": "sk-oai-acme"}
    with pytest.raises(InvalidArgument) as refused:
        deps.agent_secrets(codex, "globex")
    assert "for tenant 'globex' in BATON_TENANT_SECRETS_DIR" in refused.value.problem
    assert "sk-" not in str(refused.value)


@pytest.mark.parametrize("files, message", [
    ({"acme/ANTHROPIC_KEY": "sk-x"}, "acme/ANTHROPIC_KEY is not an agent credential"),
    ({"acme/OPENAI_API_KEY": "CHANGE-ME"}, "acme/OPENAI_API_KEY holds a placeholder"),
    ({"stray-file": "sk-x"}, "stray-file is not a directory"),
])
def test_a_bad_tenants_directory_is_refused_naming_the_file(tmp_path: pathlib.Path, files: dict[str, str],
                                                           message: str) -> None:
    with pytest.raises(ValueError, match=message) as refused:
        HostSettings.from_env({"BATON_TENANT_SECRETS_DIR": _tenant_dir(tmp_path, files)})
    assert "sk-x" not in str(refused.value) and "CHANGE-ME" not in str(refused.value)


def test_kubernetes_secret_volume_links_are_skipped(tmp_path: pathlib.Path) -> None:
    # What a Secret volume holds beside the files: ..data and ..<timestamp> entries.
    secrets = _tenant_dir(tmp_path, {"..2026_01_01/acme/OPENAI_API_KEY": "sk-oai-acme", "acme/.hidden": "x"})
    (tmp_path / "acme").mkdir(exist_ok=True)
    (tmp_path / "acme" / "OPENAI_API_KEY").symlink_to(tmp_path / "..2026_01_01" / "acme" / "OPENAI_API_KEY")
    (tmp_path / "..data").symlink_to(tmp_path / "..2026_01_01")
    assert HostSettings.from_env({"BATON_TENANT_SECRETS_DIR": secrets}).tenant_secrets == {
        "acme": {"OPENAI_API_KEY": "sk-oai-acme"}}
