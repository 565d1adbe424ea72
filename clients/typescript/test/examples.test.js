// examples/express runs as its README says: the README's commands, with this test's server
// for AGENTID_URL and a free port for PORT, serve /orders to a verified agent only.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { createServer } from "node:net";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { startServer } from "./server.js";

const EXAMPLE = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "..", "examples", "express");

/** The lines of the README's one sh block. */
function readmeCommands() {
  const [, block] = readFileSync(join(EXAMPLE, "README.md"), "utf8").match(/^```sh\n([\s\S]*?)^```/m);
  return block.split("\n").filter((l) => l.trim());
}

const freePort = () =>
  new Promise((resolve) => {
    const srv = createServer().listen(0, "127.0.0.1", () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });

let s;
before(async () => {
  s = await startServer();
});
after(() => s.stop());

test("the Express example runs as its README says", async () => {
  const [, token] = await s.register();
  // Any organization can register agents: the example trusts example.com's, live ones only.
  s.cli("domain", "approve", "--org", s.org.org_id, "other.example");
  const [, stranger] = await s.register({ issuer_domain: "other.example" });
  const [, testMode] = await s.register({}, s.org.keys.secret_test);
  const lines = readmeCommands();
  const start = lines.pop();
  for (const line of lines) execFileSync("bash", ["-euo", "pipefail", "-c", line], { cwd: EXAMPLE, stdio: ["ignore", "ignore", "inherit"] });
  const port = await freePort();
  const command = start.replace("http://127.0.0.1:8080", s.base).replace("PORT=3000", `PORT=${port}`);
  assert.ok(command.includes(s.base) && command.includes(`PORT=${port}`), start);
  // The test's server is plain http on 127.0.0.1: the example's development setting.
  const app = spawn("bash", ["-euo", "pipefail", "-c", command], {
    cwd: EXAMPLE,
    env: { ...process.env, AGENTID_ALLOW_LOCAL: "1" },
    stdio: "ignore",
    detached: true,
  });
  const base = `http://127.0.0.1:${port}`;
  try {
    const deadline = Date.now() + 60_000;
    for (;;) {
      const up = await fetch(`${base}/health`).then((r) => r.ok, () => false);
      if (up) break;
      assert.equal(app.exitCode, null, "the example exited");
      assert.ok(Date.now() < deadline, "the example never answered");
      await new Promise((r) => setTimeout(r, 100));
    }
    const ok = await fetch(`${base}/orders`, { headers: { Authorization: `Bearer ${token}` } });
    assert.equal(ok.status, 200);
    assert.equal((await ok.json()).issuer, "example.com");
    assert.equal((await fetch(`${base}/orders`)).status, 401);
    const bad = await fetch(`${base}/orders`, { headers: { Authorization: "Bearer not.a.token" } });
    assert.equal(bad.status, 401);
    for (const refused of [stranger, testMode]) {
      const res = await fetch(`${base}/orders`, { headers: { Authorization: `Bearer ${refused}` } });
      assert.equal(res.status, 401);
    }
  } finally {
    process.kill(-app.pid, "SIGTERM");
  }
});
