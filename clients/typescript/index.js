// Verify agentid tokens: offline against the service's JWKS, with revocation seen through
// Token Status Lists and pushed Shared Signals events, or online. Agent tokens (minted by
// the agent's organization) and OAuth access tokens (RFC 9068, `typ` at+jwt, which an agent
// gets itself for the resources in their `aud`) verify alike; a receiver that names its
// `audience` accepts only access tokens for it. Keys and lists come only from `baseUrl`'s
// origin and are cached for as long as the service says (a day at most), so a warm
// verification makes no network call. Every connection goes through `outbound.js`: https
// only, to globally reachable addresses only (unless `allowLocal`, for development and
// tests), no redirect followed, no answer read past 1 MiB, the whole request under
// `timeout`; and every failure is a `VerificationError`. A token is parsed once (`jws.js`) and
// its signature checked by `node:crypto` where the runtime has it, by WebCrypto (keys imported
// by jose) elsewhere; it runs on Node >= 20 and on runtimes with `node:http`, `node:https` and
// `node:dns` (Deno, Bun).
import { parse, proofKey, publicKey, sha256, verified } from "./jws.js";
import { directoryKeys, verifyRequest } from "./requests.js";
import { get } from "./outbound.js";

const SESSION_REVOKED = "https://schemas.openid.net/secevent/caep/event-type/session-revoked";
/** The header `typ` of an OAuth access token (RFC 9068). */
const ACCESS_TOKEN_TYP = "at+jwt";
/** The longest token accepted (the service issues none longer); a longer one is not parsed. */
const MAX_TOKEN_BYTES = 4096;
/** The most read of any answer of the service, and of an inflated status list. */
const MAX_BODY_BYTES = 1 << 20;
/** The longest SET taken (the service's are under 4 KiB); a longer one is not parsed. */
const MAX_SET_BYTES = 16384;
const MAX_LIST_BYTES = 16 << 20;
/** The longest a fetched document is held fresh, whatever its `max-age` says: a day. */
const MAX_CACHE_SECONDS = 86_400;
/** How many SET `jti`s are remembered to refuse a replay (and people's revocations held). */
const SEEN_SETS = 10_000;
/** The longest a delegated token lives (s): the service's `--access-token-seconds` at most. */
const MAX_DELEGATED_LIFETIME = 3600;
/** The longest DPoP proof read, and how many proofs are remembered to refuse a replay. */
const MAX_PROOF_BYTES = 4096;
const SEEN_PROOFS = 100_000;
/** The end of the NumericDates taken (s, exclusive): what a float holds exactly. */
const MAX_TIME = 2 ** 53;

/** Whether `n` is a NumericDate (RFC 7519 §2) as taken here: a JSON number, finite, from 0 up
 * to MAX_TIME (a fraction compared as is). JSON.parse reads 1e999 as Infinity, which no time
 * comes past: it is none. */
const numericDate = (n) => typeof n === "number" && Number.isFinite(n) && n >= 0 && n < MAX_TIME;
/** How many signature directories are held (past that, the one held longest goes): a
 * verifier without `issuers` takes any issuer's, which a caller names. */
const MAX_DIRECTORIES = 1_000;
/** The DPoP proof algorithms, with the key type and curve each needs. */
const PROOF_ALGS = { EdDSA: ["OKP", "Ed25519"], Ed25519: ["OKP", "Ed25519"], ES256: ["EC", "P-256"] };
/** The encodings of Ed25519 points of small order, the sign bit aside (libsodium's list): a
 * key of one verifies signatures nobody made (R the identity, S 0), so none is taken. */
const SMALL_ORDER = [
  "00".repeat(32),
  "01" + "00".repeat(31),
  "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05",
  "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a",
  "ec" + "ff".repeat(30) + "7f",
  "ed" + "ff".repeat(30) + "7f",
  "ee" + "ff".repeat(30) + "7f",
].map((h) => Uint8Array.from(h.match(/../g), (b) => parseInt(b, 16)));

/** Whether `x` (32 bytes) encodes an Ed25519 point of small order. */
function smallOrder(x) {
  return x.length === 32 && SMALL_ORDER.some((s) => s.every((b, i) => (i === 31 ? x[i] & 0x7f : x[i]) === b));
}

/** A clock for the ages of what is held (ms), which no step of the wall clock moves: the wall
 * clock (`Date.now`) is for the times a token or a list names. */
const monotonic = () => performance.now();

/** Members that make a JWK private (or symmetric). */
const PRIVATE_MEMBERS = ["d", "p", "q", "dp", "dq", "qi", "oth", "k"];

export class VerificationError extends Error {
  /** @param {string} code @param {string} [message] */
  constructor(code, message) {
    super(message || code);
    this.name = "VerificationError";
    this.code = code;
  }
}

const fail = (code, message) => {
  throw new VerificationError(code, message);
};

/** The `max-age` of a `Cache-Control` value, at most MAX_CACHE_SECONDS; `fallback` without one. */
function maxAge(cacheControl, fallback) {
  for (const part of (cacheControl || "").split(",")) {
    const [name, value] = part.trim().split("=");
    if (name.toLowerCase() === "max-age" && /^\d+$/.test(value || "")) return Math.min(Number(value), MAX_CACHE_SECONDS);
  }
  return fallback;
}

/** The bytes of `stream`, or an Error past `limit` of them. */
async function readAtMost(stream, limit) {
  const chunks = [];
  let size = 0;
  const reader = stream.getReader();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    size += value.length;
    if (size > limit) {
      reader.cancel().catch(() => {});
      throw new Error(`over ${limit} bytes`);
    }
    chunks.push(value);
  }
  const bytes = new Uint8Array(size);
  let at = 0;
  for (const chunk of chunks) {
    bytes.set(chunk, at);
    at += chunk.length;
  }
  return bytes;
}

/** `token` if it is a string of at most `limit` bytes: a longer one is not parsed. */
function sized(token, limit = MAX_TOKEN_BYTES, what = "token") {
  if (typeof token !== "string" || token.length > limit
      || (token.length > limit / 3 && new TextEncoder().encode(token).length > limit)) {
    fail("TOKEN_INVALID", `not a ${what} of at most ${limit} bytes`);
  }
  return token;
}

/** What a reason must not carry raw: controls (C0, DEL, C1), line and paragraph separators
 * and bidirectional overrides, which a token's or a proof's fields could plant in a log or a
 * terminal. */
const UNSAFE = /[\u0000-\u001f\u007f-\u009f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]/g;

