#!/usr/bin/env bash
# Install what the tests need from Debian when it is missing: a Java 17+ runtime for
# Spark and the etcd server binary for the integration tests.
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
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
echo "installing ${need[*]} (Debian) ..."
export DEBIAN_FRONTEND=noninteractive
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
"${sudo_cmd[@]}" apt-get update -qq
# Debian's etcd-server would start a system service; the tests start their own.
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
if command -v systemctl >/dev/null 2>&1; then
  "${sudo_cmd[@]}" systemctl disable --now etcd >/dev/null 2>&1 || true
fi
