import type { Verifier } from "./index.js";

/** Express middleware setting `req.agent`; otherwise 401 (403 for INSUFFICIENT_SCOPE, 503 for
 * UNAVAILABLE, 500 for MISCONFIGURED) with {"error": code}. */
export function agentIdMiddleware(
  verifier: Verifier,
  options?: { scopes?: string[] },
): (req: any, res: any, next: (err?: unknown) => void) => Promise<void>;
