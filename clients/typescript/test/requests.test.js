// Signed requests (Web Bot Auth) checked offline: requests Cloudflare's `web-bot-auth` signed
// with an agent's key, against the directory of a real server the test starts.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { generateKeyPairSync } from "node:crypto";
import { fileURLToPath } from "node:url";
import { signatureHeaders } from "web-bot-auth";
import { signerFromJWK } from "web-bot-auth/crypto";
import { Verifier, VerificationError } from "../index.js";
import { directoryKeys } from "../requests.js";
import { startServer } from "./server.js";

let s;
before(async () => {
  s = await startServer();
});
after(() => s.stop());

const code = (p) => p.then(() => "ok", (e) => (e instanceof VerificationError ? e.code : `not a VerificationError: ${e}`));

/** An agent of example.com bound to a fresh Ed25519 key: its id and private JWK. */
async function signingAgent() {
  const { privateKey } = generateKeyPairSync("ed25519");
  const jwk = privateKey.export({ format: "jwk" });
  const [id] = await s.register({ scopes: ["read:docs"], jwk: { kty: "OKP", crv: "Ed25519", x: jwk.x } });
  return [id, jwk];
}

/** A GET of `url` signed by `jwk`, naming `agent`, as `web-bot-auth` 0.1.3 makes it. */
async function signed(jwk, url, agent) {
  const signatureAgent = JSON.stringify(agent);
  const request = new Request(url, { headers: { "Signature-Agent": signatureAgent } });
  const now = new Date();
  const headers = await signatureHeaders(request, await signerFromJWK(jwk), {
    created: now,
    expires: new Date(now.getTime() + 300_000),
  });
  return { method: "GET", url, headers: { ...headers, "Signature-Agent": signatureAgent } };
}

test("a signed request is checked offline against the agent's directory", async () => {
  const [id, jwk] = await signingAgent();
  const fetched = [];
  const verifier = new Verifier({ baseUrl: s.base, issuers: ["example.com"], onFetch: (d, r) => fetched.push([d, r]) });
  const directory = `${s.base}/v1/directories/example.com`;
  const url = "https://shop.example/products/1";
  const req = await signed(jwk, url, directory);
  const got = await verifier.verifyRequest(req);
  assert.equal(got.signatureAgent, directory);
  assert.equal(got.issuer, "example.com");
  assert.equal(got.tag, "web-bot-auth");
  assert.ok(got.expires > got.created);
  // Replayed; presented for another host; a changed Signature-Agent; unsigned.
  assert.equal(await code(verifier.verifyRequest(req)), "PROOF_REPLAYED");
  const fresh = await signed(jwk, url, directory);
  assert.equal(await code(verifier.verifyRequest({ ...fresh, url: "https://evil.example/products/1" })), "TOKEN_INVALID");
  const swapped = await signed(jwk, url, directory);
  swapped.headers["Signature-Agent"] = JSON.stringify(`${s.base}/v1/directories/a.io`);
  assert.equal(await code(verifier.verifyRequest(swapped)), "TOKEN_INVALID");
  assert.equal(await code(verifier.verifyRequest({ method: "GET", url, headers: {} })), "TOKEN_INVALID");
  // Another directory, untrusted: not fetched.
  const elsewhere = await signed(jwk, url, "https://bots.example/.well-known/http-message-signatures-directory");
  assert.equal(await code(verifier.verifyRequest(elsewhere)), "TOKEN_INVALID");
  // Another spelling of the directory, which a pushed revocation would not drop.
  for (const alias of [`${s.base}/v1/directories/EXAMPLE.COM`, `${directory}?again`]) {
    assert.equal(await code(verifier.verifyRequest(await signed(jwk, url, alias))), "TOKEN_INVALID");
  }
  // A warm check fetches nothing.
  const count = fetched.length;
  await verifier.verifyRequest(await signed(jwk, url, directory));
  assert.equal(fetched.length, count);
  assert.deepEqual(fetched[0], ["directory", "fetched"]);
  // Revoked: gone from the directory, seen at the next fetch.
  await s.revoke(id);
  const fresher = new Verifier({ baseUrl: s.base, issuers: ["example.com"] });
  assert.equal(await code(fresher.verifyRequest(await signed(jwk, url, directory))), "TOKEN_INVALID");
});