/** `text` with every unsafe character written as `\uXXXX`. */
export function printable(text) {
  return String(text).replace(UNSAFE, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`);
}

/** Calls `hook` (when given) with `args`; a hook that throws changes nothing. */
function quietly(hook, ...args) {
  if (!hook) return;
  try {
    hook(...args);
  } catch {
    // a hook's failure must not change the answer
  }
}

function b64url(text) {
  const b64 = text.replace(/-/g, "+").replace(/_/g, "/") + "=".repeat((4 - (text.length % 4)) % 4);
  return Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
}

/** Milliseconds before a URL that failed `failures` times in a row is fetched again: 1 s,
 * doubling per failure up to 30 s. */
const backoff = (failures) => Math.min(2 ** Math.min(failures - 1, 5), 30) * 1000;

/** Whether a Verifier without issuers was built already (the warning says so once a process). */
let warnedWithoutIssuers = false;

function warnWithoutIssuers(baseUrl) {
  if (warnedWithoutIssuers) return;
  warnedWithoutIssuers = true;
  const message = `a Verifier without issuers accepts the agents of every organization of ${baseUrl}: name the issuer domains you trust (issuers: [...])`;
  if (globalThis.process?.emitWarning) globalThis.process.emitWarning(message, { code: "AGENTID_NO_ISSUERS" });
  else console.warn(message);
}

export class Verifier {
  /**
   * @param {{baseUrl: string, issuers?: string[], leeway?: number, listGrace?: number,
   *          failOpen?: boolean, kidRefetchInterval?: number, timeout?: number,
   *          allowTest?: boolean, setAudience?: string, dpopMaxSkew?: number, audience?: string | string[],
   *          allowLocal?: boolean, onRefusal?: Function, onVerification?: Function, onFetch?: Function}} options
   */
  constructor({ baseUrl, issuers, leeway = 30, listGrace = 300, failOpen = false, kidRefetchInterval = 60, timeout = 5, allowTest = false, setAudience, dpopMaxSkew = 60, audience, allowLocal = false, onRefusal, onVerification, onFetch }) {
    if (!/^https?:\/\/[^/]/i.test(baseUrl ?? "")) throw new TypeError(`baseUrl ${baseUrl} is not an http(s) URL`);
    if (/^[a-z]+:\/\/[^/?#]*@/i.test(baseUrl)) throw new TypeError(`baseUrl ${baseUrl} carries credentials`);
    if (allowLocal !== true && !/^https:\/\//i.test(baseUrl)) {
      throw new TypeError(`baseUrl ${baseUrl} is not https:// (allowLocal for development: plain http and loopback/private addresses)`);
    }
    if (!(timeout > 0 && Number.isFinite(timeout))) throw new TypeError("timeout must be a positive number of seconds");
    if (audience !== undefined) {
      const list = [audience].flat();
      if (!list.length || !list.every((a) => typeof a === "string" && a)) throw new TypeError("audience must be a URI or a list of URIs");
      /** This receiver's resource identifiers: a token must name one of them in its `aud`. */
      this.audience = list;
    } else {
      this.audience = null;
    }
    this.allowTest = allowTest;
    /** Whether plain http and addresses that are not globally reachable may be connected to
     * (development and tests). */
    this.allowLocal = allowLocal === true;
    this.baseUrl = baseUrl.replace(/\/+$/, "");
    this.issuers = issuers ? new Set(issuers) : null;
    if (!this.issuers) warnWithoutIssuers(this.baseUrl);
    this.leeway = leeway;
    this.listGrace = listGrace;
    this.failOpen = failOpen;
    this.kidRefetchInterval = kidRefetchInterval;
    this.timeout = timeout;
    this.setAudience = setAudience;
    this.docs = new Map(); // url -> {body, etag, freshUntil, fetchedAt, epoch, parsed} (monotonic ms); a 304 refreshes it in place
    this.inflight = new Map(); // url -> Promise of a fetch
    this.refreshing = new Set(); // URLs a background refresh is fetching
    this.retry = new Map(); // url -> {at, failures}: no background refresh before `at` (monotonic ms)
    this.keys = new Map(); // kid -> key
    this.keysDoc = null; // the document `keys` was read from
    this.lastKidFetch = -Infinity;
    this.lists = new Map(); // uri -> {bits, ttl, exp, doc}
    this.revoked = new Set();
    /** The directory URLs held, the one held longest first. */
    this.directoryUrls = new Set();
    this.maxDirectories = MAX_DIRECTORIES;
    /** Directory URL -> {at, failures, message} while none usable is held and its last fetch
     * failed: not fetched again before `at` (monotonic ms); at most `maxDirectories`. */
    this.failedDirectories = new Map();
    /** Directory URL -> how many times a pushed revocation dropped it: a document asked for
     * before the last drop may predate the revocation, and is fetched again. */
    this.dropped = new Map();
    /** Signed requests' nonces, by `keyid`, each until its signature expires. */
    this.nonces = new Replays(SEEN_PROOFS);
    /** `provider + "\n" + sub` -> when the organization revoked the person (Unix s), from
     * pushed events; a heap of [at, key], earliest first (cleaned as it is read); and the
     * latest revocation forgotten for want of room: every person's token from then or before
     * is refused. */
    this.revokedSubjects = new Map();
    this.revokedByTime = new Heap();
    this.subjectsFloor = -Infinity;
    this.seenSets = new Set(); // the last SEEN_SETS jtis taken, oldest first
    this.dpopMaxSkew = dpopMaxSkew;
    this.proofs = new Replays(SEEN_PROOFS); // the proofs taken, by key thumbprint and jti
    this.onFetch = onFetch;
    if (onRefusal || onVerification) {
      // Every outcome of the three checks is told to the hooks; a hook that throws is ignored,
      // so that it changes no answer.
      for (const name of ["verify", "verifyDpop", "verifyOnline"]) {
        const check = this[name].bind(this);
        this[name] = async (...args) => {
          let agent;
          try {
            agent = await check(...args);
          } catch (e) {
            if (e instanceof VerificationError) {
              quietly(onVerification, e.code);
              quietly(onRefusal, e.code, printable(e.message));
            }
            throw e;
          }
          quietly(onVerification, "valid");
          return agent;
        };
      }
    }
  }

  /** Checks a request an agent signed (Web Bot Auth, RFC 9421) offline: its signature tagged
   * `web-bot-auth`, covering `@authority` (or `@target-uri`) and `Signature-Agent`, in its time
   * (at most 24 h), by a key of the directory `Signature-Agent` names (this service's
   * `/v1/directories/<issuer>`, or one of `trustedSignatureAgents`), its nonce never seen
   * before (PROOF_REPLAYED). `request`: a fetch `Request`, or `{method, url, headers}` with
   * the URL as the agent addressed it. Resolves to the signature's facts (`issuer` the agentid
   * name, null for a trusted third party), or rejects with a `VerificationError`. */
  async verifyRequest(request, options = {}) {
    return verifyRequest(this, request, options, fail);
  }

  /** The Ed25519 keys of the directory at `url`, by thumbprint, read once when it was fetched:
   * cached as it says, used past that for `listGrace` seconds when it cannot be had (its fetch
   * fails, or brings no key set), then UNAVAILABLE; with none usable held, a failed fetch is
   * UNAVAILABLE without another until its retry time (1 s, doubling per failure up to 30 s). */
  async directory(url) {
    for (let tries = 0; tries < 3; tries++) {
      const [doc, keys] = await this.directoryOnce(url);
      if ((doc.epoch ?? 0) === (this.dropped.get(url) ?? 0)) return keys;
      // Asked for before a pushed revocation dropped it: it may predate the revocation.
      if (this.docs.get(url) === doc) this.docs.delete(url);
    }
    fail("UNAVAILABLE", `${url}: revocations keep coming while it is fetched`);
  }

  /** The directory at `url` and its keys (read when it was fetched). */
  async directoryOnce(url) {
    const held = this.docs.get(url);
    const now = monotonic();
    const usable = held && held.freshUntil + this.listGrace * 1000 >= now;
    const failed = this.failedDirectories.get(url);
    let doc;
    if (usable && held.freshUntil <= now && (this.retry.get(url)?.at ?? 0) > now) {
      // Stale, and the service failed lately: the held one serves without waiting for it.
      doc = held;
    } else if (!usable && failed && failed.at > now) {
      // None usable held, and its last fetch failed: its failure answers until the retry.
      fail("UNAVAILABLE", failed.message);
    } else {
      try {
        doc = await this.fetchDoc(url, "directory", "application/http-message-signatures-directory+json", -Infinity, true, (body) => readDirectory(url, body));
        this.retry.delete(url);
        this.failedDirectories.delete(url);
      } catch (e) {
        if (!usable) {
          this.directoryFailed(url, e.message);
          throw e;
        }
        this.failedLately(url);
        doc = held;
      }
    }
    this.directoryUrls.delete(url);
    this.directoryUrls.add(url);
    for (const old of this.directoryUrls) {
      if (this.directoryUrls.size <= this.maxDirectories) break;
      this.directoryUrls.delete(old);
      this.docs.delete(old);
      this.retry.delete(old);
    }
    // (Read now if the same URL was fetched as another document: a receiver trusting its key
    // set's URL.)
    return [doc, doc.parsed instanceof Map ? doc.parsed : await readDirectory(url, doc.body)];
  }

  /** Remembers that fetching `url` failed with `message`, none usable held: not fetched again
   * before 1 s, doubling per failure up to 30 s (callers that waited for the same fetch count
   * once). Past `maxDirectories` URLs remembered, those whose retry time passed go, then the
   * one retried soonest. */
  directoryFailed(url, message) {
    const now = monotonic();
    const last = this.failedDirectories.get(url);
    if (last && last.at > now) return; // a caller that waited for this fetch
    this.failedDirectories.delete(url);
    const most = Math.max(1, this.maxDirectories);
    if (this.failedDirectories.size >= most) {
      for (const [u, f] of this.failedDirectories) if (f.at <= now) this.failedDirectories.delete(u);
    }
    while (this.failedDirectories.size >= most) {
      let soonest;
      for (const [u, f] of this.failedDirectories) if (!soonest || f.at < soonest[1].at) soonest = [u, f];
      this.failedDirectories.delete(soonest[0]);
    }
    const failures = (last?.failures ?? 0) + 1;
    this.failedDirectories.set(url, { at: now + backoff(failures), failures, message });
  }

  /** Whether a signature's nonce is new (remembered until the signature expires). */
  nonceOnce(keyid, nonce, expires) {
    return this.nonces.admit(keyid, nonce, expires, Date.now() / 1000) === null;
  }

  /** GETs `url` within the timeout (lookup, connect and TLS included), no redirect; its
   * status, headers and (for a 200) body, of at most MAX_BODY_BYTES. Unless `allowLocal`, a
   * URL that is not https:// or a host not globally reachable is a failed fetch. */
  async send(url, headers) {
    try {
      return await get(url, headers, { timeoutMs: this.timeout * 1000, allowLocal: this.allowLocal, limit: MAX_BODY_BYTES });
    } catch (e) {
      fail("UNAVAILABLE", `${url}: ${e.cause?.message || e.message}`);
    }
  }

  /** GETs `url` (revalidating what is held, unless `revalidate` is false), one fetch per URL
   * (and kind) at a time, told to `onFetch` as a fetch of `document` ("jwks" or "status_list").
   * A new body is `read` (when given) before it is held, its reading kept with it (`parsed`)
   * for every caller: a body it refuses (UNAVAILABLE) is a failed fetch, never held. */
  async fetchDoc(url, document, accept, fresherThan = -Infinity, revalidate = true, read = undefined) {
    const held = this.docs.get(url);
    if (held && held.freshUntil > monotonic() && held.fetchedAt > fresherThan) return held;
    // A fetch that must bring a body joins no revalidation, which a 304 could answer.
    const key = revalidate ? url : `${url}\n200`;
    let pending = this.inflight.get(key);
    if (!pending) {
      pending = (async () => {
        const epoch = this.dropped.get(url) ?? 0;
        const headers = { accept };
        if (revalidate && held?.etag) headers["if-none-match"] = held.etag;
        let res, parsed;
        try {
          res = await this.send(url, headers);
          if (res.status !== 200 && !(res.status === 304 && headers["if-none-match"])) fail("UNAVAILABLE", `${url}: ${res.status}`);
          if (res.status === 200 && read) parsed = await read(res.body);
        } catch (e) {
          quietly(this.onFetch, document, "failed");
          throw e;
        }
        quietly(this.onFetch, document, res.status === 304 ? "not_modified" : "fetched");
        const now = monotonic();
        const freshUntil = now + maxAge(res.headers.get("cache-control"), 60) * 1000;
        if (res.status === 304) {
          // The same body: whoever read it keeps what they read.
          Object.assign(held, { etag: res.headers.get("etag") || held.etag, freshUntil, fetchedAt: now, epoch });
          return held;
        }
        // A new body, even without an ETag (a proxy may strip it): it is read anew.
        const doc = { body: res.body, etag: res.headers.get("etag") || undefined, freshUntil, fetchedAt: now, epoch, parsed };
        this.docs.set(url, doc);
        return doc;
      })().finally(() => this.inflight.delete(key));
      this.inflight.set(key, pending);
    }
    return pending;
  }

  /** Runs `refresh` behind the caller, unless one runs for `url` already or `url` failed
   * lately (then not before 1 s, doubling per failure up to 30 s): a request holding a
   * usable answer never waits for the network. */
  refreshLater(url, refresh) {
    if (this.refreshing.has(url) || (this.retry.get(url)?.at ?? 0) > monotonic()) return;
    this.refreshing.add(url);
    refresh()
      .then(
        () => this.retry.delete(url),
        () => this.failedLately(url),
      )
      .finally(() => this.refreshing.delete(url));
  }

  /** Notes a failed fetch of `url`: not again before 1 s, doubling per failure up to 30 s. */
  failedLately(url) {
    const failures = (this.retry.get(url)?.failures ?? 0) + 1;
    this.retry.set(url, { at: monotonic() + backoff(failures), failures });
  }

  /** Fetches the JWKS (unless what is held is fresh and fetched after `fresherThan`) and reads
   * it when it is new; UNAVAILABLE when it cannot be had or is unusable, and then the keys
   * last read stay. */
  async loadKeys(url, fresherThan) {
    const doc = await this.fetchDoc(url, "jwks", "application/json", fresherThan);
    if (doc !== this.keysDoc) {
      this.keys = await readJwks(doc.body);
      this.keysDoc = doc;
    }
  }

  /** The key of `kid`: from the cached JWKS, refreshed behind when stale, or fetched when the
   * kid is unknown (at once when no JWKS is held, else at most once per `kidRefetchInterval`,
   * tried or not: a stream of made-up kids fetches no more while the service is down). While
   * the JWKS cannot be had (or is unusable), the keys last read serve for `listGrace` seconds
   * past their freshness, as a status list does; after that a check waits for a fetch, and
   * without one is UNAVAILABLE. */
  async key(kid) {
    const url = `${this.baseUrl}/.well-known/jwks.json`;
    // The document the keys in use were read from (a 304 refreshes it in place).
    const held = this.keysDoc;
    const now = monotonic();
    const stale = !held || held.freshUntil <= now;
    if (!held || held.freshUntil + this.listGrace * 1000 < now) {
      // No keys usable: the check waits for the fetch, and fails with it.
      try {
        await this.loadKeys(url, -Infinity);
      } finally {
        this.lastKidFetch = monotonic();
      }
    } else if (!this.keys.has(kid) && now - this.lastKidFetch >= this.kidRefetchInterval * 1000) {
      // Nothing held answers for this kid: it waits for the fetch.
      try {
        await this.loadKeys(url, now - 1);
      } catch {
        // The keys last read answer.
      } finally {
        this.lastKidFetch = monotonic();
      }
    } else if (stale) {
      // The keys held serve while one refresh runs behind; a failed one is tried again later.
      this.refreshLater(url, () => this.loadKeys(url, -Infinity));
    }
    const key = this.keys.get(kid);
    if (key) return key;
    if (!this.keysDoc) fail("UNAVAILABLE", "no usable JWKS read yet");
    fail("TOKEN_INVALID", `no key ${kid} in the service's JWKS`);
  }

  /** Checks a JWS's header (EdDSA, a kid, `typ`) and signature; its claims. */
  async decode(jws, typ, required) {
    return (await this.decodeTyped(jws, [typ], required)).claims;
  }

  /** Checks a JWS's header (EdDSA, a kid, a `typ` of `typs`; absent means the first) and
   * signature; its `typ` and claims. */
  async decodeTyped(jws, typs, required) {
    let parsed;
    try {
      parsed = parse(jws);
    } catch (e) {
      fail("TOKEN_INVALID", `malformed: ${e.message}`);
    }
    const { header, claims, signingInput, signature } = parsed;
    if (header.alg !== "EdDSA" || typeof header.kid !== "string") fail("TOKEN_INVALID", "only alg EdDSA with a kid");
    // Absent means the first; any other value (null too) must be one of them.
    let typ = header.typ === undefined ? typs[0] : header.typ;
    if (typ === "application/at+jwt") typ = ACCESS_TOKEN_TYP;
    if (!typs.includes(typ)) fail("TOKEN_INVALID", `typ ${header.typ} is not one of ${typs.join(", ")}`);
    const key = await this.key(header.kid);
    let checks = verified(key, "EdDSA", signingInput, signature);
    if (typeof checks !== "boolean") checks = await checks;
    if (!checks) fail("TOKEN_INVALID", "the signature does not check");
    for (const name of required) if (!(name in claims)) fail("TOKEN_INVALID", `the ${name} claim is missing`);
    const now = Date.now() / 1000;
    for (const name of ["exp", "iat", "nbf"]) {
      if (name in claims && !numericDate(claims[name])) fail("TOKEN_INVALID", `the ${name} claim is not a NumericDate (a number from 0 to 2^53)`);
    }
    if ("exp" in claims && claims.exp <= now - this.leeway) fail("TOKEN_EXPIRED", "the token has expired");
    if ("nbf" in claims && claims.nbf > now + this.leeway) fail("TOKEN_INVALID", "the token is not valid yet (nbf)");
    if ("iat" in claims && claims.iat > now + this.leeway) fail("TOKEN_INVALID", "issued in the future");
    return { typ, claims };
  }

  /** The bits, `ttl` and `exp` of the list in `body`; UNAVAILABLE when it is not the signed
   * list at `uri` (then the fetch that brought it failed: it is not held). */
  async readList(uri, body) {
    try {
      const claims = await this.decode(body, "statuslist+jwt", ["sub", "iat"]);
      if (claims.sub !== uri) throw new Error(`the list at ${uri} says it is ${claims.sub}`);
      const { bits, lst } = claims.status_list ?? {};
      if (bits !== 1 || typeof lst !== "string") throw new Error("status lists of one bit only");
      const inflated = new Blob([b64url(lst)]).stream().pipeThrough(new DecompressionStream("deflate"));
      const ttl = claims.ttl === undefined ? 60 : claims.ttl;
      if (!(typeof ttl === "number" && ttl > 0 && ttl < Infinity)) {
        throw new Error(`ttl ${JSON.stringify(claims.ttl)} is not a positive number of seconds`);
      }
      // decode checked exp (a finite number when present) against the clock.
      // A second at least (a ttl of a millisecond would be a fetch at every check).
      const held = Math.min(Math.max(ttl, 1), MAX_CACHE_SECONDS);
      return { bits: await readAtMost(inflated, MAX_LIST_BYTES), ttl: held, exp: claims.exp ?? Infinity };
    } catch (e) {
      fail("UNAVAILABLE", `the status list at ${uri} is unusable: ${e.message}`);
    }
  }

  /** Whether `list` is past its `exp` (with `leeway`, as a token's): its bits answer nothing. */
  expired(list) {
    return list.exp <= Date.now() / 1000 - this.leeway;
  }

  /** Fetches the list at `uri` anew (revalidating `held`) and reads it when new. A 304 for a
   * list past its exp is asked once more without If-None-Match; nothing current is UNAVAILABLE. */
  async loadList(uri, held) {
    const accept = "application/statuslist+jwt";
    const read = (body) => this.readList(uri, body);
    let doc = await this.fetchDoc(uri, "status_list", accept, held ? held.doc.fetchedAt : -Infinity, true, read);
    let current = await this.listIn(uri, doc);
    if (this.expired(current)) {
      doc = await this.fetchDoc(uri, "status_list", accept, doc.fetchedAt, false, read);
      current = await this.listIn(uri, doc);
      if (this.expired(current)) fail("UNAVAILABLE", `the status list at ${uri} has expired, and no newer one came`);
    }
    return current;
  }

  /** The list `doc` holds (read when it was fetched). */
  async listIn(uri, doc) {
    let current = this.lists.get(uri);
    if (current?.doc !== doc) {
      // (Read now if the same URL was fetched as another document.)
      const parsed = doc.parsed?.bits instanceof Uint8Array ? doc.parsed : await this.readList(uri, doc.body);
      current = { ...parsed, doc };
      this.lists.set(uri, current);
    }
    return current;
  }

  /** The status at `idx` of the list at `uri` (1: revoked); null when it cannot be had and
   * `failOpen` is set. */
  async status(uri, idx) {
    const prefix = `${this.baseUrl}/v1/status/`;
    if (!uri.startsWith(prefix) || /[/?#]/.test(uri.slice(prefix.length))) {
      fail("TOKEN_INVALID", `status list ${uri} is not one of ${this.baseUrl}`);
    }
    let held = this.lists.get(uri);
    // A list past its exp is no answer, however lately a 304 said it is unchanged.
    const usable = held && !this.expired(held);
    const age = held ? monotonic() - held.doc.fetchedAt : Infinity;
    if (usable && age >= held.ttl * 1000 && age <= (held.ttl + this.listGrace) * 1000) {
      // Stale but usable: it serves while one refresh runs behind.
      const stale = held;
      this.refreshLater(uri, () => this.loadList(uri, stale));
    } else if (!usable || age >= held.ttl * 1000) {
      try {
        held = await this.loadList(uri, held);
      } catch (e) {
        if (!(e instanceof VerificationError) || e.code !== "UNAVAILABLE") throw e;
        if (this.failOpen) return null;
        throw e;
      }
    }
    if (Math.floor(idx / 8) >= held.bits.length) fail("TOKEN_INVALID", `index ${idx} is outside the list`);
    return (held.bits[Math.floor(idx / 8)] >> idx % 8) & 1;
  }

  /** What offline and online verification both check: the issuer, the mode, a pushed
   * revocation. Whether the token is live. */
  admit(agentId, issuer, granted, livemode) {
    if (typeof issuer !== "string" || (this.issuers && !this.issuers.has(issuer))) {
      fail("TOKEN_INVALID", `issuer ${issuer} is not accepted`);
    }
    const live = this.livemode(livemode);
    if (typeof agentId !== "string" || !Array.isArray(granted) || !granted.every((s) => typeof s === "string")) {
      fail("TOKEN_INVALID", "malformed sub or scopes");
    }
    if (this.revoked.has(agentId)) fail("TOKEN_REVOKED", "revoked (a pushed event)");
    return live;
  }

  /** Verifies `token` offline: signature, claims, revocation and `scopes`. A token bound to a
   * key is PROOF_INVALID here: it needs `verifyDpop`. */
  async verify(token, { scopes = [] } = {}) {
    const { claims, agent } = await this.checked(token, scopes);
    if (claims.cnf !== undefined) fail("PROOF_INVALID", "the token is bound to a key: it passes only with a DPoP proof (verifyDpop)");
    return agent;
  }

  /** Verifies a token bound to a key with the DPoP proof that came with it, for a `method`
   * request to `url` (as the agent addressed it): the token as `verify` does, then the proof,
   * which passes once. */
  async verifyDpop(token, proof, method, url, { scopes = [] } = {}) {
    const { claims, agent } = await this.checked(token, scopes);
    const bound = claims.cnf?.jkt;
    if (typeof bound !== "string") fail("PROOF_INVALID", "the token is not bound to a key: send it as a Bearer token");
    if (typeof proof !== "string" || !proof) fail("PROOF_INVALID", "no DPoP proof came with a token bound to a key");
    const { jkt, jti, iat } = await checkProof(proof, method, url, token, Date.now() / 1000, this.dpopMaxSkew);
    if (jkt !== bound) fail("PROOF_INVALID", "DPoP proof signed by a key other than the one the token is bound to");
    this.admitProof(jkt, jti, iat);
    return agent;
  }

  /** Remembers a proof, or refuses it as a replay (see `Replays`). */
  admitProof(jkt, jti, iat) {
    const refused = this.proofs.admit(jkt, jti, iat, Date.now() / 1000 - this.dpopMaxSkew);
    if (typeof refused === "number") {
      fail("PROOF_REPLAYED", `DPoP proof made at or before ${refused}, when the memory of used proofs is full`);
    }
    if (refused === "seen") fail("PROOF_REPLAYED", "DPoP proof replayed: its jti was already used with this key");
    if (refused === "old") fail("PROOF_REPLAYED", "DPoP proof made before the proofs remembered: it might be a replay");
  }

  /** The claims and agent of `token`, checked offline (`verify`). */
  async checked(token, scopes) {
    const { typ, claims: c } = await this.decodeTyped(sized(token), ["JWT", ACCESS_TOKEN_TYP], ["exp", "iat", "sub", "iss"]);
    if (c.iat > Date.now() / 1000 + this.leeway) fail("TOKEN_INVALID", "issued in the future");
    const { issuer, granted, audience, clientId } = this.kind(typ === ACCESS_TOKEN_TYP, c);
    const { subject, actors } = clientId === null ? { subject: null, actors: [] } : delegation(c);
    const agentId = clientId ?? c.sub;
    const livemode = this.admit(agentId, issuer, granted, c.livemode);
    this.admitChain(subject, actors, c.iat);
    if (c.status !== undefined) {
      const ref = c.status?.status_list;
      if (!ref || !Number.isSafeInteger(ref.idx) || ref.idx < 0 || typeof ref.uri !== "string") {
        fail("TOKEN_INVALID", "malformed status claim");
      }
      if ((await this.status(ref.uri, ref.idx)) === 1) fail("TOKEN_REVOKED", "revoked (status list)");
    }
    scoped(granted, scopes);
    const agent = {
      agentId,
      issuer,
      scopes: granted,
      issuedAt: new Date(c.iat * 1000),
      expiresAt: new Date(c.exp * 1000),
      livemode,
      audience,
      clientId,
      claims: c,
      subject,
      actors,
    };
    return { claims: c, agent };
  }

  /** A delegated token's other links, as pushed events told of them: any agent of the chain
   * revoked, or its person revoked since the token was issued. */
  admitChain(subject, actors, iat) {
    if (subject === null) return;
    if (actors.some((a) => this.revoked.has(a.agentId))) {
      fail("TOKEN_REVOKED", "an agent of the token's chain is revoked (a pushed event)");
    }
    const at = this.revokedSubjects.get(`${subject.iss}\n${subject.sub}`);
    if (at !== undefined && iat <= at) fail("TOKEN_REVOKED", "the person's delegation was revoked (a pushed event)");
    if (iat <= this.subjectsFloor) {
      fail("TOKEN_REVOKED", "issued before the people's revocations forgotten for want of room (pushed events)");
    }
  }

  /** The issuer domain, scopes, audience and client of an agent token's or an access token's
   * claims (an access token is one of this service, for its agent); the audience held to
   * `audience`. */
  kind(access, c) {
    const audience = c.aud === undefined ? [] : [c.aud].flat();
    if (!audience.every((a) => typeof a === "string")) fail("TOKEN_INVALID", "malformed aud");
    let issuer, granted, clientId;
    if (access) {
      if (c.iss !== this.baseUrl) fail("TOKEN_INVALID", `an access token of ${c.iss}, not of ${this.baseUrl}`);
      const delegated = "act" in c || "sub_id" in c;
      if (typeof c.scope !== "string" || !c.scope || typeof c.client_id !== "string" || !audience.length
          || (!delegated && c.client_id !== c.sub) || (delegated && c.act?.sub !== c.client_id)) {
        fail("TOKEN_INVALID", "an access token needs aud, scope and client_id (its sub, or its act's)");
      }
      [issuer, granted, clientId] = [c.issuer_domain, c.scope.split(" "), c.client_id];
    } else {
      if ("client_id" in c || "scope" in c) fail("TOKEN_INVALID", "an agent token with an access token's claims");
      // Present, scopes are a list of strings (null, a string or an object are refused).
      [issuer, granted, clientId] = [c.iss, "scopes" in c ? c.scopes : [], null];
    }
    this.heldToAudience(audience);
    return { issuer, granted, audience, clientId };
  }

  /** Refuses a token whose audience names none of `audience` (when the receiver named one). */
  heldToAudience(audience) {
    if (this.audience && !audience.some((a) => this.audience.includes(a))) {
      fail("TOKEN_INVALID", `a token for ${audience.length ? audience.join(", ") : "no audience"}, not for ${this.audience.join(", ")}`);
    }
  }

  /** Whether a token is live; a test-mode one (`livemode: false`) is refused unless
   * `allowTest`. */
  livemode(value = true) {
    if (value === true) return true;
    if (value === false && this.allowTest) return false;
    if (value === false) fail("TOKEN_INVALID", "a test-mode token (livemode false); build the Verifier with allowTest: true to accept it");
    fail("TOKEN_INVALID", "malformed livemode claim");
  }

  /** Asks the service (`GET /v1/verify/:token`), which sees revocation at once; then checks
   * `issuers`, the mode and `scopes` as `verify` does. A refused `key` is MISCONFIGURED. */
  async verifyOnline(token, { key, scopes = [] } = {}) {
    const url = `${this.baseUrl}/v1/verify/${encodeURIComponent(sized(token))}`;
    const res = await this.send(url, { accept: "application/json", ...(key ? { authorization: `Bearer ${key}` } : {}) });
    if (res.status === 401 || res.status === 403) fail("MISCONFIGURED", `the service refused the API key (${res.status})`);
    if (res.status !== 200) fail("UNAVAILABLE", `verify answered ${res.status}`);
    let a, issuedAt, expiresAt;
    try {
      a = JSON.parse(res.body);
      if (typeof a?.valid !== "boolean") throw new Error("no valid");
      issuedAt = new Date(a.issued_at);
      expiresAt = new Date(a.expires_at);
      if (a.valid && Number.isNaN(issuedAt.getTime() + expiresAt.getTime())) throw new Error("no issued_at or expires_at");
    } catch (e) {
      fail("UNAVAILABLE", `verify gave a malformed answer: ${e.message}`);
    }
    if (!a.valid) fail(["TOKEN_REVOKED", "TOKEN_EXPIRED"].includes(a.error) ? a.error : "TOKEN_INVALID", `${a.error}`);
    const granted = a.scopes ?? [];
    const audience = a.aud === undefined ? [] : [a.aud].flat();
    this.heldToAudience(audience);
    const livemode = this.admit(a.agent_id, a.issuer, granted, a.livemode);
    let chain;
    try {
      chain = delegation(a);
    } catch (e) {
      fail("UNAVAILABLE", `verify gave a malformed answer: ${e.message}`);
    }
    if (a.cnf !== undefined) fail("PROOF_INVALID", "the token is bound to a key: it passes only with a DPoP proof (verifyDpop)");
    scoped(granted, scopes);
    return { agentId: a.agent_id, issuer: a.issuer, scopes: granted, issuedAt, expiresAt, livemode,
             audience, clientId: a.client_id ?? null, claims: a, subject: chain.subject, actors: chain.actors };
  }

  /** Takes a Security Event Token the service pushed (or a poll gave): verified through the
   * JWKS; issued by this service (`iss` is `baseUrl`); for this receiver (its `aud` holds
   * `setAudience`, when given); not seen before (its `jti` is not one of the last 10,000
   * taken); of a subject of an accepted issuer (`sub_id.iss` is in `issuers`, when given).
   * A revocation marks its agent revoked at once, and drops what is held of its issuer's
   * signature directory (the next signed request fetches it anew, without the agent's key);
   * a person's (`sub_id.iss` an identity provider's https URL) revokes every delegated token
   * for them issued until the event (see `personRevoked` for when 10,000 people are held). */
  async handleSet(setJwt) {
    const c = await this.decode(sized(setJwt, MAX_SET_BYTES, "SET"), "secevent+jwt", ["iss", "jti", "iat"]);
    if (c.iss !== this.baseUrl) fail("TOKEN_INVALID", `a SET of ${c.iss}, not of ${this.baseUrl}`);
    if ("aud" in c && ![c.aud].flat().every((a) => typeof a === "string")) fail("TOKEN_INVALID", "malformed aud");
    if (this.setAudience !== undefined && ![c.aud].flat().includes(this.setAudience)) {
      fail("TOKEN_INVALID", `a SET for ${c.aud}, not for ${this.setAudience}`);
    }
    if (typeof c.jti !== "string" || typeof c.events !== "object" || c.events === null || Array.isArray(c.events)) {
      fail("TOKEN_INVALID", "a SET needs a jti and events (a JSON object)");
    }
    let revoked, person;
    if (SESSION_REVOKED in c.events) {
      const s = c.sub_id;
      if (s?.format !== "iss_sub" || typeof s.iss !== "string" || typeof s.sub !== "string") {
        fail("TOKEN_INVALID", "a revocation without an iss_sub subject");
      }
      // Present, a revocation's time is a NumericDate, whoever it revokes.
      const when = c.events[SESSION_REVOKED]?.event_timestamp;
      if (when !== undefined && !numericDate(when)) fail("TOKEN_INVALID", "event_timestamp is not a NumericDate");
      if (s.iss.startsWith("https://")) {
        person = [`${s.iss}\n${s.sub}`, when ?? c.iat];
      } else {
        if (this.issuers && !this.issuers.has(s.iss)) fail("TOKEN_INVALID", `a revocation of an agent of ${s.iss}, not an accepted issuer`);
        revoked = s.sub;
      }
    }
    if (this.seenSets.has(c.jti)) fail("TOKEN_INVALID", `SET ${c.jti} was taken already (a replay)`);
    this.seenSets.add(c.jti);
    if (this.seenSets.size > SEEN_SETS) this.seenSets.delete(this.seenSets.values().next().value);
    if (revoked !== undefined) {
      this.revoked.add(revoked);
      // Its key leaves the issuer's directory at once: what is held of it is stale.
      for (const url of [`${this.baseUrl}/v1/directories/${c.sub_id.iss}`,
                         `https://${c.sub_id.iss}/.well-known/http-message-signatures-directory`]) {
        const times = this.dropped.get(url) ?? 0;
        this.dropped.delete(url);
        this.dropped.set(url, times + 1);
        this.docs.delete(url);
      }
      // The oldest drop: every fetch across it is long done.
      while (this.dropped.size > SEEN_SETS) this.dropped.delete(this.dropped.keys().next().value);
    }
    if (person !== undefined) this.personRevoked(...person);
  }

  /** Notes that the person `key` was revoked at `at` (Unix s). Past SEEN_SETS people, the
   * revocations older than any delegated token go first (a token lives an hour at most); then
   * the earliest, and every person's token from then or before is refused: any organization
   * whose stream reaches the receiver can send revocations, and a flood of them must not bring
   * another's revoked person back. */
  personRevoked(key, at) {
    const held = this.revokedSubjects;
    at = Math.max(at, held.get(key) ?? at);
    if (held.get(key) !== at) {
      held.set(key, at);
      this.revokedByTime.push([at, key]);
    }
    const heap = this.revokedByTime;
    const current = ([when, k]) => held.get(k) === when;
    if (held.size > SEEN_SETS) {
      const moot = Date.now() / 1000 - MAX_DELEGATED_LIFETIME - this.leeway;
      while (heap.size && (!current(heap.peek()) || heap.peek()[0] <= moot)) {
        const top = heap.pop();
        if (current(top)) held.delete(top[1]);
      }
    }
    while (held.size > SEEN_SETS) {
      const top = heap.pop();
      if (current(top)) {
        held.delete(top[1]);
        this.subjectsFloor = Math.max(this.subjectsFloor, top[0]);
      }
    }
    if (heap.size > 2 * held.size + 64) this.revokedByTime = new Heap([...held].map(([k, when]) => [when, k]));
  }
}

