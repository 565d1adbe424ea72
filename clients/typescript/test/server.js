// A real agentid server for the tests: the binary the repository builds (or $AGENTID_BIN),
// on a fresh SQLite database, with status lists of a 2 s ttl.
import { spawn, execFileSync } from "node:child_process";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { createInterface } from "node:readline";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");
const BIN = process.env.AGENTID_BIN || join(ROOT, "target", "debug", "agentid");

export async function startServer() {
  const dir = mkdtempSync(join(tmpdir(), "agentid-ts-"));
  const env = { ...process.env, DATABASE_URL: `sqlite://${dir}/agentid.db`, AGENTID_SIGNING_KEY_FILE: join(dir, "key.pem") };
  const cli = (...args) => execFileSync(BIN, args, { env, cwd: dir, encoding: "utf8" });
  cli("migrate"); // only serve and migrate create a database
  const org = JSON.parse(cli("org", "create", "--name", "ts", "--plan", "growth"));
  const proc = spawn(BIN, ["serve"], {
    cwd: dir,
    env: { ...env, AGENTID_BIND: "127.0.0.1:0", AGENTID_METRICS_BIND: "off", AGENTID_STATUS_LIST_TTL: "2", RUST_LOG: "warn" },
    stdio: ["ignore", "pipe", "ignore"],
  });
  const base = await new Promise((resolve, reject) => {
    const lines = createInterface({ input: proc.stdout });
    lines.on("line", (line) => {
      if (line.startsWith("agentid: listening on ")) resolve(line.split(" ")[3]);
    });
    proc.on("exit", () => reject(new Error("agentid exited")));
  });
  // The organization issues under example.com (the serve above made the key file).
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
    stop: () => proc.kill("SIGKILL"),
  };
}
