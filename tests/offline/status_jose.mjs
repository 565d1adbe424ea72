// A receiver of an agentid token that checks revocation offline with stock libraries:
// jose verifies the token and its status list through JWKS, @sd-jwt/jwt-status-list reads
// the list. Prints {"idx": …, "status": 0 | 1} (1: revoked).
//   node status_jose.mjs <token file> <base URL>
import { readFileSync } from "node:fs";
import { createRemoteJWKSet, jwtVerify } from "jose";
import { getListFromStatusListJWT, getStatusListFromJWT } from "@sd-jwt/jwt-status-list";

const token = readFileSync(process.argv[2], "utf8").trim();
const base = process.argv[3];
const jwks = createRemoteJWKSet(new URL(`${base}/.well-known/jwks.json`));
await jwtVerify(token, jwks, { algorithms: ["EdDSA"] });
const { idx, uri } = getStatusListFromJWT(token);
const res = await fetch(uri, { headers: { accept: "application/statuslist+jwt" } });
if (!res.ok) throw new Error(`${uri}: ${res.status}`);
const list = await res.text();
const { payload } = await jwtVerify(list, jwks, { algorithms: ["EdDSA"], typ: "statuslist+jwt" });
if (payload.sub !== uri) throw new Error(`the list is of ${payload.sub}, not ${uri}`);
console.log(JSON.stringify({ idx, status: getListFromStatusListJWT(list).getStatus(idx) }));
