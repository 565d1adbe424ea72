// A real agentid server for the tests: the binary the repository builds (or $AGENTID_BIN),
// on a fresh SQLite database, with status lists of a 2 s ttl; and a proxy to put in front of it.
import { spawn, execFileSync } from "node:child_process";
import { createPublicKey } from "node:crypto";
import { mkdtempSync, readFileSync } from "node:fs";
import { createServer } from "node:http";
import { tmpdir } from "node:os";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { createInterface } from "node:readline";
import { CompactSign, SignJWT, calculateJwkThumbprint, exportJWK, generateKeyPair, importPKCS8 } from "jose";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");
const BIN = process.env.AGENTID_BIN || join(ROOT, "target", "debug", "agentid");

/** A server; `serveEnv` adds to the environment of `agentid serve` (AGENTID_PUBLIC_URL, …). */
export async function startServer(serveEnv = {}) {
  const dir = mkdtempSync(join(tmpdir(), "agentid-ts-"));
  const env = { ...process.env, DATABASE_URL: `sqlite://${dir}/agentid.db`, AGENTID_SIGNING_KEY_FILE: join(dir, "key.pem") };
  const cli = (...args) => execFileSync(BIN, args, { env, cwd: dir, encoding: "utf8" });
  cli("migrate"); // only serve and migrate create a database
  const org = JSON.parse(cli("org", "create", "--name", "ts", "--plan", "growth"));
  const proc = spawn(BIN, ["serve"], {
    cwd: dir,
    env: { ...env, AGENTID_BIND: "127.0.0.1:0", AGENTID_METRICS_BIND: "off", AGENTID_STATUS_LIST_TTL: "2", RUST_LOG: "warn", ...serveEnv },
    stdio: ["ignore", "pipe", "ignore"],
  });
  const base = await new Promise((resolve, reject) => {
    const lines = createInterface({ input: proc.stdout });
    lines.on("line", (line) => {
      if (line.startsWith("agentid: listening on ")) resolve(line.split(" ")[3]);
    });
    proc.on("exit", () => reject(new Error("agentid exited")));
  });
  // The organization issues under example.com (`org create` above made the key file).
  cli("domain", "approve", "--org", org.org_id, "example.com");
  const call = async (method, path, body, key = org.keys.secret_live) => {
    const res = await fetch(base + path, {
      method,
      headers: { authorization: `Bearer ${key}`, ...(body ? { "content-type": "application/json" } : {}) },
      body: body ? JSON.stringify(body) : undefined,
    });
    const text = await res.text();
    return text ? JSON.parse(text) : null;
  };
  let signing;
  return {
    base,
    org,
    cli,
    call,
    register: async (extra = {}, key = undefined) => {
      const a = await call("POST", "/v1/agents/register", { name: "bot", issuer_domain: "example.com", scopes: ["read:orders"], ...extra }, key);
      return [a.agent_id, a.token];
    },
    revoke: (id) => call("POST", `/v1/agents/${id}/revoke`),
    /** A new agent bound to a P-256 key, and an access token it gets itself (client
     * credentials, private_key_jwt) for `resource`: its id and the token. */
    accessToken: async (resource, scopes = ["tools:call"]) => {
      const { publicKey, privateKey } = await generateKeyPair("ES256");
      const { kty, crv, x, y } = await exportJWK(publicKey);
      const a = await call("POST", "/v1/agents/register", { name: "bot", issuer_domain: "example.com", scopes, jwk: { kty, crv, x, y } });
      const now = Math.floor(Date.now() / 1000);
      const assertion = await new SignJWT({ jti: crypto.randomUUID() })
        .setProtectedHeader({ alg: "ES256" })
        .setIssuer(a.agent_id).setSubject(a.agent_id).setAudience(base).setIssuedAt(now).setExpirationTime(now + 300)
        .sign(privateKey);
      const res = await fetch(`${base}/oauth/token`, {
        method: "POST",
        body: new URLSearchParams({
          grant_type: "client_credentials",
          client_assertion_type: "urn:ietf:params:oauth:client-assertion-type:jwt-bearer",
          client_assertion: assertion,
          resource,
        }),
      });
      return [a.agent_id, (await res.json()).access_token];
    },
    /** A JWS of `claims` (or of a payload's text) signed with the key of the server's key
     * file (the key that signs until a rotation): what only the service could sign; `extra`
     * adds to its header (a `crit` there is signed as given). */
    sign: async (claims, typ = "JWT", extra = {}) => {
      // The file's key, read once (a flood of SETs signs thousands).
      signing ??= (async () => {
        const key = await importPKCS8(readFileSync(env.AGENTID_SIGNING_KEY_FILE, "utf8"), "EdDSA");
        return { key, kid: await calculateJwkThumbprint(await exportJWK(createPublicKey(key))) };
      })();
      const { key, kid } = await signing;
      const header = { alg: "EdDSA", kid, typ, ...extra };
      const options = { crit: Object.fromEntries((extra.crit ?? []).map((name) => [name, true])) };
      if (typeof claims === "string") return new CompactSign(new TextEncoder().encode(claims)).setProtectedHeader(header).sign(key, options);
      return new SignJWT(claims).setProtectedHeader(header).sign(key, options);
    },
    stop: () => proc.kill("SIGKILL"),
  };
}

/** An HTTP server on a port of its own: `handle(req, res)` answers, by default passing each
 * request to `upstream` and its answer through `rewrite(path, status, headers, body)`, which
 * gives `[status, headers, body]` (headers an object of lower-case names). */
export async function startProxy(upstream) {
  const proxy = {
    upstream,
    rewrite: null,
    handle: null,
    async pass(req, res) {
      const sent = {};
      for (const name of ["accept", "authorization", "if-none-match"]) if (req.headers[name]) sent[name] = req.headers[name];
      const answer = await fetch(proxy.upstream + req.url, { headers: sent, redirect: "manual" });
      let status = answer.status;
      let headers = Object.fromEntries(answer.headers);
      let body = Buffer.from(await answer.arrayBuffer());
      if (proxy.rewrite) [status, headers, body] = await proxy.rewrite(req.url, status, headers, body);
      for (const name of ["content-length", "transfer-encoding", "connection", "keep-alive", "date", "content-encoding"]) delete headers[name];
      res.writeHead(status, { ...headers, "content-length": Buffer.byteLength(body) });
      res.end(body);
    },
  };
  const server = createServer((req, res) => {
    (proxy.handle || proxy.pass)(req, res).catch((e) => {
      res.writeHead(502);
      res.end(String(e));
    });
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  proxy.url = `http://127.0.0.1:${server.address().port}`;
  proxy.stop = () => {
    server.closeAllConnections();
    server.close();
  };
  return proxy;
}
