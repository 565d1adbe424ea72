import { test, before, after } from "node:test";
import { spawnSync } from "node:child_process";
import { deflateSync } from "node:zlib";
import assert from "node:assert/strict";
import { SignJWT, generateKeyPair, decodeProtectedHeader } from "jose";
import { Verifier, VerificationError } from "../index.js";
import { agentIdMiddleware } from "../express.js";
import { startServer, startProxy } from "./server.js";

const SESSION_REVOKED = "https://schemas.openid.net/secevent/caep/event-type/session-revoked";

let s;
// A server whose public URL (the base of its status lists, the `iss` of its SETs) is a proxy
// in front of it; its signing key is never rotated. Each test leaves the proxy passing all.
let ps, proxy;
before(async () => {
  s = await startServer();
  proxy = await startProxy();
  ps = await startServer({ AGENTID_PUBLIC_URL: proxy.url });
  proxy.upstream = ps.base;
});
after(() => {
  s.stop();
  ps.stop();
  proxy.stop();
});

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const code = (p) => p.then(() => "ok", (e) => (e instanceof VerificationError ? e.code : `not a VerificationError: ${e}`));

test("a valid token gives its agent", async () => {
  const [id, token] = await s.register();
  const agent = await new Verifier({ allowLocal: true, baseUrl: s.base, issuers: ["example.com"] }).verify(token, { scopes: ["read:orders"] });
  assert.equal(agent.agentId, id);
  assert.equal(agent.issuer, "example.com");
  assert.deepEqual(agent.scopes, ["read:orders"]);
  assert.ok(agent.expiresAt > agent.issuedAt);
});

const ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

test("tampered tokens and alg or kid tricks are invalid", async () => {
  const [, token] = await s.register();
  const v = new Verifier({ allowLocal: true, baseUrl: s.base });
  const [h, p, sig] = token.split(".");
  const claims = JSON.parse(Buffer.from(p, "base64url"));
  const forged = Buffer.from(JSON.stringify({ ...claims, scopes: ["admin:x"] })).toString("base64url");
  const { privateKey } = await generateKeyPair("EdDSA", { crv: "Ed25519" });
  const kid = decodeProtectedHeader(token).kid;
  const sign = (header) => new SignJWT(claims).setProtectedHeader(header).sign(privateKey);
  // What jose will not sign (a critical extension it does not know), signed by hand.
  const signRaw = async (header) => {
    const input = `${Buffer.from(JSON.stringify(header)).toString("base64url")}.${p}`;
    const signature = await crypto.subtle.sign("Ed25519", privateKey, Buffer.from(input));
    return `${input}.${Buffer.from(signature).toString("base64url")}`;
  };
  for (const bad of [
    `${h}.${forged}.${sig}`,
    await sign({ alg: "EdDSA", kid }),
    await sign({ alg: "EdDSA", kid: "unknown" }),
    await sign({ alg: "EdDSA" }),
    `${Buffer.from(JSON.stringify({ alg: "none", kid })).toString("base64url")}.${p}.`,
    "not a token",
    `${token}.x`,
    // The same bytes written another way: padded, standard base64, spaced, with final bits
    // that are not zero (the service refuses each, so the library does too), or a header
    // that names a critical extension.
    `${h}.${p}.${sig}==`,
    // (A signature with neither "-" nor "_", one in fifteen, is spelled alike in both
    // alphabets: then that form is the token itself, and is left out.)
    ...[`${h}.${p}.${Buffer.from(sig, "base64url").toString("base64").replace(/=+$/, "")}`].filter((t) => t !== token),
    `${h}.${p.slice(0, 8)} ${p.slice(8)}.${sig}`,
    `${h}.${p}.${sig.slice(0, -1)}${ALPHABET[ALPHABET.indexOf(sig.at(-1)) | 1]}`,
    `${Buffer.from("[1]").toString("base64url")}.${p}.${sig}`,
    await signRaw({ alg: "EdDSA", kid, crit: ["exp"] }),
  ]) {
    assert.equal(await code(v.verify(bad)), "TOKEN_INVALID", bad);
  }
});

test("a token whose header typ is null is TOKEN_INVALID", async () => {
  // A header `typ` of null was read as absent (the first typ accepted): the service always
  // writes typ, and the Python and Rust libraries refuse null.
  const [, token] = await s.register();
  const v = new Verifier({ allowLocal: true, baseUrl: s.base });
  assert.equal(await code(v.verify(await s.sign(claimsOf(token), "JWT"))), "ok");
  assert.equal(await code(v.verify(await s.sign(claimsOf(token), null))), "TOKEN_INVALID");
});

test("issuer, scope and expiry", async () => {
  const [, token] = await s.register();
  assert.equal(await code(new Verifier({ allowLocal: true, baseUrl: s.base, issuers: ["other.example"] }).verify(token)), "TOKEN_INVALID");
  assert.equal(await code(new Verifier({ allowLocal: true, baseUrl: s.base }).verify(token, { scopes: ["write:x"] })), "INSUFFICIENT_SCOPE");
  const [, short] = await s.register({ expiry_seconds: 1 });
  await sleep(2100);
  assert.equal(await code(new Verifier({ allowLocal: true, baseUrl: s.base, leeway: 0 }).verify(short)), "TOKEN_EXPIRED");
  assert.equal(await code(new Verifier({ allowLocal: true, baseUrl: s.base }).verify(short)), "ok");
});

test("a revocation is seen through the status list within its ttl, and at once through a SET", async () => {
  const [id, token] = await s.register();
  const v = new Verifier({ allowLocal: true, baseUrl: s.base });
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
  const w = new Verifier({ allowLocal: true, baseUrl: s.base });
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
  const v = new Verifier({ allowLocal: true, baseUrl: s.base });
  assert.equal((await v.verifyOnline(token, { key: s.org.keys.publishable_live })).agentId, id);
  await s.revoke(id);
  assert.equal(await code(v.verifyOnline(token)), "TOKEN_REVOKED");
});

