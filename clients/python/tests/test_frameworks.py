"""Per route, in each framework's idiom: FastAPI's dependency (in the OpenAPI document, /docs
left open), Flask's decorator, the middlewares' exclusions; RFC 6750's answers; and the
verifier's on_refusal hook and counts."""

import json
import time

import pytest
from fastapi import FastAPI, Security
from fastapi.testclient import TestClient
from flask import Flask, g

from agentid_verifier import VerificationError, Verifier
from agentid_verifier.asgi import AgentIdMiddleware as Asgi
from agentid_verifier.fastapi import answer_refusals, require_agent as fastapi_agent
from agentid_verifier.flask import require_agent as flask_agent
from agentid_verifier.wsgi import AgentIdMiddleware as Wsgi
from test_dpop import Agent
from test_middleware import BARE, NO_CREDENTIALS, asgi_call, wsgi_call


def test_fastapi_protects_routes_that_ask_and_documents_them(server):
    agent_id, token = server.register(scopes=["read:orders"])
    signer = Agent()
    bound_id, bound = server.register(scopes=["read:orders"], jwk=signer.public)
    app = FastAPI()
    answer_refusals(app)  # the middlewares' body
    reader = fastapi_agent(Verifier(server.base, allow_local=True), scopes=["read:orders"], public_origin="https://api.example")

    @app.get("/orders")
    def orders(a=Security(reader)):
        return {"agent": a.agent_id}

    @app.get("/admin")
    def admin(a=Security(reader, scopes=["admin:x"])):
        return {"agent": a.agent_id}

    client = TestClient(app)
    assert client.get("/docs").status_code == 200
    doc = client.get("/openapi.json").json()
    assert doc["components"]["securitySchemes"]["agentid"]["scheme"] == "bearer"
    assert doc["paths"]["/orders"]["get"]["security"] == [{"agentid": ["read:orders"]}]
    assert sorted(doc["paths"]["/admin"]["get"]["security"][0]["agentid"]) == ["admin:x", "read:orders"]
    res = client.get("/orders")
    assert (res.status_code, res.json(), res.headers["www-authenticate"]) == (401, NO_CREDENTIALS, BARE)
    res = client.get("/orders", headers={"Authorization": "Bearer nope"})
    assert res.headers["www-authenticate"] == 'Bearer error="invalid_token"'
    assert client.get("/orders", headers={"Authorization": f"Bearer {token}"}).json() == {"agent": agent_id}
    res = client.get("/admin", headers={"Authorization": f"Bearer {token}"})
    assert res.status_code == 403
    assert res.headers["www-authenticate"] == 'Bearer error="insufficient_scope", scope="read:orders admin:x"'
    # A bound token, with a proof for the app's public origin and the route.
    proof = signer.proof(bound, htu="https://api.example/orders")
    res = client.get("/orders", headers={"Authorization": f"DPoP {bound}", "DPoP": proof})
    assert res.json() == {"agent": bound_id}
    # A helper without a public origin takes no bound token.
    blind = FastAPI()
    blind_reader = fastapi_agent(Verifier(server.base, allow_local=True))

    @blind.get("/orders")
    def blind_orders(a=Security(blind_reader)):
        return {"agent": a.agent_id}

    proof = signer.proof(bound, htu="http://testserver/orders")
    res = TestClient(blind).get("/orders", headers={"Authorization": f"DPoP {bound}", "DPoP": proof})
    assert res.status_code == 401 and "public_origin" in res.headers["www-authenticate"]
    # Without answer_refusals, FastAPI's own handler wraps the body.
    assert res.json()["detail"]["error"] == "TOKEN_INVALID"
    res = client.get("/orders", headers={"Authorization": f"Bearer {bound}"})
    assert res.status_code == 401 and res.headers["www-authenticate"].startswith('DPoP error="invalid_token"')
    # Two Authorization headers, one of them valid: refused.
    for pair in (("Bearer forged", f"Bearer {token}"), (f"Bearer {token}", "Bearer forged")):
        res = client.get("/orders", headers=[("Authorization", value) for value in pair])
        assert res.status_code == 401 and res.json()["error"] == "TOKEN_INVALID"


