// Tokens bound to a key (DPoP): proofs made by panva's `dpop` with Ed25519 and ES256 keys pass
// verifyDpop and the Express middleware, once; every forged, foreign, stale or replayed proof,
// and a bound token sent as a bearer token, is refused.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { SignJWT, exportJWK, generateKeyPair as joseKeyPair, base64url } from "jose";
import { generateKeyPair, generateProof } from "dpop";
import { Verifier, VerificationError, htuForm } from "../index.js";
import { agentIdMiddleware } from "../express.js";
import { startServer } from "./server.js";

const URL = "https://api.example/orders";
let s;
before(async () => {
  s = await startServer();
});
after(() => s.stop());

const code = (p) => p.then(() => "ok", (e) => (e instanceof VerificationError ? e.code : `not a VerificationError: ${e}`));
const publicJwk = async (keyPair) => {
  const { kty, crv, x, y } = await exportJWK(keyPair.publicKey);
  return y ? { kty, crv, x, y } : { kty, crv, x };
};

/** An agent of panva's `dpop`: its key pair and a registered token bound to it. */
async function panvaAgent(alg) {
  const keyPair = await generateKeyPair(alg, { extractable: true });
  const [id, token] = await s.register({ jwk: await publicJwk(keyPair) });
  return { id, token, proof: (method = "GET", url = URL, tok = token) => generateProof(keyPair, url, method, undefined, tok) };
}

for (const alg of ["Ed25519", "ES256"]) {
  test(`panva's ${alg} proofs pass once, offline and online`, async () => {
    const a = await panvaAgent(alg);
    const v = new Verifier({ allowLocal: true, baseUrl: s.base });
    const proof = await a.proof();
    assert.equal((await v.verifyDpop(a.token, proof, "GET", URL)).agentId, a.id);
    assert.equal(await code(v.verifyDpop(a.token, proof, "GET", URL)), "PROOF_REPLAYED");
    const answer = await s.call("POST", "/v1/verify", { token: a.token, dpop: await a.proof(), htm: "GET", htu: URL });
    assert.equal(answer.valid, true);
    assert.equal(typeof answer.cnf.jkt, "string");
    // A bound token alone is worth nothing, offline or online.
    assert.equal(await code(v.verify(a.token)), "PROOF_INVALID");
    assert.equal(await code(v.verifyOnline(a.token)), "PROOF_INVALID");
    assert.equal(await code(v.verifyDpop(a.token, undefined, "GET", URL)), "PROOF_INVALID");
  });
}

