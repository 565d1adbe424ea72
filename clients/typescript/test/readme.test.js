// The documentation's receiver.mjs, taken from the page that shows it (README.md or a page of
// docs/) and run as its first line says, against the live server: it trusts a valid token, then
// refuses it once the agent is revoked.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, readdirSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { startServer } from "./server.js";

const PACKAGE = join(dirname(fileURLToPath(import.meta.url)), "..");
const ROOT = join(PACKAGE, "..", "..");

/** README.md and every page of docs/, as the Rust tests read them. */
function pages() {
  const docs = readdirSync(join(ROOT, "docs"))
    .filter((f) => f.endsWith(".md"))
    .sort()
    .map((f) => join(ROOT, "docs", f));
  return [join(ROOT, "README.md"), ...docs];
}

/** The block of a page whose first line is `// NAME: COMMAND`: its text and the command. */
function snippet(name) {
  for (const page of pages()) {
    for (const [, block] of readFileSync(page, "utf8").matchAll(/^```js\n([\s\S]*?)^```/gm)) {
      const first = block.split("\n", 1)[0];
      if (first.startsWith(`// ${name}: `)) return [block, first.slice(`// ${name}: `.length)];
    }
  }
  throw new Error(`neither README.md nor a page of docs/ has a snippet ${name}`);
}

/** The snippet `name` saved in a folder of its own with the package linked in, its jose
 * installed here (install.test.js runs the documented install itself, from a copy as a fresh
 * clone has it): the folder and the snippet's command. */
function saved(name) {
  const [text, command] = snippet(name);
  const dir = mkdtempSync(join(tmpdir(), "agentid-readme-"));
  writeFileSync(join(dir, name), text);
  mkdirSync(join(dir, "node_modules", "@agentid"), { recursive: true });
  symlinkSync(PACKAGE, join(dir, "node_modules", "@agentid", "verifier"));
  return [dir, command];
}

let s;
before(async () => {
  s = await startServer();
});
after(() => s.stop());

test("the README's receiver.mjs runs as written", async () => {
  const [dir, command] = saved("receiver.mjs");
  const [id, token] = await s.register({ scopes: ["read:invoices"] });
  const run = () =>
    execFileSync("bash", ["-c", command], { cwd: dir, env: { ...process.env, TOKEN: token, BASE: s.base, AGENTID_ALLOW_LOCAL: "1" }, encoding: "utf8" }).trim();

  assert.match(run(), new RegExp(`^trusted: ${id} example\\.com \\[ 'read:invoices' \\]`));
  await s.revoke(id);
  const deadline = Date.now() + 5000;
  let seen;
  while ((seen = run()) !== "refused: TOKEN_REVOKED") {
    assert.ok(Date.now() < deadline, seen);
    await new Promise((r) => setTimeout(r, 200));
  }
});

test("the OAuth page's receiver_audience.mjs runs as written", async () => {
  const [dir, command] = saved("receiver_audience.mjs");
  const [id, token] = await s.accessToken("https://api.example/mcp");
  const run = (t) =>
    execFileSync("bash", ["-c", command], { cwd: dir, env: { ...process.env, ACCESS_TOKEN: t, BASE: s.base, AGENTID_ALLOW_LOCAL: "1" }, encoding: "utf8" }).trim();
  assert.equal(run(token), `trusted: ${id} for https://api.example/mcp [ 'tools:call' ]`);
  const [, other] = await s.accessToken("https://other.example/mcp");
  assert.equal(run(other), "refused: TOKEN_INVALID");
});
