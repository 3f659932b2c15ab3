#!/usr/bin/env bash
# Prints the version `make build` and `make deb` stamp into wlproj: the
# nearest v-tag without its v (1.2.3, or 1.2.3-4-gabc1234 four commits
# later), else 0.0.0-g<commit> while the history has no tag, with -dirty
# when tracked files have changes; outside a checkout, 0.0.0.
# With --deb, the same as a Debian version: 1.2.3+4.gabc1234.dirty sorts
# after 1.2.3 (a plain hyphen would need a Debian revision).
set -euo pipefail
cd "$(dirname "$0")/.."
if v=$(git describe --tags --match 'v[0-9]*' --dirty 2>/dev/null); then
	v=${v#v}
elif v=$(git describe --always --dirty 2>/dev/null); then
	v=0.0.0-g$v
else
	v=0.0.0
fi
if [ "${1:-}" = --deb ]; then
	v=$(printf '%s' "$v" | sed 's/-/+/; s/-/./g')
fi
printf '%s\n' "$v"
