// Compact JWS (RFC 7515), parsed once: its header and claims as JSON objects, its signing input
// and its signature, each segment read as strict, canonical base64url without padding (as the
// service reads it, so that the two never disagree on what a token says). Signatures are
// checked by the platform: `node:crypto` at once where the runtime has it (Node, Deno, Bun),
// WebCrypto through jose's key import elsewhere.
import { base64url, calculateJwkThumbprint, importJWK } from "jose";

/** `node:crypto`, or null on a runtime without it. */
const nodeCrypto = await import("node:crypto").catch(() => null);
const NodeBuffer = globalThis.Buffer;

const SEGMENT = /^[A-Za-z0-9_-]*$/;
const ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
const utf8 = new TextDecoder("utf-8", { fatal: true });
const encoder = new TextEncoder();

/** The bytes of base64url without padding; throws for any other text, and for an encoding
 * whose unused final bits are not zero (another text for the same bytes). */
export function b64urlStrict(segment) {
  const rest = segment.length % 4;
  if (rest === 1 || !SEGMENT.test(segment)) throw new Error("a segment is not base64url without padding");
  if (rest && ALPHABET.indexOf(segment[segment.length - 1]) & (rest === 2 ? 0x0f : 0x03)) {
    throw new Error("a segment is not canonical base64url");
  }
  return NodeBuffer ? NodeBuffer.from(segment, "base64url") : base64url.decode(segment);
}

const isObject = (v) => v !== null && typeof v === "object" && !Array.isArray(v);

/** The deepest JSON read: deeper values could not even be printed in a message (the stack runs
 * out), so deeper text is refused unread. */
const MAX_DEPTH = 256;

/** How deep the arrays and objects of JSON text nest (strings skipped). */
function depth(text) {
  let level = 0;
  let deepest = 0;
  let inString = false;
  let escaped = false;
  for (const ch of text) {
    if (inString) {
      if (escaped) escaped = false;
      else if (ch === "\\") escaped = true;
      else if (ch === '"') inString = false;
    } else if (ch === '"') {
      inString = true;
    } else if (ch === "[" || ch === "{") {
      deepest = Math.max(deepest, ++level);
    } else if (ch === "]" || ch === "}") {
      level -= 1;
    }
  }
  return deepest;
}

/** The value of JSON text; throws for anything else, nesting deeper than MAX_DEPTH included. */
function jsonValue(text) {
  // Shorter text cannot open as many brackets: a token's parts rarely pay for the walk.
  if (text.length > MAX_DEPTH && depth(text) > MAX_DEPTH) throw new Error(`JSON nested deeper than ${MAX_DEPTH}`);
  return JSON.parse(text);
}

/** A compact JWS whose header and payload are JSON objects; throws otherwise. */
export function parse(jws) {
  const parts = jws.split(".");
  if (parts.length !== 3) throw new Error(`${parts.length} parts, not 3`);
  const [head, payload, signature] = parts;
  const header = jsonValue(utf8.decode(b64urlStrict(head)));
  const claims = jsonValue(utf8.decode(b64urlStrict(payload)));
  if (!isObject(header) || !isObject(claims)) throw new Error("the header and the claims must be JSON objects");
  // RFC 7515 §4.1.11: no extension is understood here, so none may be critical; RFC 7797's
  // unencoded payload is not taken either.
  if ("crit" in header || "b64" in header) throw new Error("the header names extensions (crit, b64) not understood here");
  const input = jws.slice(0, head.length + 1 + payload.length);
  return {
    header,
    claims,
    signingInput: NodeBuffer ? NodeBuffer.from(input, "latin1") : encoder.encode(input),
    signature: b64urlStrict(signature),
  };
}

/** The public key in `jwk` for `alg` (EdDSA or ES256), ready for `verified`. */
export async function publicKey(jwk, alg) {
  if (nodeCrypto) return nodeCrypto.createPublicKey({ key: jwk, format: "jwk" });
  return importJWK({ ...jwk, alg: alg === "ES256" ? "ES256" : "EdDSA" }, alg === "ES256" ? "ES256" : "EdDSA");
}

/** Whether `signature` (raw: Ed25519's 64 bytes, ES256's r||s) is `key`'s over `data`: at once
 * with `node:crypto`, through WebCrypto's queue elsewhere. */
export function verified(key, alg, data, signature) {
  if (nodeCrypto) {
    return alg === "ES256"
      ? nodeCrypto.verify("sha256", data, { key, dsaEncoding: "ieee-p1363" }, signature)
      : nodeCrypto.verify(null, data, key, signature);
  }
  const algorithm = alg === "ES256" ? { name: "ECDSA", hash: "SHA-256" } : { name: "Ed25519" };
  return crypto.subtle.verify(algorithm, key, signature, data);
}

/** SHA-256 of `text`, base64url (a DPoP proof's `ath`). */
export async function sha256(text) {
  if (nodeCrypto) return nodeCrypto.createHash("sha256").update(text).digest("base64url");
  return base64url.encode(new Uint8Array(await crypto.subtle.digest("SHA-256", encoder.encode(text))));
}

/** How many agents' keys (and thumbprints) are kept made: an agent signs every request with
 * the same key, and making one costs more than checking its signature. */
const KEYS_KEPT = 1024;
const made = new Map();

/** The public key in a proof's `jwk` and its RFC 7638 thumbprint, made once for the last
 * `KEYS_KEPT` keys. Throws for a key that is not one. */
export async function proofKey(jwk, alg) {
  const members = jwk.kty === "OKP" ? ["crv", "kty", "x"] : ["crv", "kty", "x", "y"];
  if (!members.every((m) => typeof jwk[m] === "string")) throw new Error("the key lacks a member");
  const name = `${alg} ${members.map((m) => jwk[m]).join(" ")}`;
  let entry = made.get(name);
  if (entry) {
    made.delete(name);
  } else {
    const bare = Object.fromEntries(members.map((m) => [m, jwk[m]]));
    entry = { key: await publicKey(bare, alg), jkt: await calculateJwkThumbprint(bare, "sha256") };
  }
  made.set(name, entry);
  if (made.size > KEYS_KEPT) made.delete(made.keys().next().value);
  return entry;
}
