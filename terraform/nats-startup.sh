#!/bin/bash
# Startup script of a mesh NATS server (Container-Optimized OS; nats.tf).
# It runs at every boot: mounts the data disk (formatting it the first
# time), fetches the mesh's NATS configuration from Secret Manager with the
# VM's service account, writes this server's configuration (cluster routes,
# JetStream, WebSocket, TLS), opens the ports in COS's host firewall and
# (re)starts the official NATS image. Its output is in the serial console
# and Cloud Logging.
set -euo pipefail

md() { curl -fsS -H 'Metadata-Flavor: Google' "http://metadata.google.internal/computeMetadata/v1/$1"; }
attr() { md "instance/attributes/$1"; }

PROJECT="$(md project/project-id)"
NAME="$(attr nats-server-name)"
CLUSTER="$(attr nats-cluster-name)"
ROUTES="$(attr nats-routes)"
IMAGE="$(attr nats-image)"
TLS="$(attr nats-tls)"
MAX_FILE="$(attr nats-max-file)"

# The data disk: JetStream's store, the resolver's account JWTs and the
# configuration. Formatted once, mounted at every boot.
# (NATS_DATA_DEVICE and NATS_DATA_DIR exist for terraform/startup_test.go.)
DEV="${NATS_DATA_DEVICE:-/dev/disk/by-id/google-nats-data}"
DATA="${NATS_DATA_DIR:-/mnt/disks/nats}"
if ! blkid "$DEV" >/dev/null 2>&1; then
  mkfs.ext4 -m 0 -E lazy_itable_init=0,lazy_journal_init=0,discard "$DEV"
fi
mkdir -p "$DATA"
mountpoint -q "$DATA" || mount -o discard,defaults "$DEV" "$DATA"
umask 077
mkdir -p "$DATA/conf" "$DATA/jetstream" "$DATA/jwt"

# secret NAME prints the latest version of a Secret Manager secret.
secret() {
  local token
  token="$(md instance/service-accounts/default/token | sed -n 's/.*"access_token": *"\([^"]*\)".*/\1/p')"
  curl -fsS -H "Authorization: Bearer $token" \
    "https://secretmanager.googleapis.com/v1/projects/$PROJECT/secrets/$1/versions/latest:access" |
    sed -n 's/.*"data": *"\([^"]*\)".*/\1/p' | base64 -d
}

# fetch NAME FILE waits until the secret has a version (meshd cloud init
# adds mesh-nats-config; docs/deploy.md), then writes it to FILE.
fetch() {
  until secret "$1" >"$2.tmp" && [ -s "$2.tmp" ]; do
    echo "nats-startup: secret $1 has no readable version yet (run meshd cloud init, docs/deploy.md); retrying in 30s" >&2
    sleep 30
  done
  mv "$2.tmp" "$2"
}

# The operator JWT, the system account, the full resolver (its dir under
# /data) and its preload: the same for every server.
fetch mesh-nats-config "$DATA/conf/mesh.conf"

ROUTE_LIST=""
IFS=',' read -ra route_urls <<<"$ROUTES"
for r in "${route_urls[@]}"; do
  ROUTE_LIST="$ROUTE_LIST    \"$r\"
"
done

if [ "$TLS" = "true" ]; then
  # One PEM bundle: the certificate chain for the NATS host and its key.
  fetch mesh-nats-tls "$DATA/conf/tls.pem"
  TLS_CONF='tls {
  cert_file: "/data/conf/tls.pem"
  key_file: "/data/conf/tls.pem"
}
# Agents dial tls:// through the load balancer; workers and functions dial
# the private addresses inside the VPC without TLS.
allow_non_tls: true'
  WS_TLS='tls {
    cert_file: "/data/conf/tls.pem"
    key_file: "/data/conf/tls.pem"
  }'
else
  TLS_CONF='# TLS is off (var.nats_tls): for trying a mesh out only.'
  WS_TLS='no_tls: true'
fi

cat >"$DATA/conf/nats.conf.tmp" <<EOF
# Written by nats-startup.sh at boot; edits are lost at the next boot.
server_name: "$NAME"
listen: "0.0.0.0:4222"
http: "0.0.0.0:8222"
lame_duck_duration: "30s"
lame_duck_grace_period: "5s"

jetstream {
  store_dir: "/data/jetstream"
  max_file_store: $MAX_FILE
  max_memory_store: 256MB
}

cluster {
  name: "$CLUSTER"
  listen: "0.0.0.0:6222"
  # Agents reach the servers only through the load balancer: never hand
  # them the private addresses of the other servers.
  no_advertise: true
  routes: [
$ROUTE_LIST  ]
}

websocket {
  port: 4443
  $WS_TLS
}

$TLS_CONF

include "mesh.conf"
EOF
mv "$DATA/conf/nats.conf.tmp" "$DATA/conf/nats.conf"

# COS drops inbound traffic by default.
for port in 4222 4443 6222 8222; do
  iptables -w -C INPUT -p tcp --dport "$port" -j ACCEPT 2>/dev/null ||
    iptables -w -A INPUT -p tcp --dport "$port" -j ACCEPT
done

docker rm -f nats >/dev/null 2>&1 || true
# The working directory is the disk, so a relative resolver dir lands there.
docker run -d --name nats --restart unless-stopped --network host \
  -v "$DATA:/data" -w /data "$IMAGE" --config /data/conf/nats.conf
echo "nats-startup: $NAME started ($IMAGE)"