test("forged, foreign, stale and oversized proofs are refused", async () => {
  const ed = await joseKeyPair("EdDSA", { crv: "Ed25519", extractable: true });
  const thief = await joseKeyPair("EdDSA", { crv: "Ed25519", extractable: true });
  const es = await joseKeyPair("ES256", { extractable: true });
  const edJwk = await publicJwk(ed);
  const [, token] = await s.register({ jwk: edJwk });
  const [, other] = await s.register({ jwk: edJwk });
  const [, esToken] = await s.register({ jwk: await publicJwk(es) });
  const [, bearer] = await s.register();
  const ath = async (t) => base64url.encode(new Uint8Array(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(t))));
  const proof = async ({ tok = token, key = ed, header = {}, ...claims } = {}) =>
    new SignJWT({ jti: crypto.randomUUID(), htm: "GET", htu: URL, iat: Math.floor(Date.now() / 1000), ath: await ath(tok), ...claims })
      .setProtectedHeader({ typ: "dpop+jwt", alg: "EdDSA", jwk: await publicJwk(key), ...header })
      .sign(key.privateKey);
  const enc = (o) => Buffer.from(JSON.stringify(o)).toString("base64url");
  const unsigned = `${enc({ typ: "dpop+jwt", alg: "none", jwk: edJwk })}.${enc({ jti: "x", htm: "GET", htu: URL, iat: Math.floor(Date.now() / 1000), ath: await ath(token) })}.`;
  const hs = await new SignJWT({ jti: "h", htm: "GET", htu: URL, iat: Math.floor(Date.now() / 1000), ath: await ath(token) })
    .setProtectedHeader({ typ: "dpop+jwt", alg: "HS256", jwk: edJwk })
    .sign(new Uint8Array(32));
  // Signed by the bound key, under a header whose alg is any JSON value.
  const labelled = async (alg) => {
    const claims = { jti: crypto.randomUUID(), htm: "GET", htu: URL, iat: Math.floor(Date.now() / 1000), ath: await ath(token) };
    const input = `${enc({ typ: "dpop+jwt", alg, jwk: edJwk })}.${enc(claims)}`;
    const signature = await crypto.subtle.sign("Ed25519", ed.privateKey, new TextEncoder().encode(input));
    return `${input}.${Buffer.from(signature).toString("base64url")}`;
  };
  const v = new Verifier({ allowLocal: true, baseUrl: s.base });
  const cases = {
    "alg a list": [token, await labelled(["EdDSA"])],
    "alg a property of every object": [token, await labelled("constructor")],
    "another method": [token, await proof({ htm: "POST" })],
    "another URL": [token, await proof({ htu: "https://api.example/admin" })],
    "another token": [token, await proof({ tok: other })],
    "the thief's key": [token, await proof({ key: thief })],
    "alg none": [token, unsigned],
    HS256: [token, hs],
    "ES256 over an Ed25519 key": [token, await proof({ key: es, header: { alg: "ES256", jwk: edJwk } })],
    "a private jwk": [token, await proof({ header: { jwk: await exportJWK(ed.privateKey) } })],
    "typ JWT": [token, await proof({ header: { typ: "JWT" } })],
    "10 minutes late": [token, await proof({ iat: Math.floor(Date.now() / 1000) - 600 })],
    "10 minutes early": [token, await proof({ iat: Math.floor(Date.now() / 1000) + 600 })],
    "64 KiB": [token, "e".repeat(65536)],
    "an ES256-bound token, an Ed25519 proof": [esToken, await proof({ tok: esToken })],
    "a bearer token with a proof": [bearer, await proof({ tok: bearer })],
  };
  for (const [what, [tok, p]] of Object.entries(cases)) {
    assert.equal(await code(v.verifyDpop(tok, p, "GET", URL)), "PROOF_INVALID", what);
  }
  assert.equal(await code(v.verifyDpop(token, await proof(), "GET", `${URL}?page=2`)), "ok");
  assert.equal(await code(v.verifyDpop(token, await labelled("EdDSA"), "GET", URL)), "ok", "labelled as it should be");
});

test("a revoked agent is revoked whatever its proof", async () => {
  const a = await panvaAgent("Ed25519");
  const v = new Verifier({ allowLocal: true, baseUrl: s.base });
  await v.verifyDpop(a.token, await a.proof(), "GET", URL);
  await s.revoke(a.id);
  await new Promise((r) => setTimeout(r, 2500)); // the status list's ttl
  // The stale list answers once more while it refreshes.
  const seen = Date.now();
  let answer;
  while ((answer = await code(v.verifyDpop(a.token, await a.proof(), "GET", URL))) === "ok") {
    assert.ok(Date.now() - seen < 2000, "the revocation is not seen");
    await new Promise((r) => setTimeout(r, 50));
  }
  assert.equal(answer, "TOKEN_REVOKED");
});

