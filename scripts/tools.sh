#!/usr/bin/env bash
# Installs the command-line tools the tests call, from Debian, when missing:
# promtool (prometheus) and systemd-analyze (systemd).
set -euo pipefail
need=()
command -v promtool >/dev/null || need+=(prometheus)
command -v systemd-analyze >/dev/null || need+=(systemd)
[ ${#need[@]} = 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then echo "tools: please install ${need[*]}" >&2; exit 1; fi
echo "tools: installing ${need[*]} from Debian" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# Installing the prometheus package must not leave a server running.
printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d
trap 'rm -f /usr/sbin/policy-rc.d' EXIT
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
