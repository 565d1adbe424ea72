# Sourced by load/cpu-per-request and load/instructions-per-request (set -euo pipefail, BIN,
# PORT and NAME set first): a fresh PostgreSQL database with an enterprise organization (SK,
# PK), a work directory (WORK), `start_server` / `stop_server`, and a hot token in
# $WORK/hot.txt once `register_hot` ran, 20,000 cold ones in $WORK/tokens.txt once `mint_cold`
# ran. Everything is removed on exit.
ADMIN=postgres://postgres@127.0.0.1:5432
DB=agentid_${NAME}_$$
URL=$ADMIN/$DB WORK=$(mktemp -d)
psql "$ADMIN/postgres" -qc "CREATE DATABASE $DB"
stop_server() {
  if [ -n "${SPID:-}" ]; then kill "$SPID" 2>/dev/null && wait "$SPID" 2>/dev/null || true; fi
  SPID=
}
cleanup() {
  stop_server
  psql "$ADMIN/postgres" -qc "DROP DATABASE IF EXISTS $DB WITH (FORCE)" || true
  rm -rf "$WORK"
}
trap cleanup EXIT
json() { python3 -c "import json,sys; print(json.load(sys.stdin)$1)"; }
# The key file seals the organization, and every server started here starts with it.
export AGENTID_SIGNING_KEY_FILE="$WORK/signing-key.pem"
ORG=$("$BIN" org create --name "$NAME" --plan enterprise --verify-limit 1000000000 \
  --other-limit 1000000000 --database-url "$URL")
SK=$(echo "$ORG" | json '["keys"]["secret_live"]')
PK=$(echo "$ORG" | json '["keys"]["publishable_live"]')
# Starts the server, under the command in the WRAP array if one is set (valgrind …), with
# extra environment (KEY=VALUE …, overriding the defaults), and waits until it listens.
start_server() {
  : >"$WORK/out"
  env DATABASE_URL="$URL" AGENTID_BIND="127.0.0.1:$PORT" AGENTID_METRICS_BIND=off RUST_LOG=warn \
    AGENTID_SIGNING_KEY_FILE="$WORK/signing-key.pem" "$@" ${WRAP[@]+"${WRAP[@]}"} "$BIN" serve \
    >"$WORK/out" 2>"$WORK/err" &
  SPID=$!
  until grep -q "listening on" "$WORK/out" 2>/dev/null; do
    kill -0 "$SPID" 2>/dev/null || { echo "agentid did not start:" >&2; cat "$WORK/err" >&2; exit 1; }
    sleep 0.1
  done
}
# Grants the organization the issuer domain $1, as an operator does (a server registers
# agents only under names their organization holds), sealed with the key file `org create` made.
approve() {
  "$BIN" domain approve --org "$NAME" "$1" --database-url "$URL" \
    --signing-key-file "$WORK/signing-key.pem" >/dev/null
}
# Registers one agent and writes its token to $WORK/hot.txt.
register_hot() {
  approve "$NAME.example"
  curl -sf -X POST -H "Authorization: Bearer $SK" -H 'content-type: application/json' \
    -d "{\"name\":\"$NAME\",\"issuer_domain\":\"$NAME.example\",\"scopes\":[\"read:$NAME\"]}" \
    "http://127.0.0.1:$PORT/v1/agents/register" | json '["token"]' >"$WORK/hot.txt"
}
# Registers 100 agents and mints 20,000 tokens for them (200 each, in turn) into
# $WORK/tokens.txt: a cold stream, every token used once per pass.
mint_cold() {
  approve cold.example
  python3 - "http://127.0.0.1:$PORT" "$SK" >"$WORK/tokens.txt" <<'PY'
import concurrent.futures, json, sys, urllib.request
base, sk = sys.argv[1], sys.argv[2]
def call(path, body=None):
    req = urllib.request.Request(base + path, method="POST", data=json.dumps(body or {}).encode(),
                                 headers={"Authorization": f"Bearer {sk}", "Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req))
ids = [call("/v1/agents/register", {"name": f"cold-{i}", "issuer_domain": "cold.example",
                                    "scopes": ["read:cold"]})["agent_id"] for i in range(100)]
with concurrent.futures.ThreadPoolExecutor(8) as pool:
    print("\n".join(pool.map(lambda i: call(f"/v1/agents/{ids[i % 100]}/issue-token")["token"], range(20000))))
PY
}