test("rotated and retired keys", async () => {
  const [, old] = await s.register();
  const v = new Verifier({ allowLocal: true, baseUrl: s.base, kidRefetchInterval: 0 });
  await v.verify(old);
  const rotated = JSON.parse(s.cli("signing-key", "rotate", "--publish-for", "0s"));
  await sleep(6000);
  const [, fresh] = await s.register();
  assert.equal(decodeProtectedHeader(fresh).kid, rotated.kid);
  assert.equal(await code(v.verify(fresh)), "ok");
  s.cli("signing-key", "retire", decodeProtectedHeader(old).kid);
  await sleep(6000);
  assert.equal(await code(new Verifier({ allowLocal: true, baseUrl: s.base }).verify(old)), "TOKEN_INVALID");
});

test("the express middleware answers 401, 403 and 200", async () => {
  const [, token] = await s.register();
  const v = new Verifier({ allowLocal: true, baseUrl: s.base });
  const run = async (mw, authorization) => {
    const res = { statusCode: 200, headers: {}, body: "", setHeader(k, val) { this.headers[k.toLowerCase()] = val; }, end(b) { this.body = b; } };
    const req = { headers: authorization ? { authorization } : {} };
    let passed = false;
    await mw(req, res, () => { passed = true; });
    return { passed, res, req };
  };
  let r = await run(agentIdMiddleware(v));
  assert.equal(r.res.statusCode, 401);
  assert.deepEqual(JSON.parse(r.res.body), { error: "TOKEN_INVALID", message: "no Authorization header" });
  // No credentials: no error code, and both schemes (RFC 6750 §3.1, RFC 9449 §7.1).
  assert.equal(r.res.headers["www-authenticate"], 'Bearer, DPoP algs="EdDSA Ed25519 ES256"');
  // An excluded path, or one below it, passes unchecked; a path that only starts alike does not.
  for (const [url, passes] of [["/health", true], ["/health/live?x=1", true], ["/healthz", false]]) {
    const res = { statusCode: 200, headers: {}, setHeader(k, val) { this.headers[k] = val; }, end() {} };
    let passed = false;
    await agentIdMiddleware(v, { exclude: ["/health"] })({ headers: {}, url }, res, () => { passed = true; });
    assert.equal(passed, passes, url);
  }
  r = await run(agentIdMiddleware(v), "Bearer nope");
  assert.equal(r.res.headers["www-authenticate"], 'Bearer error="invalid_token"');
  r = await run(agentIdMiddleware(v, { scopes: ["admin:x"] }), `Bearer ${token}`);
  assert.equal(r.res.statusCode, 403);
  assert.equal(r.res.headers["www-authenticate"], 'Bearer error="insufficient_scope", scope="admin:x"');
  // The service unreachable: 503 with Retry-After, and no challenge (not the token's fault).
  const t = await startServer();
  const [, other] = await t.register();
  t.stop();
  r = await run(agentIdMiddleware(new Verifier({ allowLocal: true, baseUrl: t.base })), `Bearer ${other}`);
  assert.equal(r.res.statusCode, 503);
  assert.equal(r.res.headers["retry-after"], "5");
  assert.equal(r.res.headers["www-authenticate"], undefined);
  r = await run(agentIdMiddleware(v), `Bearer ${token}`);
  assert.ok(r.passed && r.req.agent.agentId.startsWith("agt_"));
});

test("an exclusion that names no path is refused when the middleware is made", async () => {
  // Attack: a plain string is one exclusion a character ("/" among them), and an empty one
  // (`(process.env.EXCLUDE ?? "").split(",")`) became the prefix "/": either left every path
  // open, with no token.
  const v = new Verifier({ allowLocal: true, baseUrl: s.base, issuers: ["example.com"] });
  for (const exclude of ["/health", [""], ["health"], ["/health", ""], [42]]) {
    assert.throws(() => agentIdMiddleware(v, { exclude }), TypeError, JSON.stringify(exclude));
  }
  // "/" is the root alone, not every path below it.
  for (const exclude of [["/"], ["//"]]) {
    for (const [url, passes] of [[exclude[0], true], ["/orders", false], ["/orders/1?x=1", false]]) {
      const res = { statusCode: 200, headers: {}, setHeader(k, val) { this.headers[k] = val; }, end() {} };
      let passed = false;
      await agentIdMiddleware(v, { exclude })({ headers: {}, url }, res, () => { passed = true; });
      assert.equal(passed, passes, `${exclude} ${url}`);
      assert.equal(res.statusCode, passes ? 200 : 401, `${exclude} ${url}`);
    }
  }
});

test("an unreachable list fails closed, or open when asked", async () => {
  const t = await startServer();
  const [id, token] = await t.register();
  const closed = new Verifier({ allowLocal: true, baseUrl: t.base, listGrace: 0 });
  const opened = new Verifier({ allowLocal: true, baseUrl: t.base, listGrace: 0, failOpen: true });
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
  const strict = new Verifier({ allowLocal: true, baseUrl: s.base });
  assert.equal(await code(strict.verify(token)), "TOKEN_INVALID");
  assert.equal(await code(strict.verifyOnline(token)), "TOKEN_INVALID");
  const allowed = new Verifier({ allowLocal: true, baseUrl: s.base, allowTest: true });
  assert.equal((await allowed.verify(token)).livemode, false);
  assert.equal((await allowed.verifyOnline(token)).livemode, false);
  const [, live] = await s.register();
  assert.equal((await strict.verify(live)).livemode, true);
  assert.equal((await strict.verifyOnline(live)).livemode, true);
});

// -- keys and fetches ------------------------------------------------------------------------

const kidOf = (token) => decodeProtectedHeader(token).kid;
const claimsOf = (token) => JSON.parse(Buffer.from(token.split(".")[1], "base64url"));
/** A proxy rewrite answering `answer(path, status, headers, body)` for paths under `prefix`. */
const under = (prefix, answer) => (path, ...rest) => (path.startsWith(prefix) ? answer(path, ...rest) : rest);

