#!/usr/bin/env bash
# Installs the programs the tests call, from Debian, when missing: promtool
# (prometheus), systemd-analyze (systemd) and chromium for the console's
# browser tests. Only Debian's chromium: the tests never download a browser
# build of their own.
set -euo pipefail
lean=() # installed without their recommends
command -v promtool >/dev/null || lean+=(prometheus)
command -v systemd-analyze >/dev/null || lean+=(systemd)
full=() # chromium wants its recommended fonts to render pages
[ -x /usr/bin/chromium ] || full+=(chromium)
[ ${#lean[@]} = 0 ] && [ ${#full[@]} = 0 ] && exit 0

as_root=()
if [ "$(id -u)" != 0 ]; then
	if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
		as_root=(sudo -n)
	else
		echo "tools: missing ${lean[*]} ${full[*]}; run as root: apt-get install ${lean[*]} ${full[*]}" >&2
		exit 1
	fi
fi
echo "tools: installing ${lean[*]} ${full[*]} from Debian" >&2
apt=("${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get)
"${apt[@]}" update -qq
# Installing the prometheus package must not leave a server running: a
# policy-rc.d that refuses service starts, unless the machine already has one.
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
	printf '#!/bin/sh\nexit 101\n' | "${as_root[@]}" tee "$policy" >/dev/null
	"${as_root[@]}" chmod +x "$policy"
	trap '"${as_root[@]}" rm -f "$policy"' EXIT
fi
[ ${#lean[@]} = 0 ] || "${apt[@]}" install -y -qq --no-install-recommends "${lean[@]}" >/dev/null
[ ${#full[@]} = 0 ] || "${apt[@]}" install -y -qq "${full[@]}" >/dev/null
command -v promtool >/dev/null && command -v systemd-analyze >/dev/null && [ -x /usr/bin/chromium ]