test("a pushed revocation drops the issuer's directory at once", async () => {
  const stream = await s.call("POST", "/ssf/streams", {
    delivery: { method: "urn:ietf:rfc:8936" },
    events_requested: ["https://schemas.openid.net/secevent/caep/event-type/session-revoked"],
  });
  const [id, jwk] = await signingAgent();
  const fetched = [];
  const verifier = new Verifier({ baseUrl: s.base, issuers: ["example.com"], onFetch: (d, r) => fetched.push([d, r]) });
  const directory = `${s.base}/v1/directories/example.com`;
  const url = "https://shop.example/";
  await verifier.verifyRequest(await signed(jwk, url, directory)); // the directory is held, fresh
  await s.revoke(id);
  const polled = await s.call("POST", `/ssf/poll/${stream.stream_id}`, { returnImmediately: true }, stream.poll_token);
  const [set] = Object.values(polled.sets);
  await verifier.handleSet(set);
  // Within the directory's minute, and refused: fetched anew, without the agent's key.
  assert.equal(await code(verifier.verifyRequest(await signed(jwk, url, directory))), "TOKEN_INVALID");
  assert.equal(fetched.filter(([d, r]) => d === "directory" && r === "fetched").length, 2);
});

test("a request Python's http-message-signatures signed is checked as well", async () => {
  const [, jwk] = await signingAgent();
  const verifier = new Verifier({ baseUrl: s.base, issuers: ["example.com"] });
  const directory = `${s.base}/v1/directories/example.com`;
  const url = "https://shop.example/products/1";
  const offline = fileURLToPath(new URL("../../../tests/offline", import.meta.url));
  const out = execFileSync("python3", ["sign.py"], {
    cwd: offline,
    env: { ...process.env, KEY: JSON.stringify(jwk), URL: url, AGENT: directory },
  });
  const got = await verifier.verifyRequest({ method: "GET", url, headers: JSON.parse(out) });
  assert.equal(got.issuer, "example.com");
});

test("RFC 9421's test key counts for nothing", async () => {
  const rfcKey = { kty: "OKP", crv: "Ed25519", d: "n4Ni-HpISpVObnQMW0wOhCKROaIKqKtW_2ZYb2p9KcU", x: "JrQLj5P_89iXES9-vFgrIy29clF9CC_oPPsw3c5D0bs" };
  const dead = "http://127.0.0.1:9/directory";
  const verifier = new Verifier({ baseUrl: "http://127.0.0.1:9" });
  const req = await signed(rfcKey, "https://shop.example/", dead);
  await assert.rejects(verifier.verifyRequest(req, { trustedSignatureAgents: [dead] }), /published test keys/);
  // Nor does it, or its negation, count in a directory.
  const negated = Buffer.from(rfcKey.x, "base64url");
  negated[31] ^= 0x80;
  for (const x of [rfcKey.x, negated.toString("base64url")]) {
    assert.equal((await directoryKeys(JSON.stringify({ keys: [{ kty: "OKP", crv: "Ed25519", x }] }))).size, 0);
  }
});

test("every key of a directory as long as the service lists is read", async () => {
  // The service lists up to 1,000 keys in an issuer's directory: the last one signs too.
  const keys = Array.from({ length: 1000 }, () => {
    const { x } = generateKeyPairSync("ed25519").publicKey.export({ format: "jwk" });
    return { kty: "OKP", crv: "Ed25519", x };
  });
  assert.equal((await directoryKeys(JSON.stringify({ keys }))).size, 1000);
});

test("a signed request of a method fetch cannot carry is TOKEN_INVALID, and a 401 in Express", async () => {
  const [, jwk] = await signingAgent();
  const verifier = new Verifier({ baseUrl: s.base, issuers: ["example.com"] });
  const directory = `${s.base}/v1/directories/example.com`;
  for (const method of ["TRACE", "TRACK", "CONNECT"]) {
    const req = await signed(jwk, "https://shop.example/", directory);
    assert.equal(await code(verifier.verifyRequest({ ...req, method })), "TOKEN_INVALID", method);
  }
  const express = (await import("express")).default;
  const { agentIdMiddleware } = await import("../express.js");
  const { request } = await import("node:http");
  const app = express();
  app.use(agentIdMiddleware(verifier, { publicOrigin: "https://shop.example" }), (req, res) => res.json({}));
  const server = await new Promise((resolve) => {
    const srv = app.listen(0, "127.0.0.1", () => resolve(srv));
  });
  try {
    const { headers } = await signed(jwk, "https://shop.example/", directory);
    const status = await new Promise((resolve, reject) => {
      request({ host: "127.0.0.1", port: server.address().port, path: "/", method: "TRACE", headers }, (res) => {
        res.resume();
        resolve(res.statusCode);
      }).on("error", reject).end();
    });
    assert.equal(status, 401);
  } finally {
    server.close();
  }
});

test("a directory of an issuer not accepted is never fetched", async () => {
  // The service is unreachable: a fetch would be UNAVAILABLE, not a refusal.
  const [, jwk] = await signingAgent();
  const base = "http://127.0.0.1:9";
  const verifier = new Verifier({ baseUrl: base, issuers: ["example.com"] });
  const req = await signed(jwk, "https://shop.example/", `${base}/v1/directories/other.example`);
  await assert.rejects(verifier.verifyRequest(req), /issuer other.example is not accepted/);
});

