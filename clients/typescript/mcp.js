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
// checks the resource only when told to.
import { InvalidTokenError } from "@modelcontextprotocol/sdk/server/auth/errors.js";
import { VerificationError } from "./index.js";

/** The MCP SDK's `OAuthTokenVerifier` on an agentid `Verifier`: its `AuthInfo` carries the
 * agent's client id, scopes and expiry (seconds), the resource the token is for (the
 * receiver's own audience that it names, else its first), and in `extra` the agent, the
 * token's claims, and for a delegated token the person (`subject`) and the chain (`actors`). */
export function mcpTokenVerifier(verifier) {
  if (!verifier?.audience?.length) {
    throw new TypeError("mcpTokenVerifier needs a Verifier built with audience (this server's resource URL): an MCP server takes only tokens issued for it");
  }
  return {
    async verifyAccessToken(token) {
      let agent;
      try {
        agent = await verifier.verify(token);
      } catch (e) {
        if (e instanceof VerificationError && e.code !== "UNAVAILABLE" && e.code !== "MISCONFIGURED") {
          throw new InvalidTokenError(`${e.code}: ${e.message}`);
        }
        throw e;
      }
      const resource = agent.audience.find((a) => verifier.audience?.includes(a)) ?? agent.audience[0];
      return {
        token,
        clientId: agent.clientId ?? agent.agentId,
        scopes: agent.scopes,
        expiresAt: Math.floor(agent.expiresAt.getTime() / 1000),
        ...(resource ? { resource: new URL(resource) } : {}),
        extra: { agentId: agent.agentId, issuer: agent.issuer, livemode: agent.livemode, claims: agent.claims,
                 subject: agent.subject, actors: agent.actors },
      };
    },
  };
}