test("made-up kids fetch the key set no more while the service is down", async () => {
  // Attack: tokens naming kids nobody has, while the key set is stale and the service
  // answers 503: the key set is asked for once per kidRefetchInterval, not once a token.
  let down = false;
  let asked = 0;
  proxy.rewrite = (path, status, headers, body) => {
    if (!path.endsWith("jwks.json")) return [status, headers, body];
    if (down) {
      asked += 1;
      return [503, {}, Buffer.alloc(0)];
    }
    return [status, { ...headers, "cache-control": "max-age=1" }, body];
  };
  try {
    const [, token] = await ps.register();
    const v = new Verifier({ allowLocal: true, baseUrl: proxy.url });
    assert.equal(await code(v.verify(token)), "ok");
    down = true;
    await sleep(1200);
    for (let i = 0; i < 20; i++) {
      const header = Buffer.from(JSON.stringify({ alg: "EdDSA", kid: `k${i}`, typ: "JWT" })).toString("base64url");
      const forged = `${header}.e30.${Buffer.alloc(64).toString("base64url")}`;
      assert.equal(await code(v.verify(forged)), "TOKEN_INVALID");
    }
    assert.ok(asked <= 3, `${asked} fetches of the key set`);
  } finally {
    proxy.rewrite = null;
  }
});

test("a key set served without an ETag still refreshes", async () => {
  const p = await startProxy();
  const t = await startServer({ AGENTID_PUBLIC_URL: p.url });
  p.upstream = t.base;
  // No ETag, and nothing kept past 1 s.
  p.rewrite = (path, status, headers, body) => {
    delete headers.etag;
    return [status, { ...headers, "cache-control": "max-age=1" }, body];
  };
  try {
    const [id, old] = await t.register();
    const v = new Verifier({ allowLocal: true, baseUrl: p.url, kidRefetchInterval: 0 });
    await v.verify(old);
    const rotated = JSON.parse(t.cli("signing-key", "rotate", "--publish-for", "0s"));
    await sleep(6000); // every instance reads the keys every 5 s
    const [, fresh] = await t.register();
    assert.equal(kidOf(fresh), rotated.kid);
    assert.equal(await code(v.verify(fresh)), "ok");
    // The status list, served without an ETag too, still shows a revocation.
    await t.revoke(id);
    const started = Date.now();
    while ((await code(v.verify(old))) !== "TOKEN_REVOKED") {
      assert.ok(Date.now() - started < 5000, "not seen within ttl + 2 s");
      await sleep(100);
    }
    t.cli("signing-key", "retire", kidOf(old));
    await sleep(6000);
    // The stale keys answer while one refresh runs behind; then the retired key is gone.
    const retired = Date.now();
    while ((await code(v.verify(old))) !== "TOKEN_INVALID") {
      assert.ok(Date.now() - retired < 2000, "the retired key is still trusted");
      await sleep(50);
    }
  } finally {
    t.stop();
    p.stop();
  }
});

test("a key set refresh that fails backs off, doubling, though keys are held", async () => {
  // The key set is stale and the service fails fast: the refresh behind the checks is tried
  // again after 1 s, then 2 s, not once a check.
  let down = false;
  let asked = 0;
  proxy.rewrite = (path, status, headers, body) => {
    if (!path.endsWith("jwks.json")) return [status, headers, body];
    if (down) {
      asked += 1;
      return [503, {}, Buffer.alloc(0)];
    }
    return [status, { ...headers, "cache-control": "max-age=1" }, body];
  };
  try {
    const [, token] = await ps.register();
    const v = new Verifier({ allowLocal: true, baseUrl: proxy.url });
    assert.equal(await code(v.verify(token)), "ok");
    down = true;
    await sleep(1200); // the key set (max-age 1) is stale
    for (let i = 0; i < 20; i++) {
      assert.equal(await code(v.verify(token)), "ok"); // the keys held serve
      await sleep(50);
    }
    assert.ok(asked >= 1 && asked <= 3, `${asked} fetches of the key set`);
  } finally {
    proxy.rewrite = null;
  }
});

test("a status list that is not one is a failed fetch, not held for its max-age", async () => {
  // Attack: a 200 that is not a status list, served with a max-age of an hour, was held fresh
  // for the hour: every check of a token with a status was UNAVAILABLE until it passed, though
  // the service answered again. It is a failed fetch, and the next check fetches.
  proxy.rewrite = under("/v1/status/", (path, status, headers) => {
    const { etag, ...kept } = headers;
    return [200, { ...kept, "cache-control": "max-age=3600" }, Buffer.from("not a list")];
  });
  try {
    const [, token] = await ps.register();
    const v = new Verifier({ allowLocal: true, baseUrl: proxy.url });
    assert.equal(await code(v.verify(token)), "UNAVAILABLE");
    proxy.rewrite = null; // the service is fixed
    assert.equal(await code(v.verify(token)), "ok");
  } finally {
    proxy.rewrite = null;
  }
});

test("a status list answered 304 serves no longer than its exp", async () => {
  // A cache (or a service) answering every revalidation 304 would keep the bits held before
  // a revocation for ever: past the list's exp they serve no more.
  const [id, token] = await ps.register();
  let exp = 0;
  let mode = "pass"; // "always": 304 for every list request; "revalidation": 304 when asked so
  proxy.rewrite = under("/v1/status/", (path, status, headers, body) => {
    if (status === 200) exp = claimsOf(body.toString()).exp;
    return [status, headers, body];
  });
  proxy.handle = async (req, res) => {
    if (req.url.startsWith("/v1/status/") && (mode === "always" || (mode === "revalidation" && req.headers["if-none-match"]))) {
      res.writeHead(304, { "cache-control": "max-age=1" });
      res.end();
      return;
    }
    await proxy.pass(req, res);
  };
  try {
    const v = new Verifier({ allowLocal: true, baseUrl: proxy.url, leeway: 0 });
    assert.equal(await code(v.verify(token)), "ok");
    assert.ok(exp > 0, "no list was fetched");
    mode = "always";
    await ps.revoke(id);
    // Until its exp the list held may serve (a 304 says nothing changed); past it, never.
    while (Date.now() / 1000 < exp - 0.3) {
      assert.equal(await code(v.verify(token)), "ok");
      await sleep(200);
    }
    await sleep(Math.max(0, exp * 1000 - Date.now()) + 100);
    assert.equal(await code(v.verify(token)), "UNAVAILABLE");
    assert.equal(await code(v.verify(token)), "UNAVAILABLE");
    // A 304 only to a revalidation: the list asked for once more, without If-None-Match,
    // shows the revocation.
    mode = "revalidation";
    assert.equal(await code(v.verify(token)), "TOKEN_REVOKED");
  } finally {
    proxy.handle = null;
    proxy.rewrite = null;
  }
});

