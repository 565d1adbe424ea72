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

/** The person a delegated token acts for, as the identity provider that vouched for them
 * names them. */
export interface Subject {
  /** The person's `sub` at the provider. */
  sub: string;
  /** The provider's issuer URL. */
  iss: string;
  /** RFC 9493: `{format: "iss_sub", iss, sub}`. */
  subId: { format: "iss_sub"; iss: string; sub: string };
}

/** One agent of a delegated token's chain. */
export interface Actor {
  agentId: string;
  /** The name its organization proved. */
  issuer: string;
}

export interface Agent {
  /** The agent: the one acting, for a delegated token. */
  agentId: string;
  /** The name the agent's organization proved (an access token's `issuer_domain`). */
  issuer: string;
  /** The scopes granted (an access token's `scope`, split). */
  scopes: string[];
  issuedAt: Date;
  expiresAt: Date;
  /** False for a test-mode token (accepted only with `allowTest`). */
  livemode: boolean;
  /** The resources an access token is for (its `aud`); empty for an agent token. */
  audience: string[];
  /** An access token's OAuth client: the agent itself. Null for an agent token. */
  clientId: string | null;
  /** The token's claims, as verified (the online answer's members for `verifyOnline`). */
  claims: Record<string, unknown>;
  /** The person a delegated token acts for; null for a token that acts for nobody. */
  subject: Subject | null;
  /** A delegated token's chain of agents, the one acting first. Offline, only the first one's
   * revocation is seen (its status list, or a pushed event for any of them); `verifyOnline`
   * sees every link. */
  actors: Actor[];
}

export interface VerifierOptions {
  /** The agentid service, e.g. https://id.example.com (its public URL: the `iss` of its SETs).
   * Keys and lists come only from here; no redirect is followed. Not an https:// URL (an
   * http:// one without `allowLocal`): TypeError. */
  baseUrl: string;
  /** Accepted `iss` values of tokens (and `sub_id.iss` of SETs); any when absent. */
  issuers?: string[];
  /** Seconds of tolerance on `exp` and `iat` (30), a status list's `exp` too. */
  leeway?: number;
  /** Seconds past its `ttl` a status list that cannot be refetched is still used (300), never
   * past its `exp`; and past its freshness the key set, and a signature directory. */
  listGrace?: number;
  /** Judge a token on signature and claims alone when its list cannot be had (false). */
  failOpen?: boolean;
  /** Seconds between refetches of the keys for unknown kids (60). */
  kidRefetchInterval?: number;
  /** Seconds a request may take, all of it: name lookup, connect, TLS handshake and its
   * answer (at most 1 MiB) (5). */
  timeout?: number;
  /** For development and tests: plain http and loopback/private addresses (false). Without it
   * every URL fetched (the base URL's keys, lists and online verify, signature directories)
   * must be https://, and its host is looked up once: if it resolves to no address, or any of
   * its addresses (or the IP literal itself) is not globally reachable (loopback, private,
   * link-local, shared, documentation, reserved, … as the agentid service judges them), no
   * connection is made and the fetch fails (UNAVAILABLE, "not globally reachable"). The
   * connection then goes to a checked address, TLS checking the certificate for the host name. */
  allowLocal?: boolean;
  /** Accept test-mode tokens (`livemode: false`, issued with an sk_test_ key): false. */
  allowTest?: boolean;
  /** The `aud` of this receiver's Shared Signals stream: what the stream was created with, by
   * default the push endpoint's origin (push) or the stream id (poll). When set, `handleSet`
   * refuses a SET whose `aud` does not hold it. */
  setAudience?: string;
  /** Seconds a DPoP proof's `iat` may be from now, either way (60). */
  dpopMaxSkew?: number;
  /** This receiver's resource identifier (a URI, or several). When set, a token is accepted
   * only when its `aud` names one of them: an agent token (which names none) and an access
   * token for another receiver are TOKEN_INVALID. Not a URI or a non-empty list: TypeError. */
  audience?: string | string[];
  /** Told of every refusal of `verify`, `verifyDpop` and `verifyOnline`, with its code and
   * reason; a hook that throws is ignored. */
  onRefusal?: (code: ErrorCode, reason: string) => void;
  /** Told of the outcome of every `verify`, `verifyDpop` and `verifyOnline`: the place to count
   * them (with prom-client, `(outcome) => verifications.inc({ outcome })`). A hook that throws
   * is ignored. */
  onVerification?: (outcome: Outcome) => void;
  /** Told of every fetch of the key set or a status list and what it came to. A hook that
   * throws is ignored. */
  onFetch?: (document: "jwks" | "status_list" | "directory", result: FetchResult) => void;
}

