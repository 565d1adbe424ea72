// Verify agentid agent tokens: offline against the service's JWKS, with revocation seen
// through Token Status Lists and pushed Shared Signals events, or online. Keys and lists
// come only from `baseUrl`'s origin and are cached for as long as the service says, so a
// warm verification makes no network call. Uses `fetch`, WebCrypto (through jose) and
// `DecompressionStream`: it runs on Node >= 20 and on fetch-based runtimes.
import { importJWK, jwtVerify, decodeProtectedHeader, errors as joseErrors } from "jose";

const SESSION_REVOKED = "https://schemas.openid.net/secevent/caep/event-type/session-revoked";

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

function maxAge(cacheControl, fallback) {
  for (const part of (cacheControl || "").split(",")) {
    const [name, value] = part.trim().split("=");
    if (name.toLowerCase() === "max-age" && /^\d+$/.test(value || "")) return Number(value);
  }
  return fallback;
}

async function inflate(bytes) {
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
  return new Uint8Array(await new Response(stream).arrayBuffer());
}

function b64url(text) {
  const b64 = text.replace(/-/g, "+").replace(/_/g, "/") + "=".repeat((4 - (text.length % 4)) % 4);
  return Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
}

export class Verifier {
  /**
   * @param {{baseUrl: string, issuers?: string[], leeway?: number, listGrace?: number,
   *          failOpen?: boolean, kidRefetchInterval?: number, timeout?: number,
   *          allowTest?: boolean}} options
   */
  constructor({ baseUrl, issuers, leeway = 30, listGrace = 300, failOpen = false, kidRefetchInterval = 60, timeout = 5, allowTest = false }) {
    this.allowTest = allowTest;
    this.baseUrl = baseUrl.replace(/\/+$/, "");
    this.issuers = issuers ? new Set(issuers) : null;
    this.leeway = leeway;
    this.listGrace = listGrace;
    this.failOpen = failOpen;
    this.kidRefetchInterval = kidRefetchInterval;
    this.timeout = timeout;
    this.docs = new Map(); // url -> {body, etag, freshUntil, fetchedAt}
    this.inflight = new Map(); // url -> Promise of a fetch
    this.keys = new Map(); // kid -> CryptoKey
    this.keysEtag = undefined;
    this.lastKidFetch = -Infinity;
    this.lists = new Map(); // uri -> {bits, fetchedAt, ttl}
    this.revoked = new Set();
  }

  /** GETs `url` (revalidating what is held), one fetch per URL at a time. */
  async fetchDoc(url, accept, fresherThan = -Infinity) {
    const held = this.docs.get(url);
    if (held && held.freshUntil > Date.now() && held.fetchedAt > fresherThan) return held;
    let pending = this.inflight.get(url);
    if (!pending) {
      pending = (async () => {
        const headers = { accept };
        if (held?.etag) headers["if-none-match"] = held.etag;
        let res;
        try {
          res = await fetch(url, { headers, signal: AbortSignal.timeout(this.timeout * 1000), redirect: "error" });
        } catch (e) {
          fail("UNAVAILABLE", `${url}: ${e.message}`);
        }
        let body;
        if (res.status === 304 && held) body = held.body;
        else if (res.ok) body = await res.text();
        else fail("UNAVAILABLE", `${url}: ${res.status}`);
        const now = Date.now();
        const doc = {
          body,
          etag: res.headers.get("etag") || held?.etag,
          freshUntil: now + maxAge(res.headers.get("cache-control"), 60) * 1000,
          fetchedAt: now,
        };
        this.docs.set(url, doc);
        return doc;
      })().finally(() => this.inflight.delete(url));
      this.inflight.set(url, pending);
    }
    return pending;
  }