/** The most agents a chain may hold (the service's own bound). */
const MAX_CHAIN = 16;

/** The person and the chain of agents of a token's claims (or an online answer): both absent
 * for a token that acts for nobody, both present for a delegated one. */
function delegation(doc) {
  let { act, sub_id: id } = doc;
  if (act === undefined && id === undefined) return { subject: null, actors: [] };
  if (id?.format !== "iss_sub" || typeof id.iss !== "string" || typeof id.sub !== "string" || id.sub !== doc.sub) {
    fail("TOKEN_INVALID", "a delegated token needs sub_id (iss_sub) naming its sub");
  }
  const actors = [];
  while (act !== undefined) {
    if (typeof act?.sub !== "string" || typeof act.issuer_domain !== "string" || actors.length >= MAX_CHAIN) {
      fail("TOKEN_INVALID", "malformed act");
    }
    actors.push({ agentId: act.sub, issuer: act.issuer_domain });
    act = act.act;
  }
  if (!actors.length) fail("TOKEN_INVALID", "a delegated token needs act");
  return { subject: { sub: id.sub, iss: id.iss, subId: { format: "iss_sub", iss: id.iss, sub: id.sub } }, actors };
}

/** Whether array `x` sorts before `y`, item by item. */
const before = (x, y) => {
  for (let i = 0; i < x.length; i++) {
    if (x[i] < y[i]) return true;
    if (x[i] > y[i]) return false;
  }
  return false;
};

