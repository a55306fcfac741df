#!/bin/sh
# Installs what the test suite needs and a fresh machine may lack. Fails
# loudly (non-zero) rather than letting tests skip.
set -e
need=""
command -v curl >/dev/null 2>&1 || need="$need curl"
if [ -n "$need" ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "tests/deps.sh: missing:$need (run as root to install them)" >&2
        exit 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $need
fi
