import type { Verifier } from "./index.js";

/** What `requireBearerAuth` of the MCP TypeScript SDK puts in `req.auth` (its `AuthInfo`). */
export interface AgentAuthInfo {
  token: string;
  /** The OAuth client: the agent's id. */
  clientId: string;
  scopes: string[];
  /** Seconds since the epoch. */
  expiresAt: number;
  /** The resource the token is for: the verifier's own audience that it names. */
  resource?: URL;
  extra: { agentId: string; issuer: string; livemode: boolean; claims: Record<string, unknown> };
}

/** The MCP SDK's `OAuthTokenVerifier` on an agentid `Verifier`: a token that does not verify
 * throws the SDK's `InvalidTokenError` (401); an unreachable service (UNAVAILABLE) the SDK's
 * `ServerError`, its `cause` the `VerificationError`, which `requireBearerAuth` answers 500
 * with `{"error": "server_error", "error_description": "the agent cannot be verified now: try
 * again shortly"}` (the SDK maps no error to a 503). Throws a `TypeError` at once when the
 * verifier names no `audience`, or one that is not a URL. */
export function mcpTokenVerifier(verifier: Verifier): {
  verifyAccessToken(token: string): Promise<AgentAuthInfo>;
};