/** A binary heap of arrays, the least (by `before`) on top. */
class Heap {
  constructor(items = []) {
    this.items = items;
    for (let i = (items.length >> 1) - 1; i >= 0; i--) this.down(i);
  }

  get size() {
    return this.items.length;
  }

  peek() {
    return this.items[0];
  }

  push(x) {
    const a = this.items;
    a.push(x);
    for (let i = a.length - 1; i > 0; ) {
      const up = (i - 1) >> 1;
      if (!before(a[i], a[up])) break;
      [a[i], a[up]] = [a[up], a[i]];
      i = up;
    }
  }

  pop() {
    const a = this.items;
    const top = a[0];
    const last = a.pop();
    if (a.length) {
      a[0] = last;
      this.down(0);
    }
    return top;
  }

  down(i) {
    const a = this.items;
    for (;;) {
      const l = 2 * i + 1;
      let m = i;
      if (l < a.length && before(a[l], a[m])) m = l;
      if (l + 1 < a.length && before(a[l + 1], a[m])) m = l + 1;
      if (m === i) return;
      [a[i], a[m]] = [a[m], a[i]];
      i = m;
    }
  }
}

/** What was taken once (a DPoP proof, a signature's nonce), by key and id, each kept while
 * the time it is filed under (`at`: a proof's `iat`, a signature's `expires`) could still pass.
 * Past `capacity` the key holding the most forgets its earliest filed (by `at`, not the first
 * taken), and everything of that key filed at or before the latest it forgot is refused, so
 * that no replay passes however full, and a key that fills the memory (with proofs dated ahead,
 * say) raises no other key's floor. Only when every key holds one is the earliest of all
 * forgotten, under a floor for every key. Heaps are cleaned as they are read. */
