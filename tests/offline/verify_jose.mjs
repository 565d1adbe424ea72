// Offline validation with jose (Node), as a receiver would do it: the token and the PEM
// public key, nothing else. Prints the claims as JSON.
import { readFileSync } from "node:fs";
import { importSPKI, jwtVerify } from "jose";

const token = readFileSync(process.argv[2], "utf8").trim();
const pem = readFileSync(process.argv[3], "utf8");
const key = await importSPKI(pem, "EdDSA");
const { payload } = await jwtVerify(token, key, { algorithms: ["EdDSA"] });
console.log(JSON.stringify(payload));
