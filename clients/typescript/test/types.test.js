// The type declarations as a user's strict TypeScript app sees them: importing
// "@agentid/verifier/express" types `req.agent` on Express's Request, the options and codes
// are checked, and a wrong use fails to compile.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, mkdirSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const PACKAGE = join(dirname(fileURLToPath(import.meta.url)), "..");
const TSC = join(PACKAGE, "node_modules", "typescript", "bin", "tsc");

/** Compiles `source` as an app depending on this package; tsc's output, and whether it passed. */
function compile(source) {
  const app = mkdtempSync(join(tmpdir(), "agentid-types-"));
  mkdirSync(join(app, "node_modules", "@agentid"), { recursive: true });
  symlinkSync(PACKAGE, join(app, "node_modules", "@agentid", "verifier"));
  symlinkSync(join(PACKAGE, "node_modules", "@types"), join(app, "node_modules", "@types"));
  symlinkSync(join(PACKAGE, "node_modules", "jose"), join(app, "node_modules", "jose"));
  writeFileSync(join(app, "app.ts"), source);
  const args = ["--strict", "--noEmit", "--module", "nodenext", "--moduleResolution", "nodenext", "--target", "es2022", "app.ts"];
  try {
    return { ok: true, out: execFileSync(process.execPath, [TSC, ...args], { cwd: app, encoding: "utf8" }) };
  } catch (e) {
    return { ok: false, out: `${e.stdout}${e.stderr}` };
  }
}

const header = `import type { Request, Response } from "express";
import { Verifier, VerificationError, type ErrorCode, type Outcome, type FetchResult } from "@agentid/verifier";
import { agentIdMiddleware } from "@agentid/verifier/express";
`;

test("a strict Express app sees req.agent typed", () => {
  const { ok, out } = compile(`${header}
const counted = new Map<string, number>();
const count = (name: string) => counted.set(name, (counted.get(name) ?? 0) + 1);
const verifier = new Verifier({
  baseUrl: "https://id.example.com",
  onRefusal(code: ErrorCode, reason: string) { console.log(code, reason); },
  onVerification(outcome: Outcome) { count(outcome); },
  onFetch(document, result: FetchResult) { count(\`\${document} \${result}\`); },
});
export const guard = agentIdMiddleware(verifier, { scopes: ["read:orders"], publicOrigin: "https://api.example" });
export function orders(req: Request, res: Response) {
  const id: string | undefined = req.agent?.agentId;
  const live: boolean | undefined = req.agent?.livemode;
  res.json({ id, live });
}
export async function check(token: string, proof: string) {
  try {
    return await verifier.verifyDpop(token, proof, "GET", "https://api.example/orders", { scopes: ["read:orders"] });
  } catch (e) {
    if (e instanceof VerificationError && e.code === "PROOF_REPLAYED") return null;
    throw e;
  }
}
`);
  assert.ok(ok, out);
});

test("a wrong use does not compile", () => {
  for (const body of [
    "export const n: number = (null as unknown as Request).agent!.agentId;",
    'new Verifier({ baseUrl: "https://id.example.com", onRefusal: (code: number) => code });',
    'export const c: ErrorCode = "NOT_A_CODE";',
    'new Verifier({ baseUrl: "https://id.example.com", onFetch: (document: "keys") => document });',
  ]) {
    const { ok } = compile(`${header}${body}\n`);
    assert.ok(!ok, body);
  }
});