  /** The key of `kid`: from the cached JWKS, refetched when stale, or (at most once per
   * `kidRefetchInterval`) when the kid is unknown. */
  async key(kid) {
    const url = `${this.baseUrl}/.well-known/jwks.json`;
    const held = this.docs.get(url);
    const stale = !held || held.freshUntil <= Date.now();
    const unknown = !this.keys.has(kid);
    if (stale || (unknown && Date.now() - this.lastKidFetch >= this.kidRefetchInterval * 1000)) {
      const asked = Date.now();
      let doc;
      try {
        doc = await this.fetchDoc(url, "application/json", unknown ? asked - 1 : -Infinity);
      } catch (e) {
        if (!held) throw e;
        doc = held;
      }
      if (doc.etag !== this.keysEtag || this.keys.size === 0) {
        const keys = new Map();
        for (const jwk of JSON.parse(doc.body).keys || []) {
          if (jwk.kty === "OKP" && jwk.crv === "Ed25519" && jwk.kid) {
            keys.set(jwk.kid, await importJWK({ ...jwk, alg: "EdDSA" }, "EdDSA"));
          }
        }
        this.keys = keys;
        this.keysEtag = doc.etag;
      }
      if (unknown) this.lastKidFetch = Date.now();
    }
    return this.keys.get(kid) || fail("TOKEN_INVALID", `no key ${kid} in the service's JWKS`);
  }

  /** Checks a JWS's header (EdDSA, a kid, `typ`) and signature; its claims. */
  async decode(jws, typ, required) {
    let header;
    try {
      header = decodeProtectedHeader(jws);
    } catch {
      fail("TOKEN_INVALID", "malformed");
    }
    if (header.alg !== "EdDSA" || typeof header.kid !== "string") fail("TOKEN_INVALID", "only alg EdDSA with a kid");
    if ((header.typ ?? typ) !== typ) fail("TOKEN_INVALID", `typ ${header.typ} is not ${typ}`);
    const key = await this.key(header.kid);
    try {
      const { payload } = await jwtVerify(jws, key, {
        algorithms: ["EdDSA"],
        clockTolerance: this.leeway,
        requiredClaims: required,
      });
      return payload;
    } catch (e) {
      if (e instanceof joseErrors.JWTExpired) fail("TOKEN_EXPIRED", e.message);
      fail("TOKEN_INVALID", e.message);
    }
  }

