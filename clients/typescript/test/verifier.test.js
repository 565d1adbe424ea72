import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { SignJWT, generateKeyPair, decodeProtectedHeader } from "jose";
import { Verifier, VerificationError } from "../index.js";
import { agentIdMiddleware } from "../express.js";
import { startServer } from "./server.js";

let s;
before(async () => {
  s = await startServer();
});
after(() => s.stop());

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const code = (p) => p.then(() => "ok", (e) => (e instanceof VerificationError ? e.code : `not a VerificationError: ${e}`));

test("a valid token gives its agent", async () => {
  const [id, token] = await s.register();
  const agent = await new Verifier({ baseUrl: s.base, issuers: ["example.com"] }).verify(token, { scopes: ["read:orders"] });
  assert.equal(agent.agentId, id);
  assert.equal(agent.issuer, "example.com");
  assert.deepEqual(agent.scopes, ["read:orders"]);
  assert.ok(agent.expiresAt > agent.issuedAt);
});

test("tampered tokens and alg or kid tricks are invalid", async () => {
  const [, token] = await s.register();
  const v = new Verifier({ baseUrl: s.base });
  const [h, p, sig] = token.split(".");
  const claims = JSON.parse(Buffer.from(p, "base64url"));
  const forged = Buffer.from(JSON.stringify({ ...claims, scopes: ["admin:x"] })).toString("base64url");
  const { privateKey } = await generateKeyPair("EdDSA", { crv: "Ed25519" });
  const kid = decodeProtectedHeader(token).kid;
  const sign = (header) => new SignJWT(claims).setProtectedHeader(header).sign(privateKey);
  for (const bad of [
    `${h}.${forged}.${sig}`,
    await sign({ alg: "EdDSA", kid }),
    await sign({ alg: "EdDSA", kid: "unknown" }),
    await sign({ alg: "EdDSA" }),
    `${Buffer.from(JSON.stringify({ alg: "none", kid })).toString("base64url")}.${p}.`,
    "not a token",
  ]) {
    assert.equal(await code(v.verify(bad)), "TOKEN_INVALID", bad);
  }
});

test("issuer, scope and expiry", async () => {
  const [, token] = await s.register();
  assert.equal(await code(new Verifier({ baseUrl: s.base, issuers: ["other.example"] }).verify(token)), "TOKEN_INVALID");
  assert.equal(await code(new Verifier({ baseUrl: s.base }).verify(token, { scopes: ["write:x"] })), "INSUFFICIENT_SCOPE");
  const [, short] = await s.register({ expiry_seconds: 1 });
  await sleep(2100);
  assert.equal(await code(new Verifier({ baseUrl: s.base, leeway: 0 }).verify(short)), "TOKEN_EXPIRED");
  assert.equal(await code(new Verifier({ baseUrl: s.base }).verify(short)), "ok");
});

test("a revocation is seen through the status list within its ttl, and at once through a SET", async () => {
  const [id, token] = await s.register();
  const v = new Verifier({ baseUrl: s.base });
  await v.verify(token);
  await s.revoke(id);
  const started = Date.now();
  while ((await code(v.verify(token))) !== "TOKEN_REVOKED") {
    assert.ok(Date.now() - started < 5000, "not seen within ttl + 2 s");
    await sleep(100);
  }

  const stream = await s.call("POST", "/ssf/streams", {
    delivery: { method: "urn:ietf:rfc:8936" },
    events_requested: ["https://schemas.openid.net/secevent/caep/event-type/session-revoked"],
  });
  const [id2, token2] = await s.register();
  const w = new Verifier({ baseUrl: s.base });
  await w.verify(token2);
  await s.revoke(id2);
  const polled = await s.call("POST", `/ssf/poll/${stream.stream_id}`, { returnImmediately: true }, stream.poll_token);
  const [set] = Object.values(polled.sets);
  await w.handleSet(set);
  assert.equal(await code(w.verify(token2)), "TOKEN_REVOKED");
  assert.equal(await code(w.handleSet(token2)), "TOKEN_INVALID");
});

test("online verify", async () => {
  const [id, token] = await s.register();
  const v = new Verifier({ baseUrl: s.base });
  assert.equal((await v.verifyOnline(token, { key: s.org.keys.publishable_live })).agentId, id);
  await s.revoke(id);
  assert.equal(await code(v.verifyOnline(token)), "TOKEN_REVOKED");
});

test("rotated and retired keys", async () => {
  const [, old] = await s.register();
  const v = new Verifier({ baseUrl: s.base, kidRefetchInterval: 0 });
  await v.verify(old);
  const rotated = JSON.parse(s.cli("signing-key", "rotate", "--publish-for", "0s"));
  await sleep(6000);
  const [, fresh] = await s.register();
  assert.equal(decodeProtectedHeader(fresh).kid, rotated.kid);
  assert.equal(await code(v.verify(fresh)), "ok");
  s.cli("signing-key", "retire", decodeProtectedHeader(old).kid);
  await sleep(6000);
  assert.equal(await code(new Verifier({ baseUrl: s.base }).verify(old)), "TOKEN_INVALID");
});

test("the express middleware answers 401, 403 and 200", async () => {
  const [, token] = await s.register();
  const v = new Verifier({ baseUrl: s.base });
  const run = async (mw, authorization) => {
    const res = { statusCode: 200, headers: {}, body: "", setHeader(k, val) { this.headers[k.toLowerCase()] = val; }, end(b) { this.body = b; } };
    const req = { headers: authorization ? { authorization } : {} };
    let passed = false;
    await mw(req, res, () => { passed = true; });
    return { passed, res, req };
  };
  let r = await run(agentIdMiddleware(v));
  assert.equal(r.res.statusCode, 401);
  assert.deepEqual(JSON.parse(r.res.body), { error: "TOKEN_INVALID" });
  assert.equal(r.res.headers["www-authenticate"], 'Bearer error="invalid_token"');
  r = await run(agentIdMiddleware(v, { scopes: ["admin:x"] }), `Bearer ${token}`);
  assert.equal(r.res.statusCode, 403);
  r = await run(agentIdMiddleware(v), `Bearer ${token}`);
  assert.ok(r.passed && r.req.agent.agentId.startsWith("agt_"));
});

test("an unreachable list fails closed, or open when asked", async () => {
  const t = await startServer();
  const [id, token] = await t.register();
  const closed = new Verifier({ baseUrl: t.base, listGrace: 0 });
  const opened = new Verifier({ baseUrl: t.base, listGrace: 0, failOpen: true });
  await closed.verify(token);
  await opened.verify(token);
  t.stop();
  await sleep(2500);
  assert.equal(await code(closed.verify(token)), "UNAVAILABLE");
  assert.equal((await opened.verify(token)).agentId, id);
});

test("a test-mode token is refused unless allowTest", async () => {
  const [, token] = await s.register({}, s.org.keys.secret_test);
  assert.equal(JSON.parse(Buffer.from(token.split(".")[1], "base64url")).livemode, false);
  const strict = new Verifier({ baseUrl: s.base });
  assert.equal(await code(strict.verify(token)), "TOKEN_INVALID");
  assert.equal(await code(strict.verifyOnline(token)), "TOKEN_INVALID");
  const allowed = new Verifier({ baseUrl: s.base, allowTest: true });
  assert.equal((await allowed.verify(token)).livemode, false);
  assert.equal((await allowed.verifyOnline(token)).livemode, false);
  const [, live] = await s.register();
  assert.equal((await strict.verify(live)).livemode, true);
  assert.equal((await strict.verifyOnline(live)).livemode, true);
});
