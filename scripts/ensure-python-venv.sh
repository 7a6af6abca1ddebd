#!/usr/bin/env bash
# Create the project's virtual environment, installing Debian's venv module if the
# interpreter lacks it (a bare Debian python3 does).
set -euo pipefail
python="$1"
venv="$2"
if [ -x "$venv/bin/python" ]; then
  exit 0
fi
if ! "$python" -c 'import ensurepip, venv' >/dev/null 2>&1; then
  echo "installing python3-venv (Debian) ..."
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq python3-venv >/dev/null
fi
"$python" -m venv "$venv"
