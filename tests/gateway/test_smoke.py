from tests.gateway.conftest import Gateway


async def test_ready(gateway: Gateway, http) -> None:
    r = await http.get(f"{gateway.url}/readyz")
    assert r.status_code == 200
    r = await http.get(f"{gateway.url}/healthz")
    assert r.json() == {"status": "ok"}
