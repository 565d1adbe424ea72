export type ErrorCode = "TOKEN_INVALID" | "TOKEN_EXPIRED" | "TOKEN_REVOKED" | "INSUFFICIENT_SCOPE" | "UNAVAILABLE";

export class VerificationError extends Error {
  constructor(code: ErrorCode, message?: string);
  readonly code: ErrorCode;
}

export interface Agent {
  agentId: string;
  issuer: string;
  scopes: string[];
  issuedAt: Date;
  expiresAt: Date;
  /** False for a test-mode token (accepted only with `allowTest`). */
  livemode: boolean;
}

export interface VerifierOptions {
  /** The agentid service, e.g. https://id.example.com. Keys and lists come only from here. */
  baseUrl: string;
  /** Accepted `iss` values; any when absent. */
  issuers?: string[];
  /** Seconds of tolerance on `exp` and `iat` (30). */
  leeway?: number;
  /** Seconds past its `ttl` a status list that cannot be refetched is still used (300). */
  listGrace?: number;
  /** Judge a token on signature and claims alone when its list cannot be had (false). */
  failOpen?: boolean;
  /** Seconds between refetches of the keys for unknown kids (60). */
  kidRefetchInterval?: number;
  /** Seconds a fetch may take (5). */
  timeout?: number;
  /** Accept test-mode tokens (`livemode: false`, issued with an sk_test_ key): false. */
  allowTest?: boolean;
}

export class Verifier {
  constructor(options: VerifierOptions);
  /** Offline: signature, claims, revocation (pushed, or through the status list), scopes. */
  verify(token: string, options?: { scopes?: string[] }): Promise<Agent>;
  /** Online: GET /v1/verify/:token. */
  verifyOnline(token: string, options?: { key?: string }): Promise<Agent>;
  /** A Security Event Token the service pushed: a revocation revokes at once. */
  handleSet(setJwt: string): Promise<void>;
}