class Replays {
  constructor(capacity) {
    this.capacity = capacity;
    this.keys = new Map(); // key -> { ids: Map(id -> at), heap: Heap([at, id]), floor }
    this.byAt = new Heap(); // [at, key, id] of everything taken
    this.byCount = new Map(); // how many a key holds -> the keys holding so many
    this.most = 0;
    this.held = 0;
    this.floor = -Infinity;
    this.horizon = -Infinity; // the latest `oldestValid` given: what was before may be forgotten
    this.clock = -Infinity; // the wall clock at the last call: over a minute before, it stepped back
  }

  /** Takes `id` of `key` filed under `at`, forgetting what was filed before `oldestValid`:
   * null, "seen" (taken before), "old" (filed before what may have been forgotten), or the
   * floor it is at or under (the memory was full). */
  admit(key, id, at, oldestValid, clock = Date.now() / 1000) {
    // A clock stepped back over a minute takes the horizon with it: honest proofs would
    // otherwise be refused until it caught up (what was forgotten meanwhile could pass). A
    // caller that read the time late never does.
    this.horizon = clock < this.clock - 60 ? oldestValid : Math.max(this.horizon, oldestValid);
    this.clock = clock;
    while (this.byAt.size && this.byAt.peek()[0] < this.horizon) {
      const [when, k, i] = this.byAt.pop();
      this.forget(k, i, when);
    }
    // A caller that read the time before an earlier call forgot it.
    if (at < this.horizon) return "old";
    let held = this.keys.get(key);
    const floor = Math.max(this.floor, held ? held.floor : -Infinity);
    if (at <= floor) return floor;
    if (held?.ids.has(id)) return "seen";
    if (!held) {
      held = { ids: new Map(), heap: new Heap(), floor: -Infinity };
      this.keys.set(key, held);
    }
    held.ids.set(id, at);
    held.heap.push([at, id]);
    this.byAt.push([at, key, id]);
    this.held++;
    this.count(key, held.ids.size - 1, held.ids.size);
    while (this.held > this.capacity) this.forgetOne();
    if (this.byAt.size > 2 * this.held + 64) {
      this.byAt = new Heap([...this.keys].flatMap(([k, h]) => [...h.ids].map(([i, when]) => [when, k, i])));
    }
    return null;
  }

