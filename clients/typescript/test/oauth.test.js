// Access tokens (OAuth 2, RFC 9068) at a receiver: the audience a receiver names, what a
// verified access token tells, protected resource metadata (RFC 9728), the MCP TypeScript
// SDK's `requireBearerAuth` with `mcpTokenVerifier`, and Auth0's express-oauth2-jwt-bearer
// validating agentid's tokens as a stock resource server, against a real server.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { SignJWT, exportJWK, generateKeyPair, decodeJwt } from "jose";
import express from "express";
import { auth } from "express-oauth2-jwt-bearer";
import { requireBearerAuth } from "@modelcontextprotocol/sdk/server/auth/middleware/bearerAuth.js";
import { ServerError } from "@modelcontextprotocol/sdk/server/auth/errors.js";
import { Verifier, VerificationError, ResourceMetadata } from "../index.js";
import { agentIdMiddleware, resourceMetadataHandler } from "../express.js";
import { mcpTokenVerifier } from "../mcp.js";
import { startServer } from "./server.js";

const API_A = "https://shop-a.example/mcp";
const API_B = "https://shop-b.example/mcp";

let s;
before(async () => {
  s = await startServer();
});
after(() => s.stop());

const code = (p) => p.then(() => "ok", (e) => (e instanceof VerificationError ? e.code : `not a VerificationError: ${e}`));

/** An agent bound to a fresh P-256 key: its id and private key. */
async function oauthClient(scopes = ["tools:call"]) {
  const { publicKey, privateKey } = await generateKeyPair("ES256", { extractable: true });
  const { kty, crv, x, y } = await exportJWK(publicKey);
  const [id] = await s.register({ scopes, jwk: { kty, crv, x, y } });
  return [id, privateKey];
}

/** An access token the agent gets itself (client credentials, private_key_jwt) for `resources`. */
async function accessToken(id, key, resources, scope) {
  const now = Math.floor(Date.now() / 1000);
  const assertion = await new SignJWT({ jti: crypto.randomUUID() })
    .setProtectedHeader({ alg: "ES256", typ: "JWT" })
    .setIssuer(id).setSubject(id).setAudience(s.base).setIssuedAt(now).setExpirationTime(now + 300)
    .sign(key);
  const form = new URLSearchParams({
    grant_type: "client_credentials",
    client_assertion_type: "urn:ietf:params:oauth:client-assertion-type:jwt-bearer",
    client_assertion: assertion,
  });
  for (const r of [resources].flat()) form.append("resource", r);
  if (scope) form.append("scope", scope);
  const res = await fetch(`${s.base}/oauth/token`, { method: "POST", body: form });
  assert.equal(res.status, 200, await res.clone().text());
  return (await res.json()).access_token;
}

/** An Express app on a port of its own; its base URL and a way to stop it. */
async function listen(app) {
  const server = await new Promise((resolve) => {
    const srv = app.listen(0, "127.0.0.1", () => resolve(srv));
  });
  return { url: `http://127.0.0.1:${server.address().port}`, stop: () => server.close() };
}

