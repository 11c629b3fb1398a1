"""Run ids map injectively onto one subject-safe token; the config names the stream."""
from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from baton.ids import decode_token, subject_token
from baton.log import LogConfig
from baton.log._transcripts import thread_key

_TOKEN = re.compile(r"[A-Za-z0-9_%-]+")
_KV_KEY = re.compile(r"[-/_=.a-zA-Z0-9]+")

run_ids = st.one_of(
    st.text(min_size=1, max_size=64),
    st.text(alphabet=".*> \t/%-_ab", min_size=1, max_size=64),
    st.text(min_size=1000, max_size=1024),
)


@settings(max_examples=300)
@given(a=run_ids, b=run_ids)
def test_subject_token_is_injective_and_subject_safe(a: str, b: str) -> None:
    ta, tb = subject_token(a), subject_token(b)
    assert _TOKEN.fullmatch(ta)
    assert decode_token(ta) == a
    assert (ta == tb) == (a == b)
    cfg = LogConfig(subject_prefix="baton.runs")
    assert cfg.subject(a).count(".") == 2  # exactly one token after the prefix


@settings(max_examples=300)
@given(a=run_ids, b=run_ids)
def test_thread_key_is_injective_and_kv_safe(a: str, b: str) -> None:
    ka, kb = thread_key(a), thread_key(b)
    assert _KV_KEY.fullmatch(ka) and "." not in ka
    assert (ka == kb) == (a == b)


def test_config_from_env() -> None:
    env = {"BATON_RUNS_STREAM": "S", "BATON_SUBJECT_PREFIX": "p.q", "BATON_THREADS_BUCKET": "b",
           "BATON_LOG_MAX_AGE": "60", "BATON_LOG_REPLICAS": "3"}
    cfg = LogConfig.from_env(env)
    assert (cfg.stream, cfg.subject_prefix, cfg.bucket, cfg.max_age, cfg.replicas) == ("S", "p.q", "b", 60.0, 3)
    assert cfg.subjects_wildcard == "p.q.>"
    assert LogConfig.from_env({}) == LogConfig()