/** What `verifyRequest` found of a signed request. */
export interface SignedRequest {
  /** The directory the key came from. */
  signatureAgent: string;
  /** The key's RFC 7638 thumbprint. */
  keyid: string;
  tag: "web-bot-auth";
  created: Date;
  expires: Date;
  /** The agentid issuer domain whose directory it is; null for a trusted third party's. */
  issuer: string | null;
}

export class Verifier {
  constructor(options: VerifierOptions);
  /** The service's URL, without a trailing slash: the `iss` of its access tokens. */
  readonly baseUrl: string;
  /** The receiver's `audience`, or null when it named none. */
  readonly audience: string[] | null;
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
  /** A request an agent signed (Web Bot Auth, RFC 9421), offline: the signature tagged
   * web-bot-auth, covering @authority (or @target-uri) and Signature-Agent, in its time (at
   * most 24 h), by a key of the directory Signature-Agent names (this service's, or one of
   * `trustedSignatureAgents`, an array of URLs, a string being a TypeError; fetched and
   * cached as it says), its nonce a new string (PROOF_REPLAYED after; PROOF_INVALID for a
   * token or byte sequence). A directory's fetch that fails, or brings no key set, is
   * UNAVAILABLE (a held one serves within `listGrace`), and with none held is not tried again
   * for 1 s, doubling per failure up to 30 s. A revoked agent's key leaves its directory at
   * once: seen at the next fetch, or at once after `handleSet` of the revocation's event (it
   * drops the issuer's directory). */
  verifyRequest(
    request: Request | { method?: string; url: string; headers: Record<string, string> },
    options?: { trustedSignatureAgents?: string[] },
  ): Promise<SignedRequest>;
  /** A Security Event Token the service pushed (or a poll gave): refused (TOKEN_INVALID) unless
   * its `iss` is `baseUrl`, its `aud` holds `setAudience` (when set), its `jti` is not one of
   * the last 10,000 taken, and its subject's `sub_id.iss` is in `issuers` (when set). A
   * revocation revokes at once, and drops what is held of its issuer's signature directory. A
   * person's revocation refuses their delegated tokens issued until it; past 10,000 people
   * those revoked over an hour ago go first, then the earliest, and every delegated token
   * issued until it is refused. */
  handleSet(setJwt: string): Promise<void>;
}

/** What a receiver tells OAuth clients about itself (RFC 9728, protected resource metadata). */
export class ResourceMetadata {
  /** `resource`: this receiver's identifier, an http(s) URI without a fragment (else TypeError). */
  constructor(verifier: Verifier, resource: string, options?: { scopesSupported?: string[]; resourceName?: string });
  readonly resource: string;
  /** Where it is served, on the resource's origin: /.well-known/oauth-protected-resource + its path. */
  readonly path: string;
  /** Its URL, as a 401's challenge names it (`resource_metadata="…"`). */
  readonly url: string;
  /** The JSON document: resource, authorization_servers (the verifier's service),
   * scopes_supported, bearer_methods_supported, dpop_signing_alg_values_supported. */
  document(): Record<string, unknown>;
}
