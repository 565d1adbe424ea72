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

let s;
before(async () => {
  s = await startServer();
});
after(() => s.stop());

test("the README's receiver.mjs runs as written", async () => {
  const [text, command] = snippet("receiver.mjs");
  // A folder with the package linked in, its jose installed here (install.test.js runs the
  // documented install itself, from a copy as a fresh clone has it).
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