  /** The status at `idx` of the list at `uri` (1: revoked); null when it cannot be had and
   * `failOpen` is set. */
  async status(uri, idx) {
    const prefix = `${this.baseUrl}/v1/status/`;
    if (!uri.startsWith(prefix) || /[/?#]/.test(uri.slice(prefix.length))) {
      fail("TOKEN_INVALID", `status list ${uri} is not one of ${this.baseUrl}`);
    }
    let held = this.lists.get(uri);
    const now = Date.now();
    if (!held || now - held.fetchedAt >= held.ttl * 1000) {
      try {
        const doc = await this.fetchDoc(uri, "application/statuslist+jwt", held ? held.fetchedAt : -Infinity);
        if (!held || doc.fetchedAt > held.fetchedAt) {
          const claims = await this.decode(doc.body, "statuslist+jwt", ["sub", "iat"]);
          if (claims.sub !== uri) fail("TOKEN_INVALID", `the list at ${uri} says it is ${claims.sub}`);
          if (claims.status_list?.bits !== 1) fail("TOKEN_INVALID", "status lists of one bit only");
          held = { bits: await inflate(b64url(claims.status_list.lst)), fetchedAt: doc.fetchedAt, ttl: Number(claims.ttl ?? 60) };
          this.lists.set(uri, held);
        }
      } catch (e) {
        if (!(e instanceof VerificationError) || e.code !== "UNAVAILABLE") throw e;
        if (!held || now - held.fetchedAt > (held.ttl + this.listGrace) * 1000) {
          if (this.failOpen) return null;
          throw e;
        }
      }
    }
    if (Math.floor(idx / 8) >= held.bits.length) fail("TOKEN_INVALID", `index ${idx} is outside the list`);
    return (held.bits[Math.floor(idx / 8)] >> idx % 8) & 1;
  }

  /** Verifies `token` offline: signature, claims, revocation and `scopes`. */
  async verify(token, { scopes = [] } = {}) {
    const c = await this.decode(token, "JWT", ["exp", "iat", "sub", "iss"]);
    if (c.iat > Date.now() / 1000 + this.leeway) fail("TOKEN_INVALID", "issued in the future");
    if (this.issuers && !this.issuers.has(c.iss)) fail("TOKEN_INVALID", `issuer ${c.iss} is not accepted`);
    const livemode = this.livemode(c.livemode);
    if (this.revoked.has(c.sub)) fail("TOKEN_REVOKED", "revoked (a pushed event)");
    if (c.status !== undefined) {
      const ref = c.status?.status_list;
      if (!ref || !Number.isSafeInteger(ref.idx) || ref.idx < 0 || typeof ref.uri !== "string") {
        fail("TOKEN_INVALID", "malformed status claim");
      }
      if ((await this.status(ref.uri, ref.idx)) === 1) fail("TOKEN_REVOKED", "revoked (status list)");
    }
    const granted = Array.isArray(c.scopes) ? c.scopes : [];
    const missing = scopes.filter((s) => !granted.includes(s));
    if (missing.length) fail("INSUFFICIENT_SCOPE", `missing scopes ${missing.join(", ")}`);
    return {
      agentId: c.sub,
      issuer: c.iss,
      scopes: granted,
      issuedAt: new Date(c.iat * 1000),
      expiresAt: new Date(c.exp * 1000),
      livemode,
    };
  }

  /** Whether a token is live; a test-mode one (`livemode: false`) is refused unless
   * `allowTest`. */
  livemode(value = true) {
    if (value === true) return true;
    if (value === false && this.allowTest) return false;
    if (value === false) fail("TOKEN_INVALID", "a test-mode token (livemode false); build the Verifier with allowTest: true to accept it");
    fail("TOKEN_INVALID", "malformed livemode claim");
  }

  /** Asks the service (`GET /v1/verify/:token`), which sees revocation at once. */
  async verifyOnline(token, { key } = {}) {
    let res;
    try {
      res = await fetch(`${this.baseUrl}/v1/verify/${encodeURIComponent(token)}`, {
        headers: key ? { authorization: `Bearer ${key}` } : {},
        signal: AbortSignal.timeout(this.timeout * 1000),
      });
    } catch (e) {
      fail("UNAVAILABLE", e.message);
    }
    if (!res.ok) fail("UNAVAILABLE", `verify answered ${res.status}`);
    const a = await res.json();
    if (!a.valid) {
      const code = ["TOKEN_REVOKED", "TOKEN_EXPIRED"].includes(a.error) ? a.error : "TOKEN_INVALID";
      fail(code, a.error);
    }
    const livemode = this.livemode(a.livemode);
    return {
      agentId: a.agent_id,
      issuer: a.issuer,
      scopes: a.scopes || [],
      issuedAt: new Date(a.issued_at),
      expiresAt: new Date(a.expires_at),
      livemode,
    };
  }

  /** Takes a Security Event Token the service pushed (or a poll gave): verified through the
   * JWKS, from this service; a revocation marks its agent revoked at once. */
  async handleSet(setJwt) {
    const c = await this.decode(setJwt, "secevent+jwt", ["iss", "jti", "iat"]);
    if (c.iss !== this.baseUrl) fail("TOKEN_INVALID", `a SET of ${c.iss}, not of ${this.baseUrl}`);
    if (c.events && SESSION_REVOKED in c.events) {
      const s = c.sub_id;
      if (s?.format !== "iss_sub" || typeof s.sub !== "string") fail("TOKEN_INVALID", "a revocation without an iss_sub subject");
      this.revoked.add(s.sub);
    }
  }
}