  /** Forgets `id` of `key` filed under `at` if it is held (a heap may hold one forgotten). */
  forget(key, id, at) {
    const held = this.keys.get(key);
    if (!held || held.ids.get(id) !== at) return false;
    held.ids.delete(id);
    this.held--;
    this.count(key, held.ids.size + 1, held.ids.size);
    if (!held.ids.size) this.keys.delete(key);
    else if (held.heap.size > 2 * held.ids.size + 16) held.heap = new Heap([...held.ids].map(([i, when]) => [when, i]));
    return true;
  }

  /** The earliest of the key holding the most, or of all when every key holds one. */
  forgetOne() {
    if (this.most > 1) {
      const key = this.byCount.get(this.most).values().next().value;
      const held = this.keys.get(key);
      let at, id;
      do [at, id] = held.heap.pop();
      while (held.ids.get(id) !== at);
      held.floor = Math.max(held.floor, at);
      this.forget(key, id, at);
      return;
    }
    for (;;) {
      const [at, key, id] = this.byAt.pop();
      if (this.forget(key, id, at)) {
        this.floor = Math.max(this.floor, at);
        return;
      }
    }
  }

  count(key, was, now) {
    if (was) {
      const keys = this.byCount.get(was);
      keys.delete(key);
      if (!keys.size) this.byCount.delete(was);
    }
    if (now) {
      if (!this.byCount.has(now)) this.byCount.set(now, new Set());
      this.byCount.get(now).add(key);
    }
    this.most = Math.max(this.most, now);
    while (this.most && !this.byCount.has(this.most)) this.most--;
  }
}

