import type { Verifier } from "./index.js";

/** Express middleware setting `req.agent`; 401, 403 or 503 with {"error": code} otherwise. */
export function agentIdMiddleware(
  verifier: Verifier,
  options?: { scopes?: string[] },
): (req: any, res: any, next: (err?: unknown) => void) => Promise<void>;
