// Express middleware: verifies the request's agent token before the route sees it. A bearer
// token comes as `Authorization: Bearer <token>`; a token bound to a key (DPoP) as
// `Authorization: DPoP <token>` with its proof in the `DPoP` header, checked for this
// request's method and URL: `publicOrigin` (the origin agents address) and the request's
// path. Without `publicOrigin` every DPoP-bound token is refused (a warning says so when the
// middleware is made): the request's Host and forwarded headers are the caller's to choose.
// On success the agent is `req.agent`; otherwise 401 (403 for INSUFFICIENT_SCOPE, 503 with
// `Retry-After` for UNAVAILABLE, 500 for MISCONFIGURED: the receiver's own configuration)
// with `{"error": code, "message": …}`, and on a 401 or 403 a `WWW-Authenticate` challenge
// (RFC 6750 §3.1: no error code without credentials, and then the DPoP challenge beside the
// Bearer one; `insufficient_scope` on a 403; RFC 9449 §7.1 for DPoP), naming
// `resourceMetadata` (RFC 9728) when given; `resourceMetadataHandler` serves it. A path in
// `exclude` (an array of paths), or below one, passes unchecked ("/" is the root alone); a
// plain string, an empty entry or one not beginning with "/" throws when the middleware is
// made. With `delegated`, only an agent acting for a person (`req.agent.subject`) passes; any
// other token is TOKEN_INVALID. A request without `Authorization` that an agent signed (Web
// Bot Auth: `Signature-Input`) is checked by `verifier.verifyRequest` for `publicOrigin` and
// the request's path and query (directories in `trustedSignatureAgents` beside the service's
// own): on success `req.signedRequest` holds what it found (a signature names no scopes nor
// person, so a route with `scopes` or `delegated` refuses it).
import { VerificationError } from "./index.js";
import { trustedAgents } from "./requests.js";

const STATUS = { INSUFFICIENT_SCOPE: 403, UNAVAILABLE: 503, MISCONFIGURED: 500 };
const DPOP_ALGS = "EdDSA Ed25519 ES256";
/** Seconds a client is asked to wait after a 503 (the service could not be reached). */
const RETRY_AFTER = 5;

/** The `WWW-Authenticate` value for `error` on a request that used `scheme` (none when it
 * had no credentials at all: `bare`), or null for a refusal that is not the credentials'. A
 * Bearer challenge names the receiver's resource metadata (RFC 9728 §5.1) when given. */
function challenge(error, scheme, scopes, bare, metadata) {
  if (error.code === "UNAVAILABLE" || error.code === "MISCONFIGURED") return null;
  if (error.noPublicOrigin) return `DPoP error="invalid_token", error_description="${error.message}", algs="${DPOP_ALGS}"`;
  const where = metadata ? `resource_metadata="${metadata.url}"` : "";
  if (bare) return `${where ? `Bearer ${where}` : "Bearer"}, DPoP algs="${DPOP_ALGS}"`;
  const proof = error.code === "PROOF_INVALID" || error.code === "PROOF_REPLAYED";
  const [code, extra] = error.code === "INSUFFICIENT_SCOPE"
    ? ["insufficient_scope", `, scope="${scopes.join(" ")}"`]
    : [scheme === "DPoP" && proof ? "invalid_dpop_proof" : "invalid_token", ""];
  if (scheme === "DPoP" || proof) return `DPoP error="${code}"${extra}, algs="${DPOP_ALGS}"`;
  return `Bearer error="${code}"${extra}${where ? `, ${where}` : ""}`;
}

/** An Express handler serving `metadata` (a `ResourceMetadata`):
 * `app.get(metadata.path, resourceMetadataHandler(metadata))`. */
export function resourceMetadataHandler(metadata) {
  const body = JSON.stringify(metadata.document());
  return (req, res) => {
    res.statusCode = 200;
    res.setHeader("Content-Type", "application/json");
    res.setHeader("Cache-Control", "public, max-age=3600");
    res.setHeader("Access-Control-Allow-Origin", "*");
    res.end(body);
  };
}

/** The path of a request target, also of an absolute-form one (`http://host/path`), without
 * its query: a proof's URL is the receiver's origin and this path alone. */