test("a wall clock stepped back keeps no status list fresh past its ttl", async () => {
  const [id, token] = await ps.register();
  // A leeway of two hours: the token stays valid on a clock an hour behind.
  const v = new Verifier({ allowLocal: true, baseUrl: proxy.url, leeway: 7200 });
  assert.equal(await code(v.verify(token)), "ok");
  const wall = Date.now;
  Date.now = () => wall() - 3_600_000;
  try {
    await ps.revoke(id);
    const started = performance.now();
    while ((await code(v.verify(token))) !== "TOKEN_REVOKED") {
      assert.ok(performance.now() - started < 5000, "not seen within ttl + 2 s");
      await sleep(100);
    }
  } finally {
    Date.now = wall;
  }
});

test("no redirect is followed: keys, status lists and online verify", async () => {
  const [, token] = await ps.register();
  for (const [prefix, method] of [["/.well-known/jwks.json", "verify"], ["/v1/status/", "verify"], ["/v1/verify/", "verifyOnline"]]) {
    proxy.rewrite = under(prefix, (path) => [302, { location: ps.base + path }, Buffer.alloc(0)]);
    assert.equal(await code(new Verifier({ allowLocal: true, baseUrl: proxy.url })[method](token)), "UNAVAILABLE", prefix);
  }
  proxy.rewrite = null;
  assert.equal(await code(new Verifier({ allowLocal: true, baseUrl: proxy.url }).verifyOnline(token)), "ok");
});

test("a broken or oversized answer is UNAVAILABLE, never another error", async () => {
  const [, token] = await ps.register();
  const jwks = await (await fetch(`${ps.base}/.well-known/jwks.json`)).text();
  const { status } = claimsOf(token);
  const listClaims = { sub: status.status_list.uri, iat: Math.floor(Date.now() / 1000), ttl: 60 };
  const zeros = deflateSync(Buffer.alloc(1 << 17)).toString("base64url");
  const cases = [
    ["/.well-known/jwks.json", "<html>gateway</html>"],
    ["/.well-known/jwks.json", "[]"],
    ["/.well-known/jwks.json", '{"keys": "none"}'],
    ["/.well-known/jwks.json", JSON.stringify({ keys: [{ kty: "OKP", crv: "Ed25519", kid: kidOf(token), x: "!!" }] })],
    ["/.well-known/jwks.json", jwks + " ".repeat(1 << 20)], // valid JSON, over 1 MiB
    ["/v1/status/", "not a list"],
    ["/v1/status/", await ps.sign({ ...listClaims, status_list: { bits: 1, lst: "bm90IHpsaWI" } }, "statuslist+jwt")],
    ["/v1/status/", await ps.sign({ ...listClaims, status_list: { bits: 1, lst: "%%%" } }, "statuslist+jwt")],
    ["/v1/status/", await ps.sign({ ...listClaims, status_list: { bits: 2, lst: "eJwDAAAAAAE" } }, "statuslist+jwt")],
    // A ttl of 0 (or less) would have the list fetched again at every check.
    ...(await Promise.all([0, -1, "60", null].map(async (ttl) => ["/v1/status/", await ps.sign({ ...listClaims, ttl, status_list: { bits: 1, lst: zeros } }, "statuslist+jwt")]))),
    ["/v1/verify/", "<html>gateway</html>"],
    ["/v1/verify/", '{"valid": true}'],
  ];
  try {
    for (const [prefix, body] of cases) {
      proxy.rewrite = under(prefix, () => [200, { "content-type": "application/json" }, Buffer.from(body)]);
      const v = new Verifier({ allowLocal: true, baseUrl: proxy.url });
      const method = prefix === "/v1/verify/" ? "verifyOnline" : "verify";
      for (const attempt of [1, 2]) {
        assert.equal(await code(v[method](token)), "UNAVAILABLE", `${prefix} (${attempt}): ${body.slice(0, 80)}`);
      }
    }
    // A ttl of a year is held a day at most.
    const year = await ps.sign({ ...listClaims, ttl: 31_536_000, status_list: { bits: 1, lst: zeros } }, "statuslist+jwt");
    proxy.rewrite = under("/v1/status/", () => [200, { "content-type": "application/statuslist+jwt" }, Buffer.from(year)]);
    const held = new Verifier({ allowLocal: true, baseUrl: proxy.url });
    assert.equal(await code(held.verify(token)), "ok");
    assert.equal(held.lists.get(status.status_list.uri).ttl, 86_400);
    // One of a millisecond is held a second.
    const ms = await ps.sign({ ...listClaims, ttl: 0.001, status_list: { bits: 1, lst: zeros } }, "statuslist+jwt");
    proxy.rewrite = under("/v1/status/", () => [200, { "content-type": "application/statuslist+jwt" }, Buffer.from(ms)]);
    const brief = new Verifier({ allowLocal: true, baseUrl: proxy.url });
    assert.equal(await code(brief.verify(token)), "ok");
    assert.equal(brief.lists.get(status.status_list.uri).ttl, 1);
    // Through the Express middleware: 503, not a 500.
    proxy.rewrite = under("/.well-known/jwks.json", () => [200, {}, Buffer.from("<html>gateway</html>")]);
    const r = await runMiddleware(agentIdMiddleware(new Verifier({ allowLocal: true, baseUrl: proxy.url })), `Bearer ${token}`);
    assert.equal(r.res.statusCode, 503);
    assert.deepEqual(JSON.parse(r.res.body), { error: "UNAVAILABLE", message: "the agent cannot be verified now: try again shortly" });
  } finally {
    proxy.rewrite = null;
  }
});

