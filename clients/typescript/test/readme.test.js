// The README's receiver.mjs, taken from README.md and run as its first line says, against the
// live server: it trusts a valid token, then refuses it once the agent is revoked.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { startServer } from "./server.js";

const PACKAGE = join(dirname(fileURLToPath(import.meta.url)), "..");
const README = join(PACKAGE, "..", "..", "README.md");

/** The README block whose first line is `// NAME: COMMAND`: its text and the command. */
function snippet(name) {
  for (const [, block] of readFileSync(README, "utf8").matchAll(/^```js\n([\s\S]*?)^```/gm)) {
    const first = block.split("\n", 1)[0];
    if (first.startsWith(`// ${name}: `)) return [block, first.slice(`// ${name}: `.length)];
  }
  throw new Error(`README.md has no snippet ${name}`);
}

let s;
before(async () => {
  s = await startServer();
});
after(() => s.stop());

test("the README's receiver.mjs runs as written", async () => {
  const [text, command] = snippet("receiver.mjs");
  // A folder as `npm install ./clients/typescript` leaves it.
  const dir = mkdtempSync(join(tmpdir(), "agentid-readme-"));
  writeFileSync(join(dir, "receiver.mjs"), text);
  mkdirSync(join(dir, "node_modules", "@agentid"), { recursive: true });
  symlinkSync(PACKAGE, join(dir, "node_modules", "@agentid", "verifier"));
  const [id, token] = await s.register({ scopes: ["read:invoices"] });
  const run = () =>
    execFileSync("bash", ["-c", command], { cwd: dir, env: { ...process.env, TOKEN: token, BASE: s.base }, encoding: "utf8" }).trim();

  assert.match(run(), new RegExp(`^trusted: ${id} example\\.com \\[ 'read:invoices' \\]`));
  await s.revoke(id);
  const deadline = Date.now() + 5000;
  let seen;
  while ((seen = run()) !== "refused: TOKEN_REVOKED") {
    assert.ok(Date.now() < deadline, seen);
    await new Promise((r) => setTimeout(r, 200));
  }
});