def test_flask_protects_the_views_it_decorates(server):
    agent_id, token = server.register(scopes=["read:orders"])
    signer = Agent()
    bound_id, bound = server.register(scopes=["read:orders"], jwk=signer.public)
    app = Flask(__name__)
    verifier = Verifier(server.base, allow_local=True)

    @app.get("/orders")
    @flask_agent(verifier, scopes=["read:orders"], public_origin="https://api.example")
    def orders():
        return {"agent": g.agent.agent_id}

    @app.get("/blind")
    @flask_agent(verifier)
    def blind():
        return {"agent": g.agent.agent_id}

    @app.get("/health")
    def health():
        return {"ok": True}

    client = app.test_client()
    assert client.get("/health").status_code == 200
    res = client.get("/orders")
    assert (res.status_code, res.json, res.headers["WWW-Authenticate"]) == (401, NO_CREDENTIALS, BARE)
    assert client.get("/orders", headers={"Authorization": f"Bearer {token}"}).json == {"agent": agent_id}
    proof = signer.proof(bound, htu="https://api.example/orders")
    res = client.get("/orders", headers={"Authorization": f"DPoP {bound}", "DPoP": proof})
    assert res.json == {"agent": bound_id}
    blind = client.get("/blind", headers={"Authorization": f"DPoP {bound}",
                                          "DPoP": signer.proof(bound, htu="http://localhost/blind")})
    assert blind.status_code == 401 and "public_origin" in blind.headers["WWW-Authenticate"]
    res = client.get("/orders", headers={"Authorization": f"DPoP {bound}", "DPoP": proof})
    assert res.status_code == 401 and res.json["error"] == "PROOF_REPLAYED" and res.json["message"]
    assert res.headers["WWW-Authenticate"].startswith('DPoP error="invalid_dpop_proof"')


def test_the_middlewares_leave_excluded_paths_open(server):
    async def asgi_app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"open"})

    def wsgi_app(environ, start_response):
        start_response("200 OK", [])
        return [b"open"]

    verifier = Verifier(server.base, allow_local=True)
    asgi = Asgi(asgi_app, verifier, exclude=["/health", "/docs"])
    wsgi = Wsgi(wsgi_app, verifier, exclude=["/health", "/docs"])
    for path, status in [("/health", 200), ("/docs", 200), ("/docs/oauth2-redirect", 200),
                         ("/healthz", 401), ("/orders", 401)]:
        assert asgi_call(asgi, path=path)[0] == status, path
        assert wsgi_call(wsgi, path=path)[0] == status, path


@pytest.mark.parametrize("exclude", ["/health", [""], ["health"], ["/health", ""]])
@pytest.mark.parametrize("middleware", [Asgi, Wsgi])
def test_an_exclusion_that_names_no_path_is_refused_when_made(exclude, middleware):
    """Attack: a plain string is one exclusion a character (``/`` among them), and an empty
    one (``os.environ.get("EXCLUDE", "").split(",")``) became the prefix ``/``: either left
    every path open, with no token."""
    with pytest.raises((TypeError, ValueError)):
        middleware(lambda *a: None, Verifier("http://127.0.0.1:9", issuers=["example.com"], allow_local=True), exclude=exclude)


def test_an_exclusion_of_the_root_leaves_the_root_alone_open(server):
    async def asgi_app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"open"})

    def wsgi_app(environ, start_response):
        start_response("200 OK", [])
        return [b"open"]

    verifier = Verifier(server.base, allow_local=True)
    for exclude in (["/"], ["//"]):
        asgi = Asgi(asgi_app, verifier, exclude=exclude)
        wsgi = Wsgi(wsgi_app, verifier, exclude=exclude)
        for path, status in [(exclude[0], 200), ("/orders", 401), ("/orders/1", 401)]:
            assert asgi_call(asgi, path=path)[0] == status, (exclude, path)
            assert wsgi_call(wsgi, path=path)[0] == status, (exclude, path)