/** Where RFC 9728 puts a resource's metadata: between its host and its path. */
const WELL_KNOWN_RESOURCE = "/.well-known/oauth-protected-resource";

/** What a receiver tells OAuth clients about itself (RFC 9728, protected resource metadata):
 * its resource identifier, that the verifier's agentid service issues its tokens, the scopes
 * it knows and how a token is sent. An MCP client reads it to find where to get a token. */
export class ResourceMetadata {
  /** @param {Verifier} verifier @param {string} resource an http(s) URI without a fragment
   *  @param {{scopesSupported?: string[], resourceName?: string}} [options] */
  constructor(verifier, resource, { scopesSupported = [], resourceName } = {}) {
    let url;
    try {
      url = new URL(resource);
    } catch {
      throw new TypeError(`resource ${resource} is not a URI`);
    }
    if (!["http:", "https:"].includes(url.protocol) || url.hash || resource.includes("#")) {
      throw new TypeError(`resource ${resource} is not an http(s) URI without a fragment`);
    }
    this.resource = resource;
    this.authorizationServer = verifier.baseUrl;
    this.scopesSupported = [...scopesSupported];
    this.resourceName = resourceName;
    /** The path it is served at, on the resource's own origin. */
    this.path = WELL_KNOWN_RESOURCE + (url.pathname === "/" ? "" : url.pathname);
    /** Its URL, as a challenge names it. */
    this.url = url.origin + this.path;
  }

  document() {
    return {
      resource: this.resource,
      authorization_servers: [this.authorizationServer],
      ...(this.scopesSupported.length ? { scopes_supported: this.scopesSupported } : {}),
      bearer_methods_supported: ["header"],
      dpop_signing_alg_values_supported: ["EdDSA", "ES256"],
      ...(this.resourceName ? { resource_name: this.resourceName } : {}),
    };
  }
}

/** The keys of the directory at `url` in `body` (a key that does not import passed over);
 * UNAVAILABLE when it is not a key set (then the fetch that brought it failed). */
async function readDirectory(url, body) {
  try {
    return await directoryKeys(body);
  } catch (e) {
    fail("UNAVAILABLE", `${url}: not a key set (${e.message})`);
  }
}

