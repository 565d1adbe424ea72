import type { Agent, ResourceMetadata, SignedRequest, Verifier } from "./index.js";

declare global {
  namespace Express {
    interface Request {
      /** The verified agent, set by `agentIdMiddleware`. */
      agent?: Agent;
      /** A verified signed request (Web Bot Auth), set by `agentIdMiddleware` instead of
       * `agent` for a request an agent signed rather than sending a token. */
      signedRequest?: SignedRequest;
    }
  }
}

/** Express middleware setting `req.agent` for a bearer token or a DPoP-bound token with its
 * proof; otherwise 401 (403 for INSUFFICIENT_SCOPE, 503 for UNAVAILABLE, 500 for
 * MISCONFIGURED) with {"error": code, "message": …} and a WWW-Authenticate challenge (naming
 * `resourceMetadata`, when given). `publicOrigin`: the origin agents address (behind a
 * proxy), from which a proof's URL is rebuilt. A path in `exclude` (`["/health"]`), or below
 * one, passes unchecked (`"/"` is the root alone); a plain string, an empty entry or one not
 * beginning with `/` throws a TypeError when the middleware is made. With `delegated`, only an agent acting for a person passes. A
 * request an agent signed (Web Bot Auth) instead passes with `req.signedRequest`, checked for
 * `publicOrigin` (a route with `scopes` or `delegated` refuses it). */
export function agentIdMiddleware(
  verifier: Verifier,
  options?: {
    scopes?: string[];
    publicOrigin?: string;
    resourceMetadata?: ResourceMetadata;
    exclude?: string[];
    delegated?: boolean;
    /** Signature directories, beside the service's own, whose signed requests pass. */
    trustedSignatureAgents?: string[];
  },
): (req: any, res: any, next: (err?: unknown) => void) => Promise<void>;

/** An Express handler serving `metadata`: `app.get(metadata.path, resourceMetadataHandler(metadata))`.
 * With `resourceMetadata`, the middleware's 401 challenges name its URL. */
export function resourceMetadataHandler(metadata: ResourceMetadata): (req: any, res: any) => void;