def test_on_refusal_hears_every_refusal_with_its_reason(server):
    heard = []
    _, token = server.register(scopes=["read:orders"])
    verifier = Verifier(server.base, issuers=["other.example"], on_refusal=lambda code, why: heard.append((code, why)), allow_local=True)
    for call in (lambda: verifier.verify(token), lambda: verifier.verify_online(token), lambda: verifier.verify("x")):
        try:
            call()
        except Exception:
            pass
    assert [c for c, _ in heard] == ["TOKEN_INVALID"] * 3
    assert "issuer 'example.com' is not accepted" in heard[0][1]

    def broken(code, why):
        raise RuntimeError("a hook that fails")

    failing = Verifier(server.base, issuers=["other.example"], on_refusal=broken, allow_local=True)
    try:
        failing.verify(token)
        raise AssertionError("accepted")
    except Exception as e:  # the refusal, not the hook's failure
        assert getattr(e, "code", None) == "TOKEN_INVALID"


def test_a_warm_check_makes_no_thread_hop_and_a_cold_one_leaves_the_loop(server, monkeypatch):
    """The ASGI middleware checks a token on the event loop when the keys and list are cached
    and fresh, and sends a check that must fetch to a worker thread (never waiting on the
    network on the loop)."""
    import asyncio

    from test_middleware import asgi_call as call

    _, token = server.register()
    hops = []
    real = asyncio.to_thread

    async def counted(fn, *args):
        hops.append(fn)
        return await real(fn, *args)

    monkeypatch.setattr(asyncio, "to_thread", counted)

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": scope["agent"].agent_id.encode()})

    middleware = Asgi(app, Verifier(server.base, allow_local=True))
    assert call(middleware, f"Bearer {token}")[0] == 200
    assert len(hops) == 1, "the first check fetches keys and list: in a thread"
    for _ in range(3):
        assert call(middleware, f"Bearer {token}")[0] == 200
    assert len(hops) == 1, "warm checks stay on the loop"


def test_counts_of_outcomes_and_fetches_reach_prometheus(proxied):
    """Each verification is counted by outcome and each fetch by document and result; the
    collector exposes them, every label value from the start."""
    from prometheus_client import CollectorRegistry, generate_latest

    from agentid_verifier.prometheus import VerifierCollector

    server, proxy = proxied
    _, token = server.register(scopes=["read:orders"])
    _, other = server.register()
    verifier = Verifier(proxy.url, allow_local=True)
    registry = CollectorRegistry()
    registry.register(VerifierCollector(verifier))

    def exposed():
        return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
                for line in generate_latest(registry).decode().splitlines() if not line.startswith("#")}

    assert exposed()['agentid_verifier_verifications_total{outcome="PROOF_REPLAYED"}'] == 0
    verifier.verify(token)
    verifier.verify(token, scopes=["read:orders"])
    for refused in (lambda: verifier.verify(token, scopes=["write:orders"]), lambda: verifier.verify("x")):
        try:
            refused()
            raise AssertionError("accepted")
        except VerificationError:
            pass
    proxy.rewrite = lambda path, status, headers, body: (503, [], b"") if "/v1/status/" in path else (status, headers, body)
    time.sleep(2.2)  # the list (ttl 2 s) is stale: it serves while one refresh fails behind
    verifier.verify(other)
    end = time.monotonic() + 5
    while verifier.counts().fetches.get(("status_list", "failed")) != 1 and time.monotonic() < end:
        time.sleep(0.02)
    counts = verifier.counts()
    assert counts.verifications == {"valid": 3, "INSUFFICIENT_SCOPE": 1, "TOKEN_INVALID": 1}
    assert counts.fetches == {("jwks", "fetched"): 1, ("status_list", "fetched"): 1, ("status_list", "failed"): 1}
    seen = exposed()
    assert seen['agentid_verifier_verifications_total{outcome="valid"}'] == 3
    assert seen['agentid_verifier_verifications_total{outcome="INSUFFICIENT_SCOPE"}'] == 1
    assert seen['agentid_verifier_fetches_total{document="status_list",result="failed"}'] == 1
    assert seen['agentid_verifier_fetches_total{document="jwks",result="not_modified"}'] == 0