test("the express middleware takes DPoP and refuses as RFC 9449 says", async () => {
  const a = await panvaAgent("ES256");
  const v = new Verifier({ allowLocal: true, baseUrl: s.base });
  const run = async (headers, { host = "api.example", protocol = "https", target = "/orders?page=1", options = { publicOrigin: "https://api.example" } } = {}) => {
    const res = { statusCode: 200, headers: {}, body: "", setHeader(k, val) { this.headers[k.toLowerCase()] = val; }, end(b) { this.body = b; } };
    const req = { method: "GET", url: target, originalUrl: target, protocol, headers: { host, ...headers } };
    let passed = false;
    await agentIdMiddleware(v, options)(req, res, () => { passed = true; });
    return { passed, res, req };
  };
  const proof = await a.proof();
  let r = await run({ authorization: `DPoP ${a.token}`, dpop: proof });
  assert.ok(r.passed);
  assert.equal(r.req.agent.agentId, a.id);
  const refused = async (headers, error, challenge, where) => {
    const { passed, res } = await run(headers, where);
    assert.ok(!passed);
    assert.equal(res.statusCode, 401);
    const body = JSON.parse(res.body);
    assert.deepEqual(Object.keys(body).sort(), ["error", "message"]);
    assert.equal(body.error, error);
    assert.ok(body.message);
    assert.ok(res.headers["www-authenticate"].startsWith(`DPoP error="${challenge}"`), res.headers["www-authenticate"]);
  };
  await refused({ authorization: `DPoP ${a.token}`, dpop: proof }, "PROOF_REPLAYED", "invalid_dpop_proof");
  await refused({ authorization: `DPoP ${a.token}` }, "PROOF_INVALID", "invalid_dpop_proof");
  await refused({ authorization: `Bearer ${a.token}` }, "PROOF_INVALID", "invalid_token");
  await refused({ authorization: `DPoP ${a.token}`, dpop: await a.proof("POST") }, "PROOF_INVALID", "invalid_dpop_proof");
  await refused({ authorization: "DPoP not-a-token", dpop: await a.proof() }, "TOKEN_INVALID", "invalid_token");
  // The URL is the receiver's public origin and the request's path, whatever the request's
  // host (a proxy's, say) ...
  r = await run({ authorization: `DPoP ${a.token}`, dpop: await a.proof() }, { host: "10.0.0.7:8080", protocol: "http" });
  assert.ok(r.passed);
  // ... and without a public origin no bound token passes.
  const { passed, res } = await run({ authorization: `DPoP ${a.token}`, dpop: await a.proof() }, { options: {} });
  assert.ok(!passed);
  assert.equal(res.statusCode, 401);
  assert.match(res.headers["www-authenticate"], /^DPoP error="invalid_token", error_description=".*publicOrigin/);
});

test("a proof made for another receiver is refused", async () => {
  // Attack: a proof the agent made for receiver A, replayed to receiver B with the Host,
  // forwarded headers or an absolute-form target of A (Express with trust proxy reads them).
  const a = await panvaAgent("Ed25519");
  const v = new Verifier({ allowLocal: true, baseUrl: s.base });
  const proof = await a.proof("GET", "https://shop-a.example/orders");
  for (const [options, target] of [
    [{ publicOrigin: "https://shop-b.example" }, "/orders"],
    [{ publicOrigin: "https://shop-b.example" }, "https://shop-a.example/orders"],
    [{}, "/orders"],
  ]) {
    const res = { statusCode: 200, headers: {}, setHeader(k, val) { this.headers[k.toLowerCase()] = val; }, end() {} };
    const req = { method: "GET", url: target, originalUrl: target, protocol: "https",
                  headers: { host: "shop-a.example", "x-forwarded-host": "shop-a.example", authorization: `DPoP ${a.token}`, dpop: proof } };
    let passed = false;
    await agentIdMiddleware(v, options)(req, res, () => { passed = true; });
    assert.ok(!passed && res.statusCode === 401, `${JSON.stringify(options)} ${target}`);
  }
});

test("a key of small order proves nothing", async () => {
  // Attack: a token bound to the Ed25519 identity point (signed by the service), and a proof
  // "signed" for it with no private key (R the identity, S 0).
  const b64 = (bytes) => base64url.encode(bytes);
  const identity = { kty: "OKP", crv: "Ed25519", x: b64(Uint8Array.from([1, ...new Array(31).fill(0)])) };
  const jkt = b64(new Uint8Array(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(`{"crv":"Ed25519","kty":"OKP","x":"${identity.x}"}`))));
  const [agent] = await s.register();
  const now = Math.floor(Date.now() / 1000);
  const token = await s.sign({ iss: "example.com", sub: agent, jti: "w", iat: now, exp: now + 60, scopes: ["read:orders"], cnf: { jkt } });
  const ath = b64(new Uint8Array(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(token))));
  const part = (o) => b64(new TextEncoder().encode(JSON.stringify(o)));
  const forged = `${part({ typ: "dpop+jwt", alg: "EdDSA", jwk: identity })}.${part({ jti: "j", htm: "GET", htu: URL, iat: now, ath })}.${b64(Uint8Array.from([1, ...new Array(63).fill(0)]))}`;
  const v = new Verifier({ allowLocal: true, baseUrl: s.base });
  await assert.rejects(v.verifyDpop(token, forged, "GET", URL), (e) => e.code === "PROOF_INVALID" && /small order/.test(e.message));
  // A key whose x is not base64url at all: refused as a proof, not thrown as something else.
  const broken = `${part({ typ: "dpop+jwt", alg: "EdDSA", jwk: { ...identity, x: "a" } })}.${part({ jti: "k", htm: "GET", htu: URL, iat: now, ath })}.${b64(Uint8Array.from([1, ...new Array(63).fill(0)]))}`;
  await assert.rejects(v.verifyDpop(token, broken, "GET", URL), (e) => e.code === "PROOF_INVALID");
});

