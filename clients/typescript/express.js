// Express middleware: verifies the request's agent token before the route sees it. On
// success the agent is `req.agent`; otherwise 401 (403 for INSUFFICIENT_SCOPE, 503 for
// UNAVAILABLE, 500 for MISCONFIGURED: the receiver's own configuration) with `{"error": code}`.
import { VerificationError } from "./index.js";

const STATUS = { INSUFFICIENT_SCOPE: 403, UNAVAILABLE: 503, MISCONFIGURED: 500 };

export function agentIdMiddleware(verifier, { scopes = [] } = {}) {
  return async (req, res, next) => {
    const header = req.headers?.authorization || "";
    const token = header.toLowerCase().startsWith("bearer ") ? header.slice(7).trim() : "";
    try {
      if (!token) throw new VerificationError("TOKEN_INVALID", "no bearer token");
      req.agent = await verifier.verify(token, { scopes });
    } catch (e) {
      if (!(e instanceof VerificationError)) return next(e);
      res.setHeader("WWW-Authenticate", 'Bearer error="invalid_token"');
      res.statusCode = STATUS[e.code] || 401;
      res.setHeader("Content-Type", "application/json");
      res.end(JSON.stringify({ error: e.code }));
      return;
    }
    next();
  };
}