/** The Ed25519 keys of a JWKS, by kid; UNAVAILABLE when it is not one. */
async function readJwks(body) {
  try {
    const { keys } = JSON.parse(body);
    if (!Array.isArray(keys)) throw new Error("no keys");
    const found = new Map();
    for (const jwk of keys) {
      if (jwk?.kty === "OKP" && jwk.crv === "Ed25519" && typeof jwk.kid === "string") {
        found.set(jwk.kid, await publicKey({ kty: "OKP", crv: "Ed25519", x: jwk.x }, "EdDSA"));
      }
    }
    return found;
  } catch (e) {
    fail("UNAVAILABLE", `the service's JWKS is unusable: ${e.message}`);
  }
}

function scoped(granted, scopes) {
  const missing = scopes.filter((s) => !granted.includes(s));
  if (missing.length) fail("INSUFFICIENT_SCOPE", `missing scopes ${missing.join(", ")}`);
}

const asciiLower = (s) => s.replace(/[A-Z]+/g, (m) => m.toLowerCase());

/** `s` with each percent-encoding of an unreserved character decoded, and the others' hex
 * digits in upper case (RFC 3986 §6.2.2.1, §6.2.2.2).
 * @param {string} s
 * @returns {string} */
function percentNormal(s) {
  let out = "";
  for (let i = 0; i < s.length; ) {
    const hex = s.slice(i + 1, i + 3);
    if (s[i] === "%" && /^[0-9A-Fa-f]{2}$/.test(hex)) {
      const c = String.fromCharCode(parseInt(hex, 16));
      out += /^[A-Za-z0-9\-._~]$/.test(c) ? c : `%${hex.toUpperCase()}`;
      i += 3;
    } else {
      out += s[i];
      i += 1;
    }
  }
  return out;
}

/** An absolute path without its `.` and `..` segments (RFC 3986 §5.2.4).
 * @param {string} path
 * @returns {string} */
function removeDotSegments(path) {
  const segments = path.split("/").slice(1);
  const out = [];
  for (const [i, segment] of segments.entries()) {
    if (segment !== "." && segment !== "..") {
      out.push(segment);
      continue;
    }
    if (segment === "..") out.pop();
    if (i + 1 === segments.length) out.push("");
  }
  return `/${out.join("/")}`;
}

/** A URL as `htu` is compared (RFC 9449 §4.3): without its query and fragment, normalized as
 * RFC 3986 §6.2.2 and §6.2.3 say (scheme and host in lower case, no default port, an empty
 * path as `/`, percent-encodings of unreserved characters decoded and the others' hex digits
 * in upper case (in the host, lower case like the rest of it), dot segments removed), as the
 * service does. A host's trailing dot stays: it names another host. Exported for the tests;
 * not part of the declared API.
 * @param {string} url
 * @returns {string} */
export function htuForm(url) {
  url = url.split(/[?#]/, 1)[0];
  const sep = url.indexOf("://");
  if (sep < 0) return url;
  const scheme = asciiLower(url.slice(0, sep));
  const rest = url.slice(sep + 3);
  const slash = rest.indexOf("/");
  const authority = slash < 0 ? rest : rest.slice(0, slash);
  const path = slash < 0 ? "" : rest.slice(slash);
  const at = authority.lastIndexOf("@");
  const userinfo = at < 0 ? null : authority.slice(0, at);
  let host = asciiLower(percentNormal(at < 0 ? authority : authority.slice(at + 1)));
  const defaultPort = scheme === "https" ? ":443" : scheme === "http" ? ":80" : "";
  if (defaultPort && host.endsWith(defaultPort)) host = host.slice(0, -defaultPort.length);
  if (host.endsWith(":")) host = host.slice(0, -1);
  const normalPath = path ? removeDotSegments(percentNormal(path)) : "/";
  return userinfo === null ? `${scheme}://${host}${normalPath}` : `${scheme}://${percentNormal(userinfo)}@${host}${normalPath}`;
}

/** Checks a DPoP proof (RFC 9449 §4.3) for a `method` request to `url` with `token` at `now`
 * (seconds): `typ` dpop+jwt, `alg` EdDSA, Ed25519 or ES256 fitting the public key in its
 * `jwk` header, signed by that key, and `jti`, `htm`, `htu`, `iat`, `ath` matching (`htu`
 * without its query and fragment, both URLs normalized: `htuForm`).
 * The thumbprint of its key, its `jti` and `iat`; PROOF_INVALID otherwise. */
async function checkProof(proof, method, url, token, now, maxSkew) {
  const refuse = (why) => fail("PROOF_INVALID", `DPoP proof: ${why}`);
  if (proof.length > MAX_PROOF_BYTES) refuse(`longer than ${MAX_PROOF_BYTES} bytes`);
  let parsed;
  try {
    parsed = parse(proof);
  } catch (e) {
    refuse(`malformed: ${e.message}`);
  }
  const { header, claims: c, signingInput, signature } = parsed;
  if (header.typ !== "dpop+jwt") refuse("typ must be dpop+jwt");
  // A string naming one of them: ["EdDSA"] would name one as a property key.
  const fit = typeof header.alg === "string" && Object.hasOwn(PROOF_ALGS, header.alg) ? PROOF_ALGS[header.alg] : null;
  if (!fit) refuse("alg must be EdDSA, Ed25519 or ES256");
  const jwk = header.jwk;
  if (!jwk || typeof jwk !== "object" || Array.isArray(jwk)) refuse("jwk must be the public key, as a JSON object");
  const secret = PRIVATE_MEMBERS.find((m) => m in jwk);
  if (secret) refuse(`jwk holds the private member ${secret}`);
  if (jwk.kty !== fit[0] || jwk.crv !== fit[1]) refuse(`alg ${header.alg} does not fit a ${jwk.kty}/${jwk.crv} key`);
  if (jwk.kty === "OKP" && typeof jwk.x === "string") {
    let x;
    try {
      x = b64url(jwk.x);
    } catch {
      refuse("jwk's x is not base64url");
    }
    if (smallOrder(x)) refuse("jwk is an Ed25519 point of small order, which no key pair has");
  }
  const alg = header.alg === "ES256" ? "ES256" : "EdDSA";
  let key, jkt, checks;
  try {
    ({ key, jkt } = await proofKey(jwk, alg));
    checks = await verified(key, alg, signingInput, signature);
  } catch (e) {
    refuse(`the key in jwk is not a usable public key: ${e.message}`);
  }
  if (!checks) refuse("the signature does not check with the key in jwk");
  if (typeof c.jti !== "string" || !c.jti || c.jti.length > 256) refuse("jti must be a string of 1 to 256 characters");
  if (c.htm !== method) refuse(`htm is not ${method}`);
  if (typeof c.htu !== "string" || !c.htu || htuForm(c.htu) !== htuForm(url)) refuse(`htu is not ${htuForm(url)}`);
  // A NumericDate (RFC 7519 §2) may have a fraction: taken to the whole second (floor), once
  // known a finite number in range, so that the replay memory files it under an integer.
  const iat = numericDate(c.iat) ? Math.floor(c.iat) : NaN;
  if (!Number.isFinite(iat) || Math.abs(iat - now) > maxSkew) refuse(`iat is more than ${maxSkew} s from now`);
  // Not asked for (RFC 9449 bounds a proof by its iat), but honoured when present: a NumericDate
  // (1e999, read as Infinity, would never come).
  for (const name of ["exp", "nbf"]) {
    if (name in c && !numericDate(c[name])) refuse(`${name} must be a NumericDate (a number from 0 to 2^53)`);
  }
  if ("exp" in c && c.exp <= now) refuse("exp is past");
  if ("nbf" in c && c.nbf > now + maxSkew) refuse("nbf is in the future");
  if (c.ath !== (await sha256(token))) refuse("ath is not the token's hash");
  return { jkt, jti: c.jti, iat };
}
