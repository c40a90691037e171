#!/usr/bin/env bash
# Install the system tools the deployment checks (tests/deploy/) run, on a fresh Debian
# bookworm machine, as root. Idempotent. Python tools (PyYAML, jsonschema,
# kubernetes-validate, grafana-foundation-sdk) come with the project's `test` extra.
#
#   promtool, prometheus  <- Debian package `prometheus` (2.42 in bookworm)
#   systemd-analyze       <- Debian package `systemd` (252 in bookworm)
#
# With CI set, tests/deploy fails (instead of skipping) when one of these is missing.
set -euo pipefail

if [[ $(id -u) -ne 0 ]]; then
    echo "install-tools.sh: run as root (apt-get)" >&2
    exit 1
fi

packages=()
command -v promtool >/dev/null && command -v prometheus >/dev/null || packages+=(prometheus)
command -v systemd-analyze >/dev/null || packages+=(systemd)

if ((${#packages[@]})); then
    # Keep the packages' maintainer scripts from starting services (no init system in a
    # CI container; the tests start their own Prometheus on a free loopback port).
    created_policy=0
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
        chmod 0755 /usr/sbin/policy-rc.d
        created_policy=1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${packages[@]}"
    if ((created_policy)); then
        rm -f /usr/sbin/policy-rc.d
    fi
fi

promtool --version 2>&1 | head -n 1
prometheus --version 2>&1 | head -n 1
systemd-analyze --version | head -n 1
