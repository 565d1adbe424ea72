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
import { startServer, startProxy } from "./server.js";

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
  const verifier = new Verifier({ allowLocal: true, baseUrl: s.base, issuers: ["example.com"], onFetch: (d, r) => fetched.push([d, r]) });
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
  const fresher = new Verifier({ allowLocal: true, baseUrl: s.base, issuers: ["example.com"] });
  assert.equal(await code(fresher.verifyRequest(await signed(jwk, url, directory))), "TOKEN_INVALID");
});

test("a pushed revocation drops the issuer's directory at once", async () => {
  const stream = await s.call("POST", "/ssf/streams", {
    delivery: { method: "urn:ietf:rfc:8936" },
    events_requested: ["https://schemas.openid.net/secevent/caep/event-type/session-revoked"],
  });
  const [id, jwk] = await signingAgent();
  const fetched = [];
  const verifier = new Verifier({ allowLocal: true, baseUrl: s.base, issuers: ["example.com"], onFetch: (d, r) => fetched.push([d, r]) });
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
  const verifier = new Verifier({ allowLocal: true, baseUrl: s.base, issuers: ["example.com"] });
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

/** A GET of `url` signed by `jwk` naming `agent`, its Signature-Input written by hand with
 * `nonce` as it is given (a structured field's string `"abc"`, token `abc` or bytes `:YWJj:`). */
async function signedWithNonce(jwk, url, agent, nonce) {
  const { calculateJwkThumbprint } = await import("jose");
  const { createPrivateKey, sign } = await import("node:crypto");
  const keyid = await calculateJwkThumbprint({ kty: "OKP", crv: "Ed25519", x: jwk.x });
  const created = Math.floor(Date.now() / 1000);
  const params = `("@authority" "signature-agent");created=${created};expires=${created + 300};keyid="${keyid}";nonce=${nonce};tag="web-bot-auth"`;
  const signatureAgent = JSON.stringify(agent);
  const base = `"@authority": ${new URL(url).host}\n"signature-agent": ${signatureAgent}\n"@signature-params": ${params}`;
  const signature = sign(null, Buffer.from(base), createPrivateKey({ key: jwk, format: "jwk" })).toString("base64");
  return { method: "GET", url, headers: { "Signature-Agent": signatureAgent, "Signature-Input": `sig1=${params}`, Signature: `sig1=:${signature}:` } };
}

test("a signature whose nonce is not a string is refused, and a long one is held short", async () => {
  // Attack: a nonce written as a structured field's token (`nonce=abc`) or byte sequence was
  // read as an object, a new one each time: the signature passed again and again, never a
  // replay. It is PROOF_INVALID.
  const [, jwk] = await signingAgent();
  const verifier = new Verifier({ allowLocal: true, baseUrl: s.base, issuers: ["example.com"] });
  const directory = `${s.base}/v1/directories/example.com`;
  const url = "https://shop.example/";
  const string = await signedWithNonce(jwk, url, directory, `"n-${crypto.randomUUID()}"`);
  assert.equal(await code(verifier.verifyRequest(string)), "ok");
  assert.equal(await code(verifier.verifyRequest(string)), "PROOF_REPLAYED");
  for (const nonce of ["abc", ":YWJj:", "7", "?1"]) {
    const req = await signedWithNonce(jwk, url, directory, nonce);
    for (let i = 0; i < 2; i++) assert.equal(await code(verifier.verifyRequest(req)), "PROOF_INVALID", nonce);
  }
  // Attack: nonces as long as a header takes, each held for up to the signature's 24 h. The
  // replay memory keeps a digest of each, whatever its length, and still refuses the replay.
  const long = await signedWithNonce(jwk, url, directory, `"${"n".repeat(8000)}"`);
  assert.equal(await code(verifier.verifyRequest(long)), "ok");
  assert.equal(await code(verifier.verifyRequest(long)), "PROOF_REPLAYED");
  const held = [...verifier.nonces.keys.values()].flatMap((k) => [...k.ids.keys()]);
  assert.ok(held.length === 2 && held.every((n) => n.length <= 64), String(held.map((n) => n.length)));
});

test("RFC 9421's test key counts for nothing", async () => {
  const rfcKey = { kty: "OKP", crv: "Ed25519", d: "n4Ni-HpISpVObnQMW0wOhCKROaIKqKtW_2ZYb2p9KcU", x: "JrQLj5P_89iXES9-vFgrIy29clF9CC_oPPsw3c5D0bs" };
  const dead = "http://127.0.0.1:9/directory";
  const verifier = new Verifier({ allowLocal: true, baseUrl: "http://127.0.0.1:9" });
  const req = await signed(rfcKey, "https://shop.example/", dead);
  await assert.rejects(verifier.verifyRequest(req, { trustedSignatureAgents: [dead] }), /published test keys/);
  // Nor does it, or its negation, count in a directory.
  const negated = Buffer.from(rfcKey.x, "base64url");
  negated[31] ^= 0x80;
  for (const x of [rfcKey.x, negated.toString("base64url")]) {
    assert.equal((await directoryKeys(JSON.stringify({ keys: [{ kty: "OKP", crv: "Ed25519", x }] }))).size, 0);
  }
});

test("trustedSignatureAgents given as a string is a TypeError", async () => {
  // Attack: a plain string of trusted directories was searched as text, so any directory
  // whose URL is part of it (`https://bots.example/` of `https://bots.example/d`, say) was
  // trusted. A string is a TypeError, in verifyRequest and when the middleware is made.
  const { agentIdMiddleware } = await import("../express.js");
  const { privateKey } = generateKeyPairSync("ed25519");
  const dead = "http://127.0.0.1:9/d";
  const verifier = new Verifier({ allowLocal: true, baseUrl: "http://127.0.0.1:9", issuers: ["example.com"] });
  const req = await signed(privateKey.export({ format: "jwk" }), "https://shop.example/", dead);
  for (const trustedSignatureAgents of [dead, `${dead}irectory`, [dead, 7]]) {
    await assert.rejects(verifier.verifyRequest(req, { trustedSignatureAgents }), TypeError);
  }
  assert.throws(() => agentIdMiddleware(verifier, { trustedSignatureAgents: dead }), TypeError);
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
  const verifier = new Verifier({ allowLocal: true, baseUrl: s.base, issuers: ["example.com"] });
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
  const verifier = new Verifier({ allowLocal: true, baseUrl: base, issuers: ["example.com"] });
  const req = await signed(jwk, "https://shop.example/", `${base}/v1/directories/other.example`);
  await assert.rejects(verifier.verifyRequest(req), /issuer other.example is not accepted/);
});

test("the directories held are bounded", async () => {
  // Attack: without `issuers`, each made-up issuer a caller names is a directory fetched and
  // held: the one held longest goes past the bound.
  const [, jwk] = await signingAgent();
  const verifier = new Verifier({ allowLocal: true, baseUrl: s.base });
  verifier.maxDirectories = 3;
  for (let i = 0; i < 6; i++) {
    const req = await signed(jwk, "https://shop.example/", `${s.base}/v1/directories/d${i}.example`);
    await assert.rejects(verifier.verifyRequest(req), (e) => e.code === "TOKEN_INVALID");
  }
  assert.deepEqual([...verifier.directoryUrls].map((u) => u.split("/").pop()), ["d3.example", "d4.example", "d5.example"]);
  assert.ok(![...verifier.docs.keys()].some((u) => u.includes("/v1/directories/d0.")));
});

test("a directory whose fetch failed with none held is not fetched again at once", async () => {
  // Attack: while the service answers a directory 429 (or not at all) and none is held, each
  // signed request naming it fetched it again. The failure is remembered: UNAVAILABLE without
  // a fetch until 1 s has passed (doubling per failure, up to 30 s).
  const proxy = await startProxy(s.base);
  proxy.rewrite = (path, status, headers, body) => (path.startsWith("/v1/directories/") ? [429, {}, Buffer.alloc(0)] : [status, headers, body]);
  try {
    const fetched = [];
    const verifier = new Verifier({ allowLocal: true, baseUrl: proxy.url, issuers: ["example.com"], onFetch: (d, r) => fetched.push([d, r]) });
    const { privateKey } = generateKeyPairSync("ed25519");
    const req = await signed(privateKey.export({ format: "jwk" }), "https://shop.example/", `${proxy.url}/v1/directories/example.com`);
    for (let i = 0; i < 5; i++) assert.equal(await code(verifier.verifyRequest(req)), "UNAVAILABLE");
    assert.deepEqual(fetched, [["directory", "failed"]]);
    await new Promise((r) => setTimeout(r, 1100));
    assert.equal(await code(verifier.verifyRequest(req)), "UNAVAILABLE");
    assert.equal(fetched.length, 2);
  } finally {
    proxy.stop();
  }
});

/** A proxy rewrite answering 200 with `body` (or `body(upstream's)`), fresh for `maxAge`
 * seconds and without an ETag, for paths under `prefix`. */
const answered = (prefix, body, maxAge) => (path, status, headers, upstream) => {
  if (!path.startsWith(prefix)) return [status, headers, upstream];
  const { etag, "cache-control": _, ...kept } = headers;
  return [200, { ...kept, "cache-control": `max-age=${maxAge}` }, Buffer.from(typeof body === "function" ? body(upstream) : body)];
};

test("a directory key that does not import is passed over", async () => {
  // A directory one key of which is not an Ed25519 point (`x` of 3 bytes) was unusable whole:
  // every signed request naming it was UNAVAILABLE. The key is passed over, the rest used.
  const [, jwk] = await signingAgent();
  const proxy = await startProxy(s.base);
  const bad = { kty: "OKP", crv: "Ed25519", x: "AAAA" };
  proxy.rewrite = answered("/v1/directories/", (b) => JSON.stringify({ keys: [bad, ...JSON.parse(b).keys] }), 60);
  try {
    const verifier = new Verifier({ allowLocal: true, baseUrl: proxy.url, issuers: ["example.com"] });
    const req = await signed(jwk, "https://shop.example/", `${proxy.url}/v1/directories/example.com`);
    assert.equal(await code(verifier.verifyRequest(req)), "ok");
  } finally {
    proxy.stop();
  }
});

test("a directory that is not a key set is a failed fetch, not held for its max-age", async () => {
  // Attack: a 200 that is not a key set, served with a max-age of an hour, was held fresh for
  // the hour (read again at every request, every one UNAVAILABLE), and replaced a good
  // directory held. It is a failed fetch: fetched again after 1 s, and meanwhile a good
  // directory held serves within the grace.
  const [, jwk] = await signingAgent();
  const proxy = await startProxy(s.base);
  const directory = `${proxy.url}/v1/directories/example.com`;
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  try {
    const verifier = new Verifier({ allowLocal: true, baseUrl: proxy.url, issuers: ["example.com"] });
    proxy.rewrite = answered("/v1/directories/", "not json", 3600);
    assert.equal(await code(verifier.verifyRequest(await signed(jwk, "https://shop.example/", directory))), "UNAVAILABLE");
    proxy.rewrite = null; // the service is fixed
    await sleep(1100);
    assert.equal(await code(verifier.verifyRequest(await signed(jwk, "https://shop.example/", directory))), "ok");
    // A good directory held (here fresh for 1 s), then one that is not a key set: the good one
    // serves within the grace.
    const fetched = [];
    const held = new Verifier({ allowLocal: true, baseUrl: proxy.url, issuers: ["example.com"], onFetch: (d, r) => fetched.push(r) });
    proxy.rewrite = answered("/v1/directories/", (b) => b, 1);
    assert.equal(await code(held.verifyRequest(await signed(jwk, "https://shop.example/", directory))), "ok");
    proxy.rewrite = answered("/v1/directories/", JSON.stringify({ keys: "none" }), 3600);
    await sleep(1100);
    for (let i = 0; i < 2; i++) {
      assert.equal(await code(held.verifyRequest(await signed(jwk, "https://shop.example/", directory))), "ok");
    }
    assert.deepEqual(fetched, ["fetched", "failed"]);
  } finally {
    proxy.stop();
  }
});

test("a directory is read once whoever asks for it meanwhile", async () => {
  // Callers that wait for one fetch of a directory take the keys read once, when it was
  // fetched: each read it again (a thumbprint and a key import a key).
  const http = await import("node:http");
  const keys = Array.from({ length: 100 }, () => {
    const { x } = generateKeyPairSync("ed25519").publicKey.export({ format: "jwk" });
    return { kty: "OKP", crv: "Ed25519", x };
  });
  const server = http.createServer((req, res) => {
    res.writeHead(200, { "Cache-Control": "max-age=60" });
    res.end(JSON.stringify({ keys }));
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  try {
    const verifier = new Verifier({ allowLocal: true, baseUrl: "http://127.0.0.1:9", issuers: ["example.com"] });
    const url = `http://127.0.0.1:${server.address().port}/directory`;
    const got = await Promise.all(Array.from({ length: 30 }, () => verifier.directory(url)));
    assert.equal(got[0].size, 100);
    assert.equal(new Set(got).size, 1, `${new Set(got).size} readings of one directory`);
    assert.equal(await verifier.directory(url), got[0]);
  } finally {
    server.closeAllConnections();
    server.close();
  }
});

test("an unreachable directory fails closed", async () => {
  const [, jwk] = await signingAgent();
  const verifier = new Verifier({ allowLocal: true, baseUrl: s.base });
  const dead = "http://127.0.0.1:9/directory";
  const req = await signed(jwk, "https://shop.example/", dead);
  assert.equal(await code(verifier.verifyRequest(req, { trustedSignatureAgents: [dead] })), "UNAVAILABLE");
  // The failures remembered (not to fetch again at once) are bounded as the directories held are.
  verifier.maxDirectories = 3;
  for (let i = 0; i < 6; i++) {
    const other = `http://127.0.0.1:9/d${i}`;
    const named = await signed(jwk, "https://shop.example/", other);
    assert.equal(await code(verifier.verifyRequest(named, { trustedSignatureAgents: [other] })), "UNAVAILABLE");
  }
  assert.deepEqual([...verifier.failedDirectories.keys()], ["http://127.0.0.1:9/d3", "http://127.0.0.1:9/d4", "http://127.0.0.1:9/d5"]);
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
    const verifier = new Verifier({ allowLocal: true, baseUrl: s.base, timeout: 0.5 });
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
  const verifier = new Verifier({ allowLocal: true, baseUrl: s.base, issuers: ["example.com"] });
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

test("without allowLocal a directory over plain http, or on a loopback address, is never fetched", async () => {
  // Attack: a receiver trusts a directory, or is made to name one, whose URL reaches its own
  // network: plain http, or an https host that is not globally reachable.
  const [, jwk] = await signingAgent();
  const http = await import("node:http");
  let connections = 0;
  // The agent's key as a third party publishes it (not fetched from the service, whose
  // anonymous calls earlier tests of this file may have used up).
  const directory = JSON.stringify({ keys: [{ kty: "OKP", crv: "Ed25519", x: jwk.x }] });
  const server = http.createServer((req, res) => {
    res.writeHead(200, { "Content-Type": "application/http-message-signatures-directory+json" });
    res.end(directory);
  });
  server.on("connection", () => connections++);
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  try {
    const port = server.address().port;
    // With allowLocal (development), the directory is fetched and the request passes.
    const local = `http://127.0.0.1:${port}/directory`;
    const dev = new Verifier({ allowLocal: true, baseUrl: "https://id.example.com" });
    assert.equal(await code(dev.verifyRequest(await signed(jwk, "https://shop.example/", local), { trustedSignatureAgents: [local] })), "ok");
    const before = connections;
    for (const dir of [local, `https://127.0.0.1:${port}/directory`, `https://localhost:${port}/directory`]) {
      const verifier = new Verifier({ baseUrl: "https://id.example.com" });
      const req = await signed(jwk, "https://shop.example/", dir);
      await assert.rejects(verifier.verifyRequest(req, { trustedSignatureAgents: [dir] }), (e) => e.code === "UNAVAILABLE" && /allowLocal/.test(e.message));
    }
    assert.equal(connections, before);
  } finally {
    server.closeAllConnections();
    server.close();
  }
});
