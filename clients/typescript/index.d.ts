/** TOKEN_* and INSUFFICIENT_SCOPE: the token's fault. UNAVAILABLE: the service's (unreachable,
 * or an answer that is not what it should be). MISCONFIGURED: the receiver's own (the service
 * refused its API key). */
export type ErrorCode =
  | "TOKEN_INVALID"
  | "TOKEN_EXPIRED"
  | "TOKEN_REVOKED"
  | "INSUFFICIENT_SCOPE"
  | "UNAVAILABLE"
  | "MISCONFIGURED"
  | "PROOF_INVALID"
  | "PROOF_REPLAYED";

/** What a verification came to: "valid", or the code of its refusal. */
export type Outcome = "valid" | ErrorCode;

/** What a fetch of the key set ("jwks") or a status list ("status_list") came to: a new body,
 * a revalidation (304), or a failure (no answer in time, another status, an oversized body). */
export type FetchResult = "fetched" | "not_modified" | "failed";

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
  /** The agentid service, e.g. https://id.example.com (its public URL: the `iss` of its SETs).
   * Keys and lists come only from here; no redirect is followed. Not an http(s) URL: TypeError. */
  baseUrl: string;
  /** Accepted `iss` values of tokens (and `sub_id.iss` of SETs); any when absent. */
  issuers?: string[];
  /** Seconds of tolerance on `exp` and `iat` (30). */
  leeway?: number;
  /** Seconds past its `ttl` a status list that cannot be refetched is still used (300). */
  listGrace?: number;
  /** Judge a token on signature and claims alone when its list cannot be had (false). */
  failOpen?: boolean;
  /** Seconds between refetches of the keys for unknown kids (60). */
  kidRefetchInterval?: number;
  /** Seconds a request may take, its answer (at most 1 MiB) included (5). */
  timeout?: number;
  /** Accept test-mode tokens (`livemode: false`, issued with an sk_test_ key): false. */
  allowTest?: boolean;
  /** The `aud` of this receiver's Shared Signals stream: what the stream was created with, by
   * default the push endpoint's origin (push) or the stream id (poll). When set, `handleSet`
   * refuses a SET whose `aud` does not hold it. */
  setAudience?: string;
  /** Seconds a DPoP proof's `iat` may be from now, either way (60). */
  dpopMaxSkew?: number;
  /** Told of every refusal of `verify`, `verifyDpop` and `verifyOnline`, with its code and
   * reason; a hook that throws is ignored. */
  onRefusal?: (code: ErrorCode, reason: string) => void;
  /** Told of the outcome of every `verify`, `verifyDpop` and `verifyOnline`: the place to count
   * them (with prom-client, `(outcome) => verifications.inc({ outcome })`). A hook that throws
   * is ignored. */
  onVerification?: (outcome: Outcome) => void;
  /** Told of every fetch of the key set or a status list and what it came to. A hook that
   * throws is ignored. */
  onFetch?: (document: "jwks" | "status_list", result: FetchResult) => void;
}

export class Verifier {
  constructor(options: VerifierOptions);
  /** Offline: signature, claims, revocation (pushed, or through the status list), issuer,
   * mode, scopes. A token over 4096 bytes is TOKEN_INVALID unparsed; a token bound to a key
   * (`cnf`) is PROOF_INVALID: it needs `verifyDpop`. */
  verify(token: string, options?: { scopes?: string[] }): Promise<Agent>;
  /** A token bound to a key, with the DPoP proof (RFC 9449) that came with it for a `method`
   * request to `url` (as the agent addressed it): the token as `verify` checks it, then the
   * proof (signature by the token's key, typ, alg, htm, htu, ath, iat within `dpopMaxSkew`),
   * which passes once (PROOF_REPLAYED after). A bearer token or a missing proof:
   * PROOF_INVALID. */
  verifyDpop(token: string, proof: string | undefined, method: string, url: string, options?: { scopes?: string[] }): Promise<Agent>;
  /** Online: GET /v1/verify/:token, then the issuer, mode and scope checks of `verify`. A
   * refused `key` is MISCONFIGURED. */
  verifyOnline(token: string, options?: { key?: string; scopes?: string[] }): Promise<Agent>;
  /** A Security Event Token the service pushed (or a poll gave): refused (TOKEN_INVALID) unless
   * its `iss` is `baseUrl`, its `aud` holds `setAudience` (when set), its `jti` is not one of
   * the last 10,000 taken, and its subject's `sub_id.iss` is in `issuers` (when set). A
   * revocation revokes at once. */
  handleSet(setJwt: string): Promise<void>;
}
