// MCP servers (the MCP TypeScript SDK's authorization): agentid as the `OAuthTokenVerifier`
// that `requireBearerAuth` takes, so that an MCP client holding an agentid access token for
// this server is let in, and any other is refused with the SDK's 401 and its challenge.
//
//   const verifier = new Verifier({ baseUrl: "https://id.example.com", issuers: ["example.com"],
//                                   audience: "https://api.example/mcp" });
//   app.use("/mcp", requireBearerAuth({ verifier: mcpTokenVerifier(verifier), requiredScopes: ["tools:call"] }));
//
// A token is checked offline, as `Verifier.verify` checks it (signature, issuer, audience,
// expiry, revocation through its status list or a pushed event). A token bound to a key
// (DPoP) is refused: the SDK takes bearer tokens only. The verifier must name its `audience`
// (the server's resource URL): MCP servers take only tokens issued for them, and the SDK
// checks the resource only when told to; each of its audiences must be a URL (the `resource`
// of the SDK's `AuthInfo` is one), or `mcpTokenVerifier` throws a TypeError.
//
// When the agentid service cannot be reached (UNAVAILABLE), the SDK's `ServerError` is thrown,
// its `cause` the `VerificationError`: `requireBearerAuth` answers it 500 with
// `{"error": "server_error", "error_description": "the agent cannot be verified now: try again
// shortly"}` and no challenge, so that the client keeps its token. The SDK maps no error to a
// 503 (its `TemporarilyUnavailableError` it answers 400, a fault of the client's request).
import { InvalidTokenError, ServerError } from "@modelcontextprotocol/sdk/server/auth/errors.js";
import { VerificationError } from "./index.js";

/** What the client is told when the service cannot be reached (as the Express middleware says). */
const UNAVAILABLE = "the agent cannot be verified now: try again shortly";

/** The MCP SDK's `OAuthTokenVerifier` on an agentid `Verifier`: its `AuthInfo` carries the
 * agent's client id, scopes and expiry (seconds), the resource the token is for (the
 * receiver's own audience that it names), and in `extra` the agent, the token's claims, and
 * for a delegated token the person (`subject`) and the chain (`actors`). A token that does not
 * verify throws the SDK's `InvalidTokenError` (401); an unreachable service its `ServerError`
 * (500, said to be temporary). Throws a TypeError, when made, for a verifier whose audience is
 * missing or not a URL. */
export function mcpTokenVerifier(verifier) {
  if (!verifier?.audience?.length) {
    throw new TypeError("mcpTokenVerifier needs a Verifier built with audience (this server's resource URL): an MCP server takes only tokens issued for it");
  }
  /** The verifier's audiences as URLs, by their text. */
  const resources = new Map();
  for (const audience of verifier.audience) {
    try {
      resources.set(audience, new URL(audience));
    } catch {
      throw new TypeError(`mcpTokenVerifier: audience ${audience} is not a URL (it is the resource of the SDK's AuthInfo: name this server's resource URL)`);
    }
  }
  return {
    async verifyAccessToken(token) {
      let agent;
      try {
        agent = await verifier.verify(token);
      } catch (e) {
        if (e instanceof VerificationError && e.code === "UNAVAILABLE") {
          const unavailable = new ServerError(UNAVAILABLE);
          unavailable.cause = e;
          throw unavailable;
        }
        if (e instanceof VerificationError && e.code !== "MISCONFIGURED") {
          throw new InvalidTokenError(`${e.code}: ${e.message}`);
        }
        throw e;
      }
      // The verifier took the token only for one of its audiences.
      const resource = agent.audience.find((a) => resources.has(a));
      return {
        token,
        clientId: agent.clientId ?? agent.agentId,
        scopes: agent.scopes,
        expiresAt: Math.floor(agent.expiresAt.getTime() / 1000),
        ...(resource ? { resource: new URL(resources.get(resource)) } : {}),
        extra: { agentId: agent.agentId, issuer: agent.issuer, livemode: agent.livemode, claims: agent.claims,
                 subject: agent.subject, actors: agent.actors },
      };
    },
  };
}