test("a request that does not answer in time is UNAVAILABLE", async () => {
  const [, token] = await ps.register();
  proxy.handle = async () => {}; // never answers
  try {
    const started = Date.now();
    assert.equal(await code(new Verifier({ allowLocal: true, baseUrl: proxy.url, timeout: 0.5 }).verify(token)), "UNAVAILABLE");
    assert.equal(await code(new Verifier({ allowLocal: true, baseUrl: proxy.url, timeout: 0.5 }).verifyOnline(token)), "UNAVAILABLE");
    assert.ok(Date.now() - started < 3000);
  } finally {
    proxy.handle = null;
  }
});

test("a negative or malformed status index is invalid", async () => {
  const [, token] = await ps.register();
  const claims = claimsOf(token);
  const v = new Verifier({ allowLocal: true, baseUrl: proxy.url });
  assert.equal(await code(v.verify(await ps.sign(claims))), "ok"); // the signer is the service's
  for (const idx of [-1, -8, "3", 1.5, true]) {
    claims.status.status_list.idx = idx;
    assert.equal(await code(v.verify(await ps.sign(claims))), "TOKEN_INVALID", `idx ${idx}`);
  }
});

test("a token over 4096 bytes is refused unparsed", async () => {
  const [, token] = await ps.register();
  const claims = claimsOf(token);
  const v = new Verifier({ allowLocal: true, baseUrl: proxy.url });
  await v.verify(token);
  const big = await ps.sign({ ...claims, pad: "x".repeat(4096) }); // signed by the service, and too long
  assert.equal(await code(v.verify(big)), "TOKEN_INVALID");
  assert.equal(await code(v.verify(token + "x".repeat(4096 - token.length + 1))), "TOKEN_INVALID");
  // No request is made: the service is not even reachable.
  assert.equal(await code(new Verifier({ allowLocal: true, baseUrl: "http://127.0.0.1:9" }).verifyOnline(big)), "TOKEN_INVALID");
  const [header, payload, signature] = token.split(".");
  const longSet = `${header}.${payload}${"x".repeat(16384)}.${signature}`; // parsed, it would need keys
  assert.equal(await code(new Verifier({ allowLocal: true, baseUrl: "http://127.0.0.1:9" }).handleSet(longSet)), "TOKEN_INVALID");
});

// -- online verification ---------------------------------------------------------------------

test("online verify checks issuers, scopes and mode as offline verify does", async () => {
  const [id, token] = await s.register();
  assert.equal(await code(new Verifier({ allowLocal: true, baseUrl: s.base, issuers: ["other.example"] }).verifyOnline(token)), "TOKEN_INVALID");
  assert.equal((await new Verifier({ allowLocal: true, baseUrl: s.base, issuers: ["example.com"] }).verifyOnline(token)).agentId, id);
  assert.equal(await code(new Verifier({ allowLocal: true, baseUrl: s.base }).verifyOnline(token, { scopes: ["write:orders"] })), "INSUFFICIENT_SCOPE");
  assert.deepEqual((await new Verifier({ allowLocal: true, baseUrl: s.base }).verifyOnline(token, { scopes: ["read:orders"] })).scopes, ["read:orders"]);
  const [, testMode] = await s.register({}, s.org.keys.secret_test);
  assert.equal(await code(new Verifier({ allowLocal: true, baseUrl: s.base }).verifyOnline(testMode)), "TOKEN_INVALID");
});

test("a refused API key is MISCONFIGURED, and the middleware answers 500 for it", async () => {
  const [, token] = await s.register();
  const v = new Verifier({ allowLocal: true, baseUrl: s.base });
  assert.equal(await code(v.verifyOnline(token, { key: "pk_live_not_a_key" })), "MISCONFIGURED");
  assert.equal((await v.verifyOnline(token, { key: s.org.keys.publishable_live })).issuer, "example.com");
  const online = { verify: (t) => v.verifyOnline(t, { key: "pk_live_not_a_key" }) };
  const r = await runMiddleware(agentIdMiddleware(online), `Bearer ${token}`);
  assert.equal(r.res.statusCode, 500);
  assert.deepEqual(JSON.parse(r.res.body), { error: "MISCONFIGURED", message: "this receiver cannot verify agents: its configuration is wrong" });
});

// -- Shared Signals --------------------------------------------------------------------------

/** The SET of a revocation, polled from a new stream: [the SET, the stream]. */
async function polledSet(server, stream = {}) {
  const created = await server.call("POST", "/ssf/streams", {
    delivery: { method: "urn:ietf:rfc:8936" },
    events_requested: [SESSION_REVOKED],
    ...stream,
  });
  const [id] = await server.register();
  await server.revoke(id);
  const polled = await server.call("POST", `/ssf/poll/${created.stream_id}`, { returnImmediately: true }, created.poll_token);
  const sets = Object.values(polled.sets);
  assert.equal(sets.length, 1);
  return [sets[0], created];
}

test("a SET for another audience is refused", async () => {
  let [set] = await polledSet(ps, { aud: "https://receiver.example" });
  assert.equal(await code(new Verifier({ allowLocal: true, baseUrl: proxy.url, setAudience: "https://other.example" }).handleSet(set)), "TOKEN_INVALID");
  assert.equal(await code(new Verifier({ allowLocal: true, baseUrl: proxy.url, setAudience: "https://receiver.example" }).handleSet(set)), "ok");
  let stream;
  [set, stream] = await polledSet(ps); // a poll stream's aud is by default its id
  assert.equal(claimsOf(set).aud, stream.stream_id);
  assert.equal(await code(new Verifier({ allowLocal: true, baseUrl: proxy.url, setAudience: stream.stream_id }).handleSet(set)), "ok");
});