test("a proof dated ahead does not lock out honest ones", () => {
  // Attack: a proof dated a minute ahead taken first, then enough others to fill the memory
  // (100,000): the earliest made are forgotten, not the first taken.
  const v = new Verifier({ allowLocal: true, baseUrl: s.base });
  const now = Math.floor(Date.now() / 1000);
  v.admitProof("k", "ahead", now + 60);
  for (let i = 0; i < 100_000; i++) v.admitProof("k", `p${i}`, now - 30);
  assert.doesNotThrow(() => v.admitProof("k", "honest", now));
  assert.throws(() => v.admitProof("k", "p0", now - 30), (e) => e.code === "PROOF_REPLAYED");
  assert.throws(() => v.admitProof("k", "ahead", now + 60), (e) => e.code === "PROOF_REPLAYED");
});

test("a key that fills the memory raises no other key's floor", () => {
  // Attack: a key holder fills the memory with proofs dated up to a minute ahead. Its own
  // earliest are forgotten, under its own floor: other keys' proofs made now, several in one
  // second, still pass.
  const v = new Verifier({ allowLocal: true, baseUrl: s.base });
  v.proofs.capacity = 100;
  const now = Math.floor(Date.now() / 1000);
  for (let i = 0; i < 200; i++) v.admitProof("greedy", `g${i}`, now + 41 + Math.floor(i / 10));
  for (let i = 0; i < 5; i++) {
    assert.doesNotThrow(() => v.admitProof("honest", `h${i}`, now));
    assert.doesNotThrow(() => v.admitProof("other", `o${i}`, now));
  }
  assert.equal(v.proofs.held, 100);
  assert.throws(() => v.admitProof("greedy", "g0", now + 41), (e) => e.code === "PROOF_REPLAYED");
  assert.throws(() => v.admitProof("honest", "h4", now), (e) => e.code === "PROOF_REPLAYED");
  // When every key holds one, the earliest of all goes, and a floor for all with it.
  const w = new Verifier({ allowLocal: true, baseUrl: s.base });
  w.proofs.capacity = 2;
  for (const [key, iat] of [["a", now], ["b", now + 2], ["c", now + 1]]) w.admitProof(key, "j", iat);
  assert.throws(() => w.admitProof("d", "j", now), (e) => e.code === "PROOF_REPLAYED" && /memory/.test(e.message));
  assert.doesNotThrow(() => w.admitProof("d", "j", now + 1));
  assert.equal(w.proofs.keys.size, 2);
});

test("a proof older than what was forgotten is refused", () => {
  // A caller that read the time before another's call forgot the proof cannot take it again.
  const v = new Verifier({ allowLocal: true, baseUrl: s.base });
  const now = Math.floor(Date.now() / 1000);
  assert.equal(v.proofs.admit("k", "p", now - 59, now - 60), null);
  assert.equal(v.proofs.admit("k", "q", now, now - 58), null);
  assert.equal(v.proofs.admit("k", "p", now - 59, now - 60), "old");
  // A caller that read the clock over a minute late is still refused; a wall clock stepped
  // back over a minute takes the horizon with it.
  assert.equal(v.proofs.admit("k", "p", now - 59, now - 130), "old");
  assert.equal(v.proofs.admit("k", "after", now - 200, now - 230, now - 200), null);
});

