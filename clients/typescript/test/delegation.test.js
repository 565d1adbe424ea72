// Agents acting for people at a receiver: a delegated token's person (`agent.subject`) and
// chain (`agent.actors`), offline and online; a person's revocation pushed as a Shared
// Signals event; the Express middleware's `delegated`; against a real server.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { SignJWT, exportJWK, generateKeyPair } from "jose";
import express from "express";
import { Verifier, VerificationError } from "../index.js";
import { agentIdMiddleware } from "../express.js";
import { startServer } from "./server.js";

const API = "https://api.example/mcp";
const IDP = "https://idp.example";
const ID_TOKEN = "urn:ietf:params:oauth:token-type:id_token";

let s, idpKey;
before(async () => {
  s = await startServer();
  const { publicKey, privateKey } = await generateKeyPair("RS256");
  idpKey = privateKey;
  const jwk = { ...(await exportJWK(publicKey)), kid: "r1", alg: "RS256" };
  await s.call("POST", "/v1/identity-providers", { issuer: IDP, jwks: { keys: [jwk] } });
});
after(() => s.stop());

const code = (p) => p.then(() => "ok", (e) => (e instanceof VerificationError ? e.code : `not a VerificationError: ${e}`));

/** The person's ID token for `aud`. */
function idToken(sub, aud) {
  const now = Math.floor(Date.now() / 1000);
  return new SignJWT({ jti: crypto.randomUUID() })
    .setProtectedHeader({ alg: "RS256", kid: "r1", typ: "JWT" })
    .setIssuer(IDP).setSubject(sub).setAudience(aud).setIssuedAt(now).setExpirationTime(now + 600)
    .sign(idpKey);
}

/** An agent with a client secret: its id and secret. */
async function confidential(scopes = ["tools:call"]) {
  const [id] = await s.register({ scopes });
  const { client_secret: secret } = await s.call("POST", `/v1/agents/${id}/client-secret`);
  return [id, secret];
}

async function exchange([id, secret], subjectToken, resource, kind = ID_TOKEN) {
  const form = new URLSearchParams({
    grant_type: "urn:ietf:params:oauth:grant-type:token-exchange",
    client_id: id, client_secret: secret, subject_token: subjectToken, subject_token_type: kind, resource,
  });
  const res = await fetch(`${s.base}/oauth/token`, { method: "POST", body: form });
  assert.equal(res.status, 200, await res.clone().text());
  return (await res.json()).access_token;
}

test("a delegated token names the person and the chain", async () => {
  const a = await confidential(["tools:call", "read:docs"]);
  const b = await confidential();
  const verifier = new Verifier({ allowLocal: true, baseUrl: s.base, issuers: ["example.com"], audience: API });
  const direct = await verifier.verify(await exchange(a, await idToken("alice", a[0]), API));
  assert.equal(direct.agentId, a[0]);
  assert.deepEqual(direct.subject, { sub: "alice", iss: IDP, subId: { format: "iss_sub", iss: IDP, sub: "alice" } });
  assert.deepEqual(direct.actors, [{ agentId: a[0], issuer: "example.com" }]);

  const forB = await exchange(a, await idToken("alice", a[0]), s.base);
  const handed = await exchange(b, forB, API, "urn:ietf:params:oauth:token-type:access_token");
  const agent = await verifier.verify(handed);
  assert.equal(agent.agentId, b[0]);
  assert.deepEqual(agent.scopes, ["tools:call"]);
  assert.deepEqual(agent.actors.map((x) => x.agentId), [b[0], a[0]]);
  const online = await verifier.verifyOnline(handed);
  assert.equal(online.subject.sub, "alice");
  assert.deepEqual(online.actors.map((x) => x.agentId), [b[0], a[0]]);

  // A token that acts for nobody has no subject.
  const [, plain] = await s.register({ scopes: ["tools:call"] });
  const anyone = new Verifier({ allowLocal: true, baseUrl: s.base, issuers: ["example.com"] });
  const p = await anyone.verify(plain);
  assert.equal(p.subject, null);
  assert.deepEqual(p.actors, []);

  // Online, the inner agent's revocation ends the outer token at once.
  await s.revoke(a[0]);
  assert.equal(await code(verifier.verifyOnline(handed)), "TOKEN_REVOKED");
});

