// Tokens bound to a key (DPoP): proofs made by panva's `dpop` with Ed25519 and ES256 keys pass
// verifyDpop and the Express middleware, once; every forged, foreign, stale or replayed proof,
// and a bound token sent as a bearer token, is refused.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { SignJWT, exportJWK, generateKeyPair as joseKeyPair, base64url } from "jose";
import { generateKeyPair, generateProof } from "dpop";
import { Verifier, VerificationError } from "../index.js";
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
    const v = new Verifier({ baseUrl: s.base });
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
  const v = new Verifier({ baseUrl: s.base });
  const cases = {
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
});

test("a revoked agent is revoked whatever its proof", async () => {
  const a = await panvaAgent("Ed25519");
  const v = new Verifier({ baseUrl: s.base });
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
  const v = new Verifier({ baseUrl: s.base });
  const run = async (headers, { host = "api.example", protocol = "https", options = {} } = {}) => {
    const res = { statusCode: 200, headers: {}, body: "", setHeader(k, val) { this.headers[k.toLowerCase()] = val; }, end(b) { this.body = b; } };
    const req = { method: "GET", url: "/orders?page=1", originalUrl: "/orders?page=1", protocol, headers: { host, ...headers } };
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
    assert.deepEqual(JSON.parse(res.body), { error });
    assert.ok(res.headers["www-authenticate"].startsWith(`DPoP error="${challenge}"`), res.headers["www-authenticate"]);
  };
  await refused({ authorization: `DPoP ${a.token}`, dpop: proof }, "PROOF_REPLAYED", "invalid_dpop_proof");
  await refused({ authorization: `DPoP ${a.token}` }, "PROOF_INVALID", "invalid_dpop_proof");
  await refused({ authorization: `Bearer ${a.token}` }, "PROOF_INVALID", "invalid_token");
  await refused({ authorization: `DPoP ${a.token}`, dpop: await a.proof("POST") }, "PROOF_INVALID", "invalid_dpop_proof");
  await refused({ authorization: "DPoP not-a-token", dpop: await a.proof() }, "TOKEN_INVALID", "invalid_token");
  // The URL is rebuilt from the request: behind a proxy it is another URL ...
  await refused({ authorization: `DPoP ${a.token}`, dpop: await a.proof() }, "PROOF_INVALID", "invalid_dpop_proof", { host: "10.0.0.7:8080", protocol: "http" });
  // ... unless the receiver names its public origin.
  r = await run({ authorization: `DPoP ${a.token}`, dpop: await a.proof() }, { host: "10.0.0.7:8080", protocol: "http", options: { publicOrigin: "https://api.example" } });
  assert.ok(r.passed);
});