test("the refusal hook hears no raw controls", async () => {
  // Attack: a proof whose jwk's kty carries a newline, an escape sequence, a C1 control and a
  // right-to-left override, which the refusal's reason names.
  const heard = [];
  const v = new Verifier({ allowLocal: true, baseUrl: s.base, onRefusal: (code, reason) => heard.push(reason) });
  const keyPair = await joseKeyPair("EdDSA", { extractable: true });
  const jwk = await publicJwk(keyPair);
  const [, token] = await s.register({ jwk });
  const planted = "OKP\n\u001b[2J\u009b31m\u202etxt.exe";
  const ath = base64url.encode(new Uint8Array(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(token))));
  const proof = await new SignJWT({ jti: "j", htm: "GET", htu: URL, iat: Math.floor(Date.now() / 1000), ath })
    .setProtectedHeader({ typ: "dpop+jwt", alg: "EdDSA", jwk: { ...jwk, kty: planted } })
    .sign(keyPair.privateKey);
  assert.equal(await code(v.verifyDpop(token, proof, "GET", URL)), "PROOF_INVALID");
  assert.ok(heard.length && heard[0].includes("\\u001b"), heard[0]);
  assert.ok(![..."\n\u001b\u009b\u202e"].some((c) => heard[0].includes(c)), heard[0]);
});

test("proofs that say they expired, are not valid yet or name critical extensions are refused", async () => {
  const keyPair = await joseKeyPair("EdDSA", { extractable: true });
  const jwk = await publicJwk(keyPair);
  const [, token] = await s.register({ jwk });
  const v = new Verifier({ allowLocal: true, baseUrl: s.base });
  const now = Math.floor(Date.now() / 1000);
  const ath = base64url.encode(new Uint8Array(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(token))));
  const sign = (claims, header = {}) =>
    new SignJWT({ jti: crypto.randomUUID(), htm: "GET", htu: URL, iat: now, ath, ...claims })
      .setProtectedHeader({ typ: "dpop+jwt", alg: "EdDSA", jwk, ...header })
      .sign(keyPair.privateKey);
  // jose will not sign a header with an extension it does not know: signed by hand.
  const part = (o) => base64url.encode(new TextEncoder().encode(JSON.stringify(o)));
  const input = `${part({ typ: "dpop+jwt", alg: "EdDSA", jwk, crit: ["x-ext"], "x-ext": 1 })}.${part({ jti: "c", htm: "GET", htu: URL, iat: now, ath })}`;
  const { sign: edSign, KeyObject } = await import("node:crypto");
  const crit = `${input}.${base64url.encode(edSign(null, Buffer.from(input), KeyObject.from(keyPair.privateKey)))}`;
  for (const proof of [await sign({ exp: now - 1 }), await sign({ nbf: now + 120 }), crit]) {
    assert.equal(await code(v.verifyDpop(token, proof, "GET", URL)), "PROOF_INVALID");
  }
  assert.equal(await code(v.verifyDpop(token, await sign({ exp: now + 60 }), "GET", URL)), "ok");
});

test("htu is compared normalized, as the service compares it", () => {
  // RFC 9449 §4.3: both URLs normalized (RFC 3986 §6.2.2, §6.2.3) before they are compared;
  // what names another resource stays different.
  const same = [
    ["https://api.example/orders", "https://api.example:443/orders"],
    ["https://api.example/orders", "HTTPS://API.Example/orders?x=1#f"],
    ["https://api.example/~orders", "https://api.example/%7eorders"],
    ["https://api.example/a%2Fb", "https://api.example/a%2fb"],
    ["https://api.example/", "https://api.example"],
    ["https://api.example/a/c", "https://api.example/a/./b/../c"],
    ["https://api.example/a/", "https://api.example/a/b/.."],
    ["http://api.example/x", "http://api.example:80/x"],
    ["https://api.example/x", "https://api.example:/x"],
    ["https://[::1]/x", "https://[::1]:443/x"],
    ["https://api.example/é", "https://api.example/é"],
  ];
  const different = [
    ["https://api.example/orders", "https://api.example/Orders"],
    ["https://api.example/x", "https://api.example:8443/x"],
    ["https://api.example/x", "http://api.example/x"],
    ["https://api.example/x", "http://api.example:443/x"],
    ["https://api.example/a%2Fb", "https://api.example/a/b"],
    ["https://api.example/x", "https://api.example./x"],
    ["https://api.example/x", "https://other.example/x"],
  ];
  for (const [a, b] of same) assert.equal(htuForm(a), htuForm(b), `${a} ${b}`);
  for (const [a, b] of different) assert.notEqual(htuForm(a), htuForm(b), `${a} ${b}`);
});