test("a token for one receiver fails at another", async () => {
  const [id, key] = await oauthClient(["tools:call", "read:docs"]);
  const token = await accessToken(id, key, API_A, "tools:call");
  const a = new Verifier({ allowLocal: true, baseUrl: s.base, issuers: ["example.com"], audience: API_A });
  const agent = await a.verify(token, { scopes: ["tools:call"] });
  assert.equal(agent.agentId, id);
  assert.equal(agent.clientId, id);
  assert.deepEqual(agent.audience, [API_A]);
  assert.deepEqual(agent.scopes, ["tools:call"]);
  assert.equal(agent.issuer, "example.com");
  assert.equal(agent.claims.iss, s.base);
  const b = new Verifier({ allowLocal: true, baseUrl: s.base, issuers: ["example.com"], audience: API_B });
  assert.equal(await code(b.verify(token)), "TOKEN_INVALID");
  assert.equal(await code(b.verifyOnline(token)), "TOKEN_INVALID");
  assert.deepEqual((await a.verifyOnline(token)).audience, [API_A]);
  // An agent token names no audience: a receiver that names one refuses it.
  const [, agentToken] = await s.register();
  assert.equal(await code(a.verify(agentToken)), "TOKEN_INVALID");
  assert.equal(await code(a.verifyOnline(agentToken)), "TOKEN_INVALID");
  const anyone = new Verifier({ allowLocal: true, baseUrl: s.base, issuers: ["example.com"] });
  assert.deepEqual((await anyone.verify(agentToken)).audience, []);
  assert.equal(await code(new Verifier({ allowLocal: true, baseUrl: s.base, issuers: ["other.example"] }).verify(token)), "TOKEN_INVALID");
  assert.throws(() => new Verifier({ allowLocal: true, baseUrl: s.base, audience: [] }), TypeError);
  // Signed by the service, yet not of this service or not whole: refused.
  const now = Math.floor(Date.now() / 1000);
  const good = { iss: s.base, sub: id, client_id: id, aud: API_A, scope: "tools:call", issuer_domain: "example.com", iat: now, exp: now + 60, jti: "x" };
  assert.equal(await code(a.verify(await s.sign(good, "at+jwt"))), "ok");
  for (const [claims, typ] of [
    [{ ...good, iss: "https://evil.example" }, "at+jwt"],
    [{ ...good, client_id: "agt_other" }, "at+jwt"],
    [good, "JWT"],
  ]) {
    assert.equal(await code(a.verify(await s.sign(claims, typ))), "TOKEN_INVALID");
  }
});

test("the Express middleware serves resource metadata and names it in its challenges", async () => {
  const app = express();
  const srv = await listen(app);
  const resource = `${srv.url}/api`;
  const verifier = new Verifier({ allowLocal: true, baseUrl: s.base, audience: resource });
  const metadata = new ResourceMetadata(verifier, resource, { scopesSupported: ["tools:call"] });
  assert.equal(metadata.path, "/.well-known/oauth-protected-resource/api");
  app.get(metadata.path, resourceMetadataHandler(metadata));
  app.get("/api", agentIdMiddleware(verifier, { resourceMetadata: metadata }), (req, res) => res.json({ agent: req.agent.agentId }));
  try {
    const doc = await fetch(metadata.url);
    assert.equal(doc.headers.get("access-control-allow-origin"), "*");
    assert.deepEqual(await doc.json(), {
      resource,
      authorization_servers: [s.base],
      scopes_supported: ["tools:call"],
      bearer_methods_supported: ["header"],
      dpop_signing_alg_values_supported: ["EdDSA", "ES256"],
    });
    let res = await fetch(resource);
    assert.equal(res.status, 401);
    assert.equal(res.headers.get("www-authenticate"), `Bearer resource_metadata="${metadata.url}", DPoP algs="EdDSA Ed25519 ES256"`);
    res = await fetch(resource, { headers: { authorization: "Bearer nonsense" } });
    assert.equal(res.headers.get("www-authenticate"), `Bearer error="invalid_token", resource_metadata="${metadata.url}"`);
    const [id, key] = await oauthClient();
    res = await fetch(resource, { headers: { authorization: `Bearer ${await accessToken(id, key, resource)}` } });
    assert.deepEqual(await res.json(), { agent: id });
    res = await fetch(resource, { headers: { authorization: `Bearer ${await accessToken(id, key, API_B)}` } });
    assert.equal(res.status, 401);
  } finally {
    srv.stop();
  }
});