test("the middleware's delegated option lets only an agent acting for a person through", async () => {
  const a = await confidential();
  const verifier = new Verifier({ allowLocal: true, baseUrl: s.base, issuers: ["example.com"] });
  const app = express();
  app.get("/inbox", agentIdMiddleware(verifier, { delegated: true, publicOrigin: "https://api.example" }),
    (req, res) => res.json({ person: req.agent.subject.sub, agent: req.agent.agentId }));
  const server = await new Promise((resolve) => {
    const srv = app.listen(0, "127.0.0.1", () => resolve(srv));
  });
  try {
    const url = `http://127.0.0.1:${server.address().port}/inbox`;
    const token = await exchange(a, await idToken("alice", a[0]), API);
    const ok = await fetch(url, { headers: { authorization: `Bearer ${token}` } });
    assert.equal(ok.status, 200);
    assert.deepEqual(await ok.json(), { person: "alice", agent: a[0] });
    const [, plain] = await s.register({ scopes: ["tools:call"] });
    const refused = await fetch(url, { headers: { authorization: `Bearer ${plain}` } });
    assert.equal(refused.status, 401);
    assert.equal((await refused.json()).error, "TOKEN_INVALID");
  } finally {
    server.close();
  }
});

test("a person revoked by a pushed event is refused offline", async () => {
  const a = await confidential();
  const verifier = new Verifier({ allowLocal: true, baseUrl: s.base, issuers: ["example.com"], audience: API });
  const token = await exchange(a, await idToken("carol", a[0]), API);
  assert.equal((await verifier.verify(token)).subject.sub, "carol");
  const stream = await s.call("POST", "/ssf/streams", {
    delivery: { method: "urn:ietf:rfc:8936" },
    events_requested: ["https://schemas.openid.net/secevent/caep/event-type/session-revoked"],
  });
  await s.call("POST", "/v1/subjects/revoke", { iss: IDP, sub: "carol" });
  const res = await fetch(`${s.base}/ssf/poll/${stream.stream_id}`, {
    method: "POST",
    headers: { authorization: `Bearer ${stream.poll_token}`, "content-type": "application/json" },
    body: JSON.stringify({ returnImmediately: true }),
  });
  const sets = Object.values((await res.json()).sets);
  assert.equal(sets.length, 1);
  await verifier.handleSet(sets[0]);
  assert.equal(await code(verifier.verify(token)), "TOKEN_REVOKED");
  const dave = await exchange(a, await idToken("dave", a[0]), API);
  assert.equal((await verifier.verify(dave)).subject.sub, "dave");
});

test("a flood of person revocations brings no revoked token back", async () => {
  // Attack: an organization whose stream reaches the receiver floods it with revocations of
  // people of its own, to push another's revocation of erin out of memory. Past the bound the
  // earliest goes, but every person's token from before it stays refused; a token from after
  // the flood is taken.
  const a = await confidential();
  const verifier = new Verifier({ allowLocal: true, baseUrl: s.base, issuers: ["example.com"], audience: API });
  const token = await exchange(a, await idToken("erin", a[0]), API);
  const stream = await s.call("POST", "/ssf/streams", {
    delivery: { method: "urn:ietf:rfc:8936" },
    events_requested: ["https://schemas.openid.net/secevent/caep/event-type/session-revoked"],
  });
  await s.call("POST", "/v1/subjects/revoke", { iss: IDP, sub: "erin" });
  const res = await fetch(`${s.base}/ssf/poll/${stream.stream_id}`, {
    method: "POST",
    headers: { authorization: `Bearer ${stream.poll_token}`, "content-type": "application/json" },
    body: JSON.stringify({ returnImmediately: true }),
  });
  const [revoked] = Object.values((await res.json()).sets);
  await verifier.handleSet(revoked);
  assert.equal(await code(verifier.verify(token)), "TOKEN_REVOKED");
  const claims = JSON.parse(Buffer.from(revoked.split(".")[1], "base64url"));
  for (let i = 0; i < 10_000; i++) {
    await verifier.handleSet(await s.sign({ ...claims, jti: `flood-${i}`, sub_id: { ...claims.sub_id, sub: `p${i}` } }, "secevent+jwt"));
  }
  assert.equal(await code(verifier.verify(token)), "TOKEN_REVOKED");
  await new Promise((r) => setTimeout(r, 1100));
  const later = await exchange(a, await idToken("frank", a[0]), API);
  assert.equal((await verifier.verify(later)).subject.sub, "frank");
});