function pathOf(target) {
  const match = /^[a-z][a-z0-9+.-]*:\/\/[^/?#]*(.*)$/i.exec(target);
  const path = (match ? match[1] : target).split(/[?#]/)[0];
  return path.startsWith("/") ? path : `/${path}`;
}

/** `{"error": code, "message": …}`: what every middleware answers. A refusal that is not the
 * caller's fault says nothing of the receiver's own set-up. */
function refusalBody(e) {
  const message = {
    UNAVAILABLE: "the agent cannot be verified now: try again shortly",
    MISCONFIGURED: "this receiver cannot verify agents: its configuration is wrong",
  }[e.code] ?? e.message;
  return JSON.stringify({ error: e.code, message });
}

/** `exclude` as an array of paths, each beginning with "/"; a TypeError for a plain string
 * (one exclusion a character, "/" among them), an empty entry or one not beginning with "/"
 * (`"".split(",")` gives `[""]`): either used to leave every path open. */
function exclusions(exclude) {
  if (!Array.isArray(exclude)) throw new TypeError(`exclude must be an array of paths, not ${JSON.stringify(exclude)}`);
  for (const path of exclude) {
    if (typeof path !== "string" || !path.startsWith("/")) {
      throw new TypeError(`exclude holds ${JSON.stringify(path)}, which is not a path beginning with /`);
    }
  }
  return [...exclude];
}

/** Whether `path` is one of `exclude` or below one of them; "/" is the root alone, not every
 * path below it. */
function excluded(path, exclude) {
  return exclude.some((e) => {
    const stem = e.replace(/\/+$/, "");
    return path === e || (stem !== "" && path.startsWith(`${stem}/`));
  });
}

/** The request's header fields as one string each (Node joins repeated ones with commas). */
function fields(headers) {
  return Object.fromEntries(
    Object.entries(headers ?? {}).map(([name, value]) => [name, Array.isArray(value) ? value.join(", ") : String(value)]),
  );
}

export function agentIdMiddleware(verifier, { scopes = [], publicOrigin, resourceMetadata, exclude = [], delegated = false, trustedSignatureAgents = [] } = {}) {
  exclude = exclusions(exclude);
  trustedSignatureAgents = trustedAgents(trustedSignatureAgents);
  const origin = publicOrigin?.replace(/\/+$/, "");
  if (!origin) {
    console.warn("agentIdMiddleware has no publicOrigin: every DPoP-bound token is refused (set publicOrigin to the origin agents address, e.g. https://api.example)");
  }
  return async (req, res, next) => {
    if (exclude.length && excluded(pathOf(req.originalUrl ?? req.url ?? "/"), exclude)) return next();
    const header = req.headers?.authorization || "";
    const scheme = header.slice(0, 5).toLowerCase() === "dpop " ? "DPoP" : "Bearer";
    try {
      // Node keeps the first of two Authorization headers; a gateway or the app may read the
      // last. A request carries one (RFC 9110).
      if ((req.rawHeaders ?? []).filter((v, i) => i % 2 === 0 && v.toLowerCase() === "authorization").length > 1) {
        throw new VerificationError("TOKEN_INVALID", "more than one Authorization header");
      }
      if (!header.trim() && req.headers?.["signature-input"]) {
        if (!origin) {
          throw new VerificationError("TOKEN_INVALID", "this receiver takes no signed request: its publicOrigin is not configured");
        }
        const target = req.originalUrl ?? req.url ?? "/";
        const url = origin + (target.startsWith("/") ? target : pathOf(target));
        const found = await verifier.verifyRequest({ method: req.method, url, headers: fields(req.headers) }, { trustedSignatureAgents });
        if (scopes.length) throw new VerificationError("INSUFFICIENT_SCOPE", "a signed request names no scopes");
        if (delegated) throw new VerificationError("TOKEN_INVALID", "a signed request acts for no person");
        req.signedRequest = found;
        return next();
      }
      if (scheme === "DPoP") {
        const token = header.slice(5).trim();
        if (!token) throw new VerificationError("TOKEN_INVALID", "no token");
        // Node joins repeated headers with commas; a proof holds none.
        const proof = req.headers.dpop;
        if (typeof proof === "string" && proof.includes(",")) throw new VerificationError("PROOF_INVALID", "more than one DPoP header");
        if (!origin) {
          const e = new VerificationError("TOKEN_INVALID", "this receiver takes no DPoP-bound token: its publicOrigin is not configured");
          e.noPublicOrigin = true;
          throw e;
        }
        // Never the request's Host, forwarded headers or an absolute-form target: the caller
        // chooses them, and a proof made for another receiver would pass.
        const path = pathOf(req.originalUrl ?? req.url ?? "/");
        req.agent = await verifier.verifyDpop(token, proof, req.method, origin + path, { scopes });
      } else {
        const token = header.toLowerCase().startsWith("bearer ") ? header.slice(7).trim() : "";
        if (!token) throw new VerificationError("TOKEN_INVALID", header.trim() ? "no bearer token" : "no Authorization header");
        req.agent = await verifier.verify(token, { scopes });
      }
      if (delegated && !req.agent.subject) {
        req.agent = undefined;
        throw new VerificationError("TOKEN_INVALID", "this route takes an agent acting for a person: a token that acts for nobody");
      }
    } catch (e) {
      if (!(e instanceof VerificationError)) return next(e);
      const value = challenge(e, scheme, scopes, !header.trim(), resourceMetadata);
      if (value) res.setHeader("WWW-Authenticate", value);
      if (e.code === "UNAVAILABLE") res.setHeader("Retry-After", String(RETRY_AFTER));
      res.statusCode = STATUS[e.code] || 401;
      res.setHeader("Content-Type", "application/json");
      res.end(refusalBody(e));
      return;
    }
    next();
  };
}
