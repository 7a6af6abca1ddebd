#!/usr/bin/env bash
# Install what the tests need from Debian when it is missing: a Java 17+ runtime for
# Spark, the etcd server binary for the integration tests, and a PostgreSQL server and
# client (psql) for the PostgreSQL source tests, which start their own throwaway clusters.
set -euo pipefail
need=()
java_major() {
  java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n 1
}
if ! command -v java >/dev/null 2>&1 || [ "$(java_major)" -lt 17 ] 2>/dev/null; then
  need+=(openjdk-17-jre-headless)
fi
if ! command -v etcd >/dev/null 2>&1; then
  need+=(etcd-server)
fi
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  need+=(postgresql)
fi
if ! command -v psql >/dev/null 2>&1; then
  need+=(postgresql-client)
fi
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
echo "installing ${need[*]} (Debian) ..."
export DEBIAN_FRONTEND=noninteractive
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
"${sudo_cmd[@]}" apt-get update -qq
# Debian's etcd-server and postgresql would start system services (and postgresql would
# create a cluster); the tests start their own. policy-rc.d stops any service from starting
# during the install.
policy=/usr/sbin/policy-rc.d
made_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' | "${sudo_cmd[@]}" tee "$policy" >/dev/null
  "${sudo_cmd[@]}" chmod +x "$policy"
  made_policy=1
fi
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
if command -v systemctl >/dev/null 2>&1; then
  "${sudo_cmd[@]}" systemctl disable --now etcd >/dev/null 2>&1 || true
fi
if [ "$made_policy" -eq 1 ]; then
  "${sudo_cmd[@]}" rm -f "$policy"
fi
if command -v systemctl >/dev/null 2>&1; then
  "${sudo_cmd[@]}" systemctl disable --now postgresql >/dev/null 2>&1 || true
fi