test("a replayed SET is refused", async () => {
  const [set] = await polledSet(ps);
  const v = new Verifier({ allowLocal: true, baseUrl: proxy.url });
  assert.equal(await code(v.handleSet(set)), "ok");
  assert.equal(await code(v.handleSet(set)), "TOKEN_INVALID");
});

test("a SET of another service, or of an agent of another issuer, is refused", async () => {
  const [set] = await polledSet(ps);
  // The same keys, but not the base URL the SET names.
  assert.equal(await code(new Verifier({ allowLocal: true, baseUrl: ps.base }).handleSet(set)), "TOKEN_INVALID");
  const forged = await ps.sign({ ...claimsOf(set), iss: "https://evil.example" }, "secevent+jwt");
  assert.equal(await code(new Verifier({ allowLocal: true, baseUrl: proxy.url }).handleSet(forged)), "TOKEN_INVALID");
  // Its agent is of example.com.
  assert.equal(await code(new Verifier({ allowLocal: true, baseUrl: proxy.url, issuers: ["other.example"] }).handleSet(set)), "TOKEN_INVALID");
  assert.equal(await code(new Verifier({ allowLocal: true, baseUrl: proxy.url, issuers: ["example.com"] }).handleSet(set)), "ok");
});

test("a JOSE header nested thousands deep is TOKEN_INVALID, never a RangeError", async () => {
  // Attack: a SET (up to 16 KiB) whose typ is an array 6,000 deep, which no message can print.
  const deep = (n) => `${"[".repeat(n)}"secevent+jwt"${"]".repeat(n)}`;
  const forged = (typ) => {
    const header = Buffer.from(`{"alg":"EdDSA","kid":"k","typ":${typ}}`).toString("base64url");
    return `${header}.e30.${Buffer.alloc(64).toString("base64url")}`;
  };
  assert.equal(await code(new Verifier({ allowLocal: true, baseUrl: proxy.url }).handleSet(forged(deep(6000)))), "TOKEN_INVALID");
});

test("a token whose exp is past a double's range (1e999, read as Infinity) is invalid", async () => {
  // Attack: JSON.parse reads 1e999 as Infinity, and an exp of Infinity would never come.
  const [, token] = await ps.register();
  const v = new Verifier({ allowLocal: true, baseUrl: proxy.url });
  assert.equal(await code(v.verify(await ps.sign(claimsOf(token)))), "ok"); // the signer is the service's
  const payload = JSON.stringify({ ...claimsOf(token), exp: "EXP" }).replace('"EXP"', "1e999");
  assert.equal(await code(v.verify(await ps.sign(payload))), "TOKEN_INVALID");
});

test("a key set is held fresh a day at most, whatever its max-age says", async () => {
  const [, token] = await ps.register();
  try {
    for (const maxAge of ["9".repeat(400), "31536000"]) {
      proxy.rewrite = under("/.well-known/jwks.json", (path, status, headers, body) => [status, { ...headers, "cache-control": `max-age=${maxAge}` }, body]);
      const v = new Verifier({ allowLocal: true, baseUrl: proxy.url });
      assert.equal(await code(v.verify(token)), "ok");
      assert.ok(v.docs.get(`${proxy.url}/.well-known/jwks.json`).freshUntil <= performance.now() + 86_400_000, maxAge);
    }
  } finally {
    proxy.rewrite = null;
  }
});

test("the express middleware refuses two Authorization headers, whichever is valid", async () => {
  // A gateway or the app may read the first, another layer the last: a request carries one.
  // (Node keeps the first of them in req.headers.)
  const express = (await import("express")).default;
  const { request } = await import("node:http");
  const [, token] = await s.register();
  const app = express();
  app.get("/", agentIdMiddleware(new Verifier({ allowLocal: true, baseUrl: s.base })), (req, res) => res.json({}));
  const server = await new Promise((resolve) => {
    const srv = app.listen(0, "127.0.0.1", () => resolve(srv));
  });
  const get = (authorization) => new Promise((resolve, reject) => {
    request({ host: "127.0.0.1", port: server.address().port, path: "/", headers: { authorization } }, (res) => {
      let body = "";
      res.on("data", (chunk) => { body += chunk; });
      res.on("end", () => resolve([res.statusCode, body]));
    }).on("error", reject).end();
  });
  try {
    assert.equal((await get(`Bearer ${token}`))[0], 200);
    for (const pair of [["Bearer forged", `Bearer ${token}`], [`Bearer ${token}`, "Bearer forged"], ["", `Bearer ${token}`]]) {
      const [status, body] = await get(pair);
      assert.equal(status, 401, body);
      assert.equal(JSON.parse(body).error, "TOKEN_INVALID");
    }
  } finally {
    server.close();
  }
});

async function runMiddleware(mw, authorization) {
  const res = { statusCode: 200, headers: {}, body: "", setHeader(k, val) { this.headers[k.toLowerCase()] = val; }, end(b) { this.body = b; } };
  const req = { headers: authorization ? { authorization } : {} };
  let passed = false;
  let error;
  await mw(req, res, (e) => {
    passed = !e;
    error = e;
  });
  return { passed, error, res, req };
}

test("onRefusal hears every refusal with its reason, and a failing hook changes nothing", async () => {
  const [, token] = await s.register();
  const heard = [];
  const v = new Verifier({ allowLocal: true, baseUrl: s.base, issuers: ["other.example"], onRefusal: (code, why) => heard.push([code, why]) });
  assert.equal(await code(v.verify(token)), "TOKEN_INVALID");
  assert.equal(await code(v.verifyOnline(token)), "TOKEN_INVALID");
  assert.equal(await code(v.verifyDpop(token, undefined, "GET", "https://a.example/")), "TOKEN_INVALID");
  assert.deepEqual(heard.map(([c]) => c), ["TOKEN_INVALID", "TOKEN_INVALID", "TOKEN_INVALID"]);
  assert.match(heard[0][1], /issuer example.com is not accepted/);
  const failing = new Verifier({ allowLocal: true, baseUrl: s.base, issuers: ["other.example"], onRefusal: () => { throw new Error("hook"); } });
  assert.equal(await code(failing.verify(token)), "TOKEN_INVALID");
});

