#!/usr/bin/env bash
# Installs Debian's chromium for the console's browser tests
# (console/browser_test.go) when /usr/bin/chromium is missing. Only Debian's
# package: the tests never download a browser build of their own.
set -euo pipefail
[ -x /usr/bin/chromium ] && exit 0

as_root=()
if [ "$(id -u)" != 0 ]; then
	if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
		as_root=(sudo -n)
	else
		echo "browser: /usr/bin/chromium is missing; run as root: apt-get install chromium" >&2
		exit 1
	fi
fi
echo "browser: installing chromium from Debian" >&2
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
[ -x /usr/bin/chromium ]