test("the directories held are bounded", async () => {
  // Attack: without `issuers`, each made-up issuer a caller names is a directory fetched and
  // held: the one held longest goes past the bound.
  const [, jwk] = await signingAgent();
  const verifier = new Verifier({ baseUrl: s.base });
  verifier.maxDirectories = 3;
  for (let i = 0; i < 6; i++) {
    const req = await signed(jwk, "https://shop.example/", `${s.base}/v1/directories/d${i}.example`);
    await assert.rejects(verifier.verifyRequest(req), (e) => e.code === "TOKEN_INVALID");
  }
  assert.deepEqual([...verifier.directoryUrls].map((u) => u.split("/").pop()), ["d3.example", "d4.example", "d5.example"]);
  assert.ok(![...verifier.docs.keys()].some((u) => u.includes("/v1/directories/d0.")));
});

test("an unreachable directory fails closed", async () => {
  const [, jwk] = await signingAgent();
  const verifier = new Verifier({ baseUrl: s.base });
  const dead = "http://127.0.0.1:9/directory";
  const req = await signed(jwk, "https://shop.example/", dead);
  assert.equal(await code(verifier.verifyRequest(req, { trustedSignatureAgents: [dead] })), "UNAVAILABLE");
});

test("a stale directory whose fetch failed lately serves at once, within the grace", async () => {
  const http = await import("node:http");
  const { privateKey } = generateKeyPairSync("ed25519");
  const jwk = privateKey.export({ format: "jwk" });
  let hang = false;
  const server = http.createServer((req, res) => {
    if (hang) return; // never answers
    res.writeHead(200, { "Content-Type": "application/http-message-signatures-directory+json", "Cache-Control": "max-age=1" });
    res.end(JSON.stringify({ keys: [{ kty: "OKP", crv: "Ed25519", x: jwk.x }] }));
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  const directory = `http://127.0.0.1:${server.address().port}/directory`;
  const trusted = { trustedSignatureAgents: [directory] };
  try {
    const verifier = new Verifier({ baseUrl: s.base, timeout: 0.5 });
    const check = async () => verifier.verifyRequest(await signed(jwk, "https://shop.example/", directory), trusted);
    assert.equal(await code(check()), "ok");
    hang = true;
    await new Promise((r) => setTimeout(r, 1100));
    // The first finds the service failing (a whole timeout); the next wait for nothing.
    assert.equal(await code(check()), "ok");
    const started = Date.now();
    for (let i = 0; i < 3; i++) assert.equal(await code(check()), "ok");
    assert.ok(Date.now() - started < 400, `${Date.now() - started} ms`);
  } finally {
    server.closeAllConnections();
    server.close();
  }
});

test("the Express middleware takes a signed request in place of a token", async () => {
  const express = (await import("express")).default;
  const { agentIdMiddleware } = await import("../express.js");
  const [, jwk] = await signingAgent();
  const verifier = new Verifier({ baseUrl: s.base, issuers: ["example.com"] });
  const app = express();
  app.get("/products/:id", agentIdMiddleware(verifier, { publicOrigin: "https://shop.example" }),
    (req, res) => res.json({ signed: req.signedRequest?.issuer ?? null, agent: req.agent?.agentId ?? null }));
  app.get("/orders", agentIdMiddleware(verifier, { publicOrigin: "https://shop.example", scopes: ["read:docs"] }),
    (req, res) => res.json({}));
  const server = await new Promise((resolve) => {
    const srv = app.listen(0, "127.0.0.1", () => resolve(srv));
  });
  try {
    const base = `http://127.0.0.1:${server.address().port}`;
    const directory = `${s.base}/v1/directories/example.com`;
    const signedGet = async (path) => {
      const { headers } = await signed(jwk, `https://shop.example${path}`, directory);
      return fetch(base + path, { headers });
    };
    const ok = await signedGet("/products/1?page=2");
    assert.equal(ok.status, 200, await ok.clone().text());
    assert.deepEqual(await ok.json(), { signed: "example.com", agent: null });
    assert.equal((await signedGet("/orders")).status, 403);
    const noOrigin = express();
    noOrigin.get("/", agentIdMiddleware(verifier), (req, res) => res.json({}));
    const other = await new Promise((resolve) => {
      const srv = noOrigin.listen(0, "127.0.0.1", () => resolve(srv));
    });
    try {
      const { headers } = await signed(jwk, "https://shop.example/", directory);
      const res = await fetch(`http://127.0.0.1:${other.address().port}/`, { headers });
      assert.equal(res.status, 401);
    } finally {
      other.close();
    }
  } finally {
    server.close();
  }
});