test("onVerification counts every outcome and onFetch every fetch, and failing hooks change nothing", async () => {
  const [, token] = await ps.register();
  const [, other] = await ps.register();
  const outcomes = [];
  const fetches = [];
  const v = new Verifier({
    allowLocal: true,
    baseUrl: proxy.url,
    onVerification: (outcome) => outcomes.push(outcome),
    onFetch: (document, result) => fetches.push(`${document} ${result}`),
  });
  await v.verify(token);
  await v.verify(token, { scopes: ["read:orders"] });
  assert.equal(await code(v.verify(token, { scopes: ["write:orders"] })), "INSUFFICIENT_SCOPE");
  assert.equal(await code(v.verify("x")), "TOKEN_INVALID");
  proxy.rewrite = under("/v1/status/", () => [503, {}, Buffer.alloc(0)]);
  try {
    await sleep(2200); // the list (ttl 2 s) is stale: it serves while one refresh fails behind
    await v.verify(other);
    for (let i = 0; i < 250 && fetches.length < 3; i++) await sleep(20);
  } finally {
    proxy.rewrite = null;
  }
  assert.deepEqual(outcomes, ["valid", "valid", "INSUFFICIENT_SCOPE", "TOKEN_INVALID", "valid"]);
  assert.deepEqual(fetches, ["jwks fetched", "status_list fetched", "status_list failed"]);
  const broken = () => {
    throw new Error("hook");
  };
  const failing = new Verifier({ allowLocal: true, baseUrl: proxy.url, onVerification: broken, onFetch: broken });
  assert.equal((await failing.verify(token)).agentId, claimsOf(token).sub);
});

// -- a slow or dead issuer -------------------------------------------------------------------

test("a hung issuer stalls no warm check until the grace runs out", async () => {
  const [, token] = await ps.register();
  let hung = false;
  const fetches = [];
  proxy.rewrite = async (path, status, headers, body) => {
    fetches.push(path);
    if (hung) await sleep(3000); // longer than the verifier's timeout
    // Stale after 2 s, and usable for listGrace past that, as the list (ttl 2 s) is.
    if (path.endsWith("jwks.json")) headers = { ...headers, "cache-control": "max-age=2" };
    return [status, headers, body];
  };
  try {
    const v = new Verifier({ allowLocal: true, baseUrl: proxy.url, listGrace: 3, timeout: 1 });
    await v.verify(token);
    hung = true;
    await sleep(2200); // the keys and the list (ttl 2 s) are stale
    const before = fetches.length;
    let slowest = 0;
    for (const end = Date.now() + 2000; Date.now() < end; ) {
      const started = Date.now();
      assert.equal(await code(v.verify(token)), "ok");
      slowest = Math.max(slowest, Date.now() - started);
      await sleep(50);
    }
    assert.ok(slowest < 250, `a warm check waited ${slowest} ms for a hung issuer`);
    // One refresh per document at a time, and after a failure not again at once.
    assert.ok(fetches.length - before >= 1 && fetches.length - before <= 6, String(fetches.slice(before)));
    await sleep(1200); // past ttl + listGrace (5 s): no usable list is left
    assert.equal(await code(v.verify(token)), "UNAVAILABLE");
  } finally {
    hung = false;
    proxy.rewrite = null;
  }
});

test("a verifier without issuers is warned of once a process", () => {
  const script = `
    import { Verifier } from ${JSON.stringify(new URL("../index.js", import.meta.url).href)};
    new Verifier({ allowLocal: true, baseUrl: "http://127.0.0.1:9", issuers: ["example.com"] });
    console.error("--");
    new Verifier({ allowLocal: true, baseUrl: "http://127.0.0.1:9" });
    new Verifier({ allowLocal: true, baseUrl: "http://127.0.0.1:9" });`;
  const out = spawnSync(process.execPath, ["--input-type=module", "-e", script], { encoding: "utf8" });
  assert.equal(out.status, 0, out.stderr);
  const [before, after] = out.stderr.split("--");
  assert.doesNotMatch(before, /without issuers/);
  assert.equal(after.match(/AGENTID_NO_ISSUERS/g)?.length, 1, out.stderr);
});

// -- claims' shapes and numbers --------------------------------------------------------------

/** `claims` as JSON text, each `"@name"` string value written as the bare number text
 * `numbers[name]` (1e999, which JSON.stringify cannot write). */
const withNumbers = (claims, numbers) =>
  Object.entries(numbers).reduce((text, [name, n]) => text.replace(`"@${name}"`, n), JSON.stringify(claims));

test("exp, iat and nbf must be NumericDates: numbers from 0 to 2^53", async () => {
  const [, token] = await ps.register();
  const claims = claimsOf(token);
  const v = new Verifier({ allowLocal: true, baseUrl: proxy.url });
  const now = Date.now() / 1000;
  // A fraction is a NumericDate, compared as is.
  assert.equal(await code(v.verify(await ps.sign({ ...claims, iat: now - 0.5, exp: now + 100.5, nbf: now - 1.25 }))), "ok");
  for (const name of ["exp", "iat", "nbf"]) {
    for (const bad of ["-1", "-0.5", "1e18", "9007199254740992", "1e999", "-1e999", '"5"', "null", "true", "[1]"]) {
      const payload = withNumbers({ ...claims, [name]: `@${name}` }, { [name]: bad });
      assert.equal(await code(v.verify(await ps.sign(payload))), "TOKEN_INVALID", `${name} ${bad}`);
    }
  }
});

test("scopes, when present, must be an array of strings", async () => {
  const [, token] = await ps.register();
  const claims = claimsOf(token);
  const v = new Verifier({ allowLocal: true, baseUrl: proxy.url });
  assert.equal(await code(v.verify(await ps.sign(claims))), "ok");
  const { scopes, ...without } = claims;
  assert.deepEqual((await v.verify(await ps.sign(without))).scopes, []);
  for (const bad of ["read:orders", { a: 1 }, 0, false, null, [1], ["read:orders", null]]) {
    assert.equal(await code(v.verify(await ps.sign({ ...claims, scopes: bad }))), "TOKEN_INVALID", JSON.stringify(bad));
  }
  assert.ok(scopes.length);
});

