"""The nemesis's approval journals: what the replay agent plays for a run that asks is, with
the relay's answer lines, the journal an uninterrupted run with the same answers leaves, so
its translation is the run's reference (:mod:`tests.nemesis.approvals`)."""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from baton_tools.reference import expected_status, reference_chunks
from sandbox_host.agents._replay import PROGRAM_PATH
from sandbox_host.run_inputs import answer_payload
from tests.nemesis.approvals import ASKS, DENIAL, approval_journal, asked, deliveries, request_id

CORPUS = pathlib.Path(__file__).resolve().parents[2] / "corpus"
CASES = [(j, d) for j, tools in ASKS.items() for d in (("a", "d") if len(tools) == 1 else ("aa", "ad", "da", "dd"))]


@pytest.mark.unit
@pytest.mark.parametrize(("journal", "decisions"), CASES)
def test_each_ask_is_answered_once_in_the_reference(tmp_path: pathlib.Path, journal: str, decisions: str) -> None:
    rel = approval_journal(CORPUS, tmp_path, journal, decisions)
    assert approval_journal(CORPUS, tmp_path, journal, decisions) == rel  # written once
    ref = reference_chunks(tmp_path / rel, "claude-stream-json", "r1", "t1")
    ids = [request_id(i) for i in range(len(decisions))]
    assert asked(ref) == ids and deliveries(ref) == ids and expected_status(ref) == "completed"
    answers = [c["content"] for c in ref if c.get("activityType") == "approval_answer"]
    assert [a["approved"] for a in answers] == [d == "a" for d in decisions]
    assert [a.get("message") for a in answers] == [None if d == "a" else DENIAL for d in decisions]


@pytest.mark.servers  # runs the replay agent
@pytest.mark.timeout(60)
@pytest.mark.parametrize(("journal", "decisions"), CASES)
def test_the_replay_agent_plays_it_as_written(tmp_path: pathlib.Path, journal: str, decisions: str) -> None:
    """Given the answers, the agent writes every line but the relay's (which the run's relay
    writes as it passes each answer on)."""
    rel = approval_journal(CORPUS, tmp_path, journal, decisions)
    stdin = b"".join(answer_payload(request_id(i), "allow" if d == "a" else "deny", DENIAL, None) + b"\n"
                     for i, d in enumerate(decisions))
    out = subprocess.run([sys.executable, PROGRAM_PATH, "--journal", str(tmp_path / rel), "--speed", "0"],
                         input=stdin, capture_output=True, timeout=30, check=True)
    written = (tmp_path / rel).read_text().splitlines()
    assert out.stdout.decode().splitlines() == [x for x in written if json.loads(x)["type"] != "baton_input"]
