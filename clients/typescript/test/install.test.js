// The README's install command, run as written in an app's folder outside the repository,
// from a copy of this package as a fresh clone has it (no node_modules): the installed
// package imports, and verifies a token of the live server.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { cpSync, existsSync, lstatSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { startServer } from "./server.js";

const PACKAGE = join(dirname(fileURLToPath(import.meta.url)), "..");

/** The README's install command: the first `npm install` line of a sh block. */
function installCommand() {
  for (const [, block] of readFileSync(join(PACKAGE, "README.md"), "utf8").matchAll(/^```sh\n([\s\S]*?)^```/gm)) {
    const line = block.split("\n").find((l) => l.startsWith("npm install "));
    if (line) return line;
  }
  throw new Error("README.md shows no npm install command");
}

let s;
before(async () => {
  s = await startServer();
});
after(() => s.stop());

test("the README's install command works from a fresh clone", async () => {
  const command = installCommand();
  const dir = mkdtempSync(join(tmpdir(), "agentid-install-"));
  // The clone at ../agentid, as the README has it, holding the package's folder as git does.
  const clone = join(dir, "agentid", "clients", "typescript");
  cpSync(PACKAGE, clone, { recursive: true, filter: (src) => !src.startsWith(join(PACKAGE, "node_modules")) });
  assert.ok(!existsSync(join(clone, "node_modules")));
  const app = join(dir, "app");
  mkdirSync(app);
  execFileSync("bash", ["-c", command], { cwd: app, stdio: ["ignore", "ignore", "inherit"] });

  const [id, token] = await s.register();
  writeFileSync(
    join(app, "check.mjs"),
    `import { Verifier } from "@agentid/verifier";
import { agentIdMiddleware } from "@agentid/verifier/express";
const verifier = new Verifier({ allowLocal: true, baseUrl: process.env.BASE, issuers: ["example.com"] });
const agent = await verifier.verify(process.env.TOKEN);
console.log(agent.agentId, typeof agentIdMiddleware);
`,
  );
  const check = () =>
    execFileSync("node", ["check.mjs"], { cwd: app, env: { ...process.env, TOKEN: token, BASE: s.base }, encoding: "utf8" }).trim();
  try {
    assert.equal(check(), `${id} function`);
    // A copy, not a link; and one a later `npm ci` makes again from the tarball the app keeps.
    assert.ok(lstatSync(join(app, "node_modules", "@agentid", "verifier")).isDirectory(), "installed, not linked");
    rmSync(join(app, "node_modules"), { recursive: true });
    execFileSync("npm", ["ci"], { cwd: app, stdio: ["ignore", "ignore", "inherit"] });
    assert.equal(check(), `${id} function`);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
