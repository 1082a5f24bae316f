#!/usr/bin/env bash
# `make run`: start the gateway with Caddyfile.example (embedded Badger under
# ./data), make the demo image (imported only when the demo binary changed),
# create one demo sandbox through the API and print how to use it. Ctrl-C
# stops Caddy and ends with status 0; sandboxes stay (paused/stopped ones are
# woken by the next request after a restart).
set -euo pipefail
cd "$(dirname "$0")/.."

# In a terminal, job control: Caddy runs as the terminal's foreground job
# once started, so Ctrl-C reaches Caddy alone, not make or this script, and
# make sees this script end with Caddy's status (0 after a graceful stop)
# instead of dying of the signal itself ("make: *** … Interrupt/Error").
interactive=
if [ -t 0 ]; then
	interactive=1
	set -m
fi

preview_port=${SANDWAKE_PREVIEW_PORT:-8080}
demo=${SANDWAKE_DEMO_ID:-demo}
api_port=${SANDWAKE_API_PORT:-8081}
image=${SANDWAKE_DEMO_IMAGE:-sandwake-demo}
export SANDWAKE_PREVIEW_PORT=$preview_port SANDWAKE_API_PORT=$api_port SANDWAKE_DEMO_IMAGE=$image
mkdir -p data
chmod 700 data
if [ -n "${SANDWAKE_API_TOKEN:-}" ]; then
	(umask 077; printf %s "$SANDWAKE_API_TOKEN" > data/api-token)
else
	# A token of this checkout, kept so the printed commands stay valid.
	[ -s data/api-token ] || (umask 077; head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > data/api-token)
	SANDWAKE_API_TOKEN=$(cat data/api-token)
fi
export SANDWAKE_API_TOKEN

# The egress firewall needs root (CAP_NET_ADMIN) on the Docker host; as
# another user the demo runs without it, and says so.
if [ -z "${SANDWAKE_EGRESS:-}" ] && [ "$(id -u)" != 0 ]; then
	export SANDWAKE_EGRESS=unenforced
	echo "note: not root, so sandboxes run without the egress firewall (egress unenforced); run as root to enforce it"
fi

# A port already taken: say which variable moves it, before Caddy's raw
# "address already in use".
admin_addr=${CADDY_ADMIN:-localhost:2019}
for spec in "$preview_port SANDWAKE_PREVIEW_PORT" "$api_port SANDWAKE_API_PORT" "${admin_addr##*:} CADDY_ADMIN"; do
	set -- $spec
	if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then
		case $2 in
		CADDY_ADMIN) echo "port $1 (Caddy's admin endpoint) is in use: set CADDY_ADMIN to a free address, e.g. CADDY_ADMIN=localhost:2029 make run" >&2 ;;
		*) echo "port $1 is in use: set $2 to a free port, e.g. $2=$(( $1 + 10000 )) make run" >&2 ;;
		esac
		exit 1
	fi
done

go run ./internal/demo
api="http://localhost:$api_port"

bin/caddy run --config Caddyfile.example --adapter caddyfile &
caddy_pid=$!
# Whatever ends this script stops Caddy with it (bash runs the EXIT trap
# when a signal ends it too, even while Caddy is the foreground job). Without
# a terminal, SIGINT stops Caddy gracefully and the script ends with status 0.
# The trap keeps the script's exit status: under set -e, its kill of a Caddy
# already gone would otherwise end the script with status 1 ("Error 1").
trap 'status=$?; kill $caddy_pid 2>/dev/null || true; wait $caddy_pid 2>/dev/null || true; exit $status' EXIT
if [ -z "$interactive" ]; then
	trap 'kill -INT $caddy_pid 2>/dev/null || true; wait $caddy_pid 2>/dev/null || true; echo "sandwake stopped."; exit 0' INT
fi

for _ in $(seq 1 100); do
	if curl -fsS "$api/v1/readyz" >/dev/null 2>&1; then break; fi
	if ! kill -0 $caddy_pid 2>/dev/null; then echo "caddy exited" >&2; exit 1; fi
	sleep 0.1
done
curl -fsS "$api/v1/readyz" >/dev/null

auth=(-H "Authorization: Bearer $SANDWAKE_API_TOKEN")
create_demo() {
	curl -sS -o data/create-answer -w '%{http_code}' "${auth[@]}" -X POST "$api/v1/sandboxes" \
		-d '{"id":"'"$demo"'","image":"'"$image"':latest","ports":[8080],"memory_mb":64}'
}
if ! curl -fsS "${auth[@]}" "$api/v1/sandboxes/$demo" >/dev/null 2>&1; then
	echo "creating the demo sandbox…"
	code=$(create_demo)
	if [ "$code" = 409 ] && grep -q id_taken data/create-answer; then
		# The demo of an earlier run whose store (data/) was deleted: its
		# container is another gateway instance's now. It was make run's
		# own, so it goes.
		echo "removing the demo sandbox an earlier run left (its store under data/ is gone)…"
		go run ./internal/demo leftover "$demo"
		code=$(create_demo)
	fi
	if [ "$code" != 201 ]; then
		echo "creating the demo sandbox failed ($code): $(cat data/create-answer)" >&2
		echo "to start over: make clean-demo, then make run" >&2
		exit 1
	fi
	rm -f data/create-answer
fi

cat <<MSG

  sandwake is running.

  Demo sandbox:   http://s-$demo-8080.preview.localhost:$preview_port/
  Dashboard:      $api/   (sign in with the token in data/api-token)
  API:            $api   (bearer token: \$SANDWAKE_API_TOKEN, or the file data/api-token)

  Stop it, then open the URL again: you see the warming page, then the app.
    TOKEN=\$(cat data/api-token)
    curl -H "Authorization: Bearer \$TOKEN" -X POST $api/v1/sandboxes/$demo/stop
    curl -H "Authorization: Bearer \$TOKEN" -X POST $api/v1/sandboxes/$demo/pause
    curl -H "Authorization: Bearer \$TOKEN" -X POST $api/v1/sandboxes/$demo/wake
    curl -H "Authorization: Bearer \$TOKEN" $api/v1/sandboxes

  Or with the CLI, in another shell in this directory:
    export SANDWAKE_API=$api SANDWAKE_API_TOKEN=\$(cat data/api-token)
    bin/caddy sandwake ls
    bin/caddy sandwake stop $demo
    bin/caddy sandwake wake $demo
    bin/caddy sandwake events --sandbox $demo

  Ctrl-C stops the gateway. To start over: make clean-demo (removes the demo
  sandbox, its image and data/), then make run.

MSG
status=0
if [ -n "$interactive" ]; then
	# Caddy becomes the foreground job: Ctrl-C goes to it alone.
	fg %+ >/dev/null || status=$?
else
	wait $caddy_pid || status=$?
fi
if [ "$status" -ne 0 ]; then
	echo "caddy exited with status $status" >&2
	exit "$status"
fi
echo "sandwake stopped."