test("a proof whose htu is written another way passes", async () => {
  // The agent wrote the URL in upper case with an encoded unreserved character, the receiver
  // names it with its default port: one URL, so the proof passes.
  const keyPair = await joseKeyPair("EdDSA", { extractable: true });
  const jwk = await publicJwk(keyPair);
  const [id, token] = await s.register({ jwk });
  const v = new Verifier({ allowLocal: true, baseUrl: s.base });
  const ath = base64url.encode(new Uint8Array(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(token))));
  const proof = await new SignJWT({ jti: crypto.randomUUID(), htm: "GET", htu: "HTTPS://API.Example/%6Frders", iat: Math.floor(Date.now() / 1000), ath })
    .setProtectedHeader({ typ: "dpop+jwt", alg: "EdDSA", jwk })
    .sign(keyPair.privateKey);
  assert.equal((await v.verifyDpop(token, proof, "GET", "https://api.example:443/orders")).agentId, id);
});

test("a proof whose iat has a fraction passes, under its whole second", async () => {
  // iat is a NumericDate (RFC 7519 §2, RFC 9449 §4.2): a number, a fraction allowed, taken to
  // the whole second it falls in and remembered under it. A string is no number.
  const keyPair = await joseKeyPair("EdDSA", { extractable: true });
  const jwk = await publicJwk(keyPair);
  const [id, token] = await s.register({ jwk });
  const v = new Verifier({ allowLocal: true, baseUrl: s.base });
  const now = Math.floor(Date.now() / 1000);
  const ath = base64url.encode(new Uint8Array(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(token))));
  const sign = (iat, jti) =>
    new SignJWT({ jti, htm: "GET", htu: URL, iat, ath }).setProtectedHeader({ typ: "dpop+jwt", alg: "EdDSA", jwk }).sign(keyPair.privateKey);
  assert.equal((await v.verifyDpop(token, await sign(now + 0.75, "fraction"), "GET", URL)).agentId, id);
  const held = [...v.proofs.keys.values()].filter((k) => k.ids.has("fraction")).map((k) => k.ids.get("fraction"));
  assert.deepEqual(held, [now]);
  assert.equal(await code(v.verifyDpop(token, await sign(String(now), "string"), "GET", URL)), "PROOF_INVALID");
});

test("a proof's exp, nbf and iat must be NumericDates (1e999 is no time)", async () => {
  // Attack: JSON.parse reads 1e999 as Infinity, so an exp of 1e999 never came and an nbf of
  // -1e999 always had.
  const keyPair = await joseKeyPair("EdDSA", { extractable: true });
  const jwk = await publicJwk(keyPair);
  const [, token] = await s.register({ jwk });
  const v = new Verifier({ allowLocal: true, baseUrl: s.base });
  const now = Math.floor(Date.now() / 1000);
  const ath = base64url.encode(new Uint8Array(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(token))));
  const { sign: edSign, KeyObject } = await import("node:crypto");
  const part = (text) => base64url.encode(new TextEncoder().encode(text));
  /** A proof whose claims end with `extra`, JSON text written as is. */
  const proof = (extra) => {
    const claims = JSON.stringify({ jti: crypto.randomUUID(), htm: "GET", htu: URL, iat: now, ath }).slice(0, -1) + extra + "}";
    const input = `${part(JSON.stringify({ typ: "dpop+jwt", alg: "EdDSA", jwk }))}.${part(claims)}`;
    return `${input}.${base64url.encode(edSign(null, Buffer.from(input), KeyObject.from(keyPair.privateKey)))}`;
  };
  assert.equal(await code(v.verifyDpop(token, proof(`,"exp":${now + 60}.5,"nbf":${now - 1}`), "GET", URL)), "ok");
  for (const extra of [',"exp":1e999', ',"exp":1e18', ',"nbf":-1e999', ',"nbf":-1', ',"exp":"1e999"', ',"iat":1e999']) {
    assert.equal(await code(v.verifyDpop(token, proof(extra), "GET", URL)), "PROOF_INVALID", extra);
  }
});