test("a malformed status, a null aud, a status list URI with # and crit are TOKEN_INVALID", async () => {
  const [, token] = await ps.register();
  const claims = claimsOf(token);
  const v = new Verifier({ allowLocal: true, baseUrl: proxy.url });
  const ref = claims.status.status_list;
  for (const status of [null, "x", [], {}, { status_list: null }, { status_list: { ...ref, uri: `${ref.uri}#x` } }, { status_list: { ...ref, uri: 7 } }]) {
    assert.equal(await code(v.verify(await ps.sign({ ...claims, status }))), "TOKEN_INVALID", JSON.stringify(status));
  }
  assert.equal(await code(v.verify(await ps.sign({ ...claims, aud: null }))), "TOKEN_INVALID");
  assert.equal(await code(v.verify(await ps.sign(claims, "JWT", { crit: ["x-ext"], "x-ext": 1 }))), "TOKEN_INVALID");
  assert.equal(await code(v.verify(await ps.sign(claims))), "ok");
});

test("a SET's events must be an object, its aud not null, its times NumericDates, its header without crit", async () => {
  const [set] = await polledSet(ps);
  const claims = claimsOf(set);
  const fresh = () => ({ ...claims, jti: crypto.randomUUID() });
  const take = async (payload, extra) => code(new Verifier({ allowLocal: true, baseUrl: proxy.url }).handleSet(await ps.sign(payload, "secevent+jwt", extra)));
  assert.equal(await take(fresh()), "ok");
  assert.equal(await take({ ...fresh(), events: [claims.events] }), "TOKEN_INVALID");
  assert.equal(await take({ ...fresh(), events: [] }), "TOKEN_INVALID");
  assert.equal(await take({ ...fresh(), aud: null }), "TOKEN_INVALID");
  assert.equal(await take({ ...fresh(), aud: [claims.aud, 7] }), "TOKEN_INVALID");
  assert.equal(await take(fresh(), { crit: ["x-ext"], "x-ext": 1 }), "TOKEN_INVALID");
  for (const bad of ["-1", "1e18", "1e999"]) {
    assert.equal(await take(withNumbers({ ...fresh(), iat: "@iat" }, { iat: bad })), "TOKEN_INVALID", `iat ${bad}`);
  }
  // A person's revocation: its event_timestamp is a NumericDate too.
  const person = { ...fresh(), sub_id: { format: "iss_sub", iss: "https://idp.example", sub: "alice" } };
  assert.equal(await take({ ...person, events: { [SESSION_REVOKED]: { event_timestamp: Math.floor(Date.now() / 1000) } } }), "ok");
  for (const bad of ["1e999", "-1", "1e18", '"5"']) {
    const payload = withNumbers({ ...person, jti: crypto.randomUUID(), events: { [SESSION_REVOKED]: { event_timestamp: "@ts" } } }, { ts: bad });
    assert.equal(await take(payload), "TOKEN_INVALID", `event_timestamp ${bad}`);
  }
});

test("a status list whose times are not NumericDates, or whose header names crit, is not used", async () => {
  const [, token] = await ps.register();
  const uri = claimsOf(token).status.status_list.uri;
  const list = await (await fetch(uri.replace(proxy.url, ps.base))).text();
  const listClaims = claimsOf(list);
  const cases = [
    [withNumbers({ ...listClaims, iat: "@iat" }, { iat: "-1" }), {}],
    [withNumbers({ ...listClaims, exp: "@exp" }, { exp: "1e18" }), {}],
    [withNumbers({ ...listClaims, exp: "@exp" }, { exp: "1e999" }), {}],
    [withNumbers({ ...listClaims, ttl: "@ttl" }, { ttl: "1e999" }), {}],
    [JSON.stringify(listClaims), { crit: ["x-ext"], "x-ext": 1 }],
  ];
  try {
    proxy.rewrite = under("/v1/status/", () => [200, {}, Buffer.from(list)]);
    assert.equal(await code(new Verifier({ allowLocal: true, baseUrl: proxy.url }).verify(token)), "ok");
    for (const [payload, extra] of cases) {
      const body = await ps.sign(payload, "statuslist+jwt", extra);
      proxy.rewrite = under("/v1/status/", () => [200, {}, Buffer.from(body)]);
      assert.equal(await code(new Verifier({ allowLocal: true, baseUrl: proxy.url }).verify(token)), "UNAVAILABLE", `${payload} ${JSON.stringify(extra)}`);
    }
  } finally {
    proxy.rewrite = null;
  }
});

test("the signing keys serve past their freshness for listGrace only while refreshes fail", async () => {
  // Attack: the service is kept unreachable (or a key set that does not parse is served),
  // and a key it has since retired signs on: the keys read last served for ever.
  let down = false;
  proxy.rewrite = (path, status, headers, body) => {
    if (!path.endsWith("jwks.json")) return [status, headers, body];
    if (down) return [503, {}, Buffer.alloc(0)];
    return [status, { ...headers, "cache-control": "max-age=1" }, body];
  };
  try {
    const [, registered] = await ps.register();
    const { status, ...claims } = claimsOf(registered); // no status list: the keys alone
    const token = await ps.sign(claims);
    const v = new Verifier({ allowLocal: true, baseUrl: proxy.url, listGrace: 1 });
    assert.equal(await code(v.verify(token)), "ok");
    down = true;
    await sleep(1500); // stale, within the grace: the keys held serve
    assert.equal(await code(v.verify(token)), "ok");
    await sleep(1000); // past max-age + listGrace
    assert.equal(await code(v.verify(token)), "UNAVAILABLE");
    assert.equal(await code(v.verify(token)), "UNAVAILABLE");
    down = false;
    assert.equal(await code(v.verify(token)), "ok");
  } finally {
    proxy.rewrite = null;
  }
});
