#!/usr/bin/env bash
# Installs the programs the tests call, from Debian, when missing: promtool
# (prometheus), systemd-analyze (systemd), lintian and dpkg-deb for the
# package test, chromium for the console's browser tests, and podman for
# `make image` and the image's tests. Only Debian's chromium: the tests
# never download a browser build of their own. Then nFPM, as
# `scripts/tools.sh nfpm` alone does.
#
# `scripts/tools.sh podman` installs podman alone, with what `make image`
# and the containers need from Debian: runc (deploy/image/containers.conf
# asks for it; Debian's podman would take crun), netavark (the network
# stack podman's common files depend on; the containers use the host's
# network) and ca-certificates (copied into the image). No recommends:
# no buildah, slirp4netns or fuse-overlayfs, which rootful podman with host
# networking does not use.
#
# Then Dex for the console's sign-in tests, as `scripts/tools.sh dex` does.
#
# `scripts/tools.sh nfpm` installs nFPM, the packager of `make deb`, with go
# install into .cache/ (never onto the machine's PATH) and prints its path.
# nFPM because it builds a .deb from a list of files without debhelper, a
# debian/ tree or a Debian build chroot, and is a Go module like wlproj.
# Pinned: v2.45.2 is the newest release that builds with the project's Go
# (1.26); a newer one needs a newer toolchain.
set -euo pipefail
cd "$(dirname "$0")/.."
NFPM_VERSION=v2.45.2
# gotestsum runs make test's go test and keeps its -json events for the
# summary (tools/testsummary); installed as nFPM is.
GOTESTSUM_VERSION=v1.13.0
# goinstall NAME PACKAGE VERSION installs a Go program into
# .cache/NAME/VERSION/ once, and prints its path.
goinstall() {
	local bin=.cache/$1/$3/$1
	if [ ! -x "$bin" ]; then
		echo "tools: go install $1@$3" >&2
		GOBIN="$PWD/${bin%/*}" GOFLAGS=-mod=mod go install "$2@$3" >&2
	fi
	echo "$PWD/$bin"
}
nfpm() { goinstall nfpm github.com/goreleaser/nfpm/v2/cmd/nfpm "$NFPM_VERSION"; }
gotestsum() { goinstall gotestsum gotest.tools/gotestsum "$GOTESTSUM_VERSION"; }
# `scripts/tools.sh dex` builds Dex, the OpenID provider the console's
# sign-in tests start (internal/testkit/dex), into .cache/bin/dex and prints
# its path. Built from its own module, internal/testkit/dex/build, which
# pins Dex (a pseudo-version: Dex publishes no module release) and says why
# it has its own main. Rebuilt when that module's files change: the stamp
# beside the binary holds their digest.
dex() {
	local src=internal/testkit/dex/build bin=.cache/bin/dex sum
	sum=$(cat "$src/go.mod" "$src/go.sum" "$src/main.go" | sha256sum | cut -c1-16)
	if [ ! -x "$bin" ] || [ "$(cat "$bin.stamp" 2>/dev/null)" != "$sum" ]; then
		echo "tools: go build dex ($src)" >&2
		mkdir -p "${bin%/*}"
		(cd "$src" && go build -o "$OLDPWD/$bin" .) >&2
		echo "$sum" >"$bin.stamp"
	fi
	echo "$PWD/$bin"
}
case "${1:-}" in
nfpm | gotestsum | dex)
	"$1"
	exit 0
	;;
esac

lean=() # installed without their recommends
full=() # with them
podman_missing() {
	command -v podman >/dev/null || lean+=(podman)
	command -v runc >/dev/null || lean+=(runc)
	dpkg -s netavark >/dev/null 2>&1 || lean+=(netavark)
	[ -f /etc/ssl/certs/ca-certificates.crt ] || lean+=(ca-certificates)
}
podman_missing
if [ "${1:-}" != podman ]; then
	nfpm >/dev/null
	gotestsum >/dev/null
	dex >/dev/null
	command -v promtool >/dev/null || lean+=(prometheus)
	command -v systemd-analyze >/dev/null || lean+=(systemd)
	command -v lintian >/dev/null || lean+=(lintian)
	command -v dpkg-deb >/dev/null || lean+=(dpkg)
	# chromium wants its recommended fonts to render pages
	[ -x /usr/bin/chromium ] || full+=(chromium)
fi
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
lean=() full=()
podman_missing
[ ${#lean[@]} = 0 ] || { echo "tools: still missing after the install: ${lean[*]}" >&2; exit 1; }
[ "${1:-}" = podman ] && exit 0
command -v promtool >/dev/null && command -v systemd-analyze >/dev/null && command -v lintian >/dev/null && [ -x /usr/bin/chromium ]