test("the MCP SDK's requireBearerAuth takes mcpTokenVerifier", async () => {
  const app = express();
  const srv = await listen(app);
  const resource = `${srv.url}/mcp`;
  const verifier = new Verifier({ allowLocal: true, baseUrl: s.base, issuers: ["example.com"], audience: resource });
  const metadata = new ResourceMetadata(verifier, resource, { scopesSupported: ["tools:call"] });
  app.post(
    "/mcp",
    requireBearerAuth({ verifier: mcpTokenVerifier(verifier), requiredScopes: ["tools:call"], resourceMetadataUrl: metadata.url }),
    (req, res) => res.json({ clientId: req.auth.clientId, resource: String(req.auth.resource), expiresAt: req.auth.expiresAt }),
  );
  try {
    const [id, key] = await oauthClient(["tools:call", "read:docs"]);
    const token = await accessToken(id, key, resource);
    let res = await fetch(resource, { method: "POST", headers: { authorization: `Bearer ${token}` } });
    assert.equal(res.status, 200, await res.clone().text());
    assert.deepEqual(await res.json(), { clientId: id, resource, expiresAt: decodeJwt(token).exp });
    // For another resource, or without the scope the server requires: refused by the SDK.
    res = await fetch(resource, { method: "POST", headers: { authorization: `Bearer ${await accessToken(id, key, API_B)}` } });
    assert.equal(res.status, 401);
    assert.match(res.headers.get("www-authenticate"), /error="invalid_token".*resource_metadata=/);
    res = await fetch(resource, { method: "POST", headers: { authorization: `Bearer ${await accessToken(id, key, resource, "read:docs")}` } });
    assert.equal(res.status, 403);
  } finally {
    srv.stop();
  }
  // A verifier that names no audience would take a token issued for any server: refused.
  assert.throws(() => mcpTokenVerifier(new Verifier({ allowLocal: true, baseUrl: s.base, issuers: ["example.com"] })), TypeError);
});

test("mcpTokenVerifier refuses, when made, an audience that is not a URL", () => {
  // Its AuthInfo's resource is a URL: an audience that is none would fail each request.
  for (const audience of ["orders-api", [API_A, "orders-api"]]) {
    assert.throws(
      () => mcpTokenVerifier(new Verifier({ allowLocal: true, baseUrl: s.base, issuers: ["example.com"], audience })),
      (e) => e instanceof TypeError && /audience orders-api is not a URL/.test(e.message),
      String(audience),
    );
  }
  assert.equal(typeof mcpTokenVerifier(new Verifier({ allowLocal: true, baseUrl: s.base, issuers: ["example.com"], audience: [API_A, API_B] })).verifyAccessToken, "function");
});

test("through mcpTokenVerifier, an unreachable service is the SDK's server_error, said to be temporary", async () => {
  const app = express();
  const srv = await listen(app);
  const resource = `${srv.url}/mcp`;
  // Nothing listens at the verifier's service.
  const verifier = new Verifier({ allowLocal: true, baseUrl: "http://127.0.0.1:9", issuers: ["example.com"], audience: resource, timeout: 2 });
  const mcp = mcpTokenVerifier(verifier);
  app.post("/mcp", requireBearerAuth({ verifier: mcp }), (req, res) => res.json({}));
  try {
    const [id, key] = await oauthClient();
    const token = await accessToken(id, key, resource);
    await assert.rejects(mcp.verifyAccessToken(token), (e) => e instanceof ServerError && e.cause?.code === "UNAVAILABLE");
    const res = await fetch(resource, { method: "POST", headers: { authorization: `Bearer ${token}` } });
    assert.equal(res.status, 500);
    assert.equal(res.headers.get("www-authenticate"), null);
    assert.deepEqual(await res.json(), { error: "server_error", error_description: "the agent cannot be verified now: try again shortly" });
  } finally {
    srv.stop();
  }
});

test("Auth0's express-oauth2-jwt-bearer validates agentid's access tokens", async () => {
  const app = express();
  const srv = await listen(app);
  const audience = `${srv.url}/api`;
  app.get("/api", auth({ issuerBaseURL: s.base, audience, tokenSigningAlg: "EdDSA" }), (req, res) =>
    res.json({ sub: req.auth.payload.sub, scope: req.auth.payload.scope }),
  );
  // Its errors go to Express's handler: answer with their status alone.
  app.use((err, req, res, next) => res.status(err.status ?? 500).end());
  try {
    const [id, key] = await oauthClient();
    let res = await fetch(audience, { headers: { authorization: `Bearer ${await accessToken(id, key, audience)}` } });
    assert.equal(res.status, 200, await res.clone().text());
    assert.deepEqual(await res.json(), { sub: id, scope: "tools:call" });
    res = await fetch(audience, { headers: { authorization: `Bearer ${await accessToken(id, key, API_B)}` } });
    assert.equal(res.status, 401);
    // An agent token has no audience: refused too.
    const [, agentToken] = await s.register();
    res = await fetch(audience, { headers: { authorization: `Bearer ${agentToken}` } });
    assert.equal(res.status, 401);
  } finally {
    srv.stop();
  }
});
