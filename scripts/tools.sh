#!/usr/bin/env bash
# Installs the command-line tools the tests call, from Debian, when missing:
# promtool (prometheus) and systemd-analyze (systemd).
set -euo pipefail
need=()
command -v promtool >/dev/null || need+=(prometheus)
command -v systemd-analyze >/dev/null || need+=(systemd)
[ ${#need[@]} = 0 ] && exit 0

as_root=()
if [ "$(id -u)" != 0 ]; then
	if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
		as_root=(sudo -n)
	else
		echo "tools: missing ${need[*]}; run as root: apt-get install --no-install-recommends ${need[*]}" >&2
		exit 1
	fi
fi
echo "tools: installing ${need[*]} from Debian" >&2
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
# Installing the prometheus package must not leave a server running: a
# policy-rc.d that refuses service starts, unless the machine already has one.
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
	printf '#!/bin/sh\nexit 101\n' | "${as_root[@]}" tee "$policy" >/dev/null
	"${as_root[@]}" chmod +x "$policy"
	trap '"${as_root[@]}" rm -f "$policy"' EXIT
fi
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
command -v promtool >/dev/null && command -v systemd-analyze >/dev/null
