// Cloudflare's Web Bot Auth signer (`web-bot-auth`, unmodified), as the tests run it: signs a
// GET of $URL with the private JWK in $KEY (Ed25519, or RSA with "alg": "PS512"), naming $AGENT
// as its Signature-Agent (a bare string, as 0.1.3 sends it), valid for $VALID seconds (300 by
// default); prints the headers it made as one JSON object.
import { signatureHeaders } from "web-bot-auth";
import { signerFromJWK } from "web-bot-auth/crypto";

const agent = JSON.stringify(process.env.AGENT);
const request = new Request(process.env.URL, { headers: { "Signature-Agent": agent } });
const now = new Date();
const headers = await signatureHeaders(request, await signerFromJWK(JSON.parse(process.env.KEY)), {
  created: now,
  expires: new Date(now.getTime() + Number(process.env.VALID ?? 300) * 1000),
});
console.log(JSON.stringify({ ...headers, "Signature-Agent": agent }));
