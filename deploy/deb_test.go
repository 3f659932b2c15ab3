package deploy

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/buildinfo"
	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// debFile is one entry of the package: where it lands, its mode as
// dpkg-deb -c prints it, and the checkout file it must equal (empty: the
// test looks at it otherwise).
type debFile struct {
	path, mode, source string
}

// debFiles is everything the package installs, nothing more.
var debFiles = []debFile{
	{"/usr/bin/wlproj", "-rwxr-xr-x", ""},
	{"/usr/lib/systemd/system/wlproj@.service", "-rw-r--r--", unitFile},
	{"/usr/lib/sysusers.d/wlproj.conf", "-rw-r--r--", "deb/sysusers.conf"},
	{"/etc/wlproj/wlproj.env.example", "-rw-r-----", envExampleFile},
	{"/usr/share/wlproj/roles.sql", "-rw-r--r--", "sql/roles.sql"},
	{"/usr/share/wlproj/grafana/wlproj.json", "-rw-r--r--", dashboardFile},
	{"/usr/share/wlproj/prometheus/alerts.yml", "-rw-r--r--", alertsFile},
	{"/usr/share/doc/wlproj/copyright", "-rw-r--r--", "deb/copyright"},
	{"/usr/share/lintian/overrides/wlproj", "-rw-r--r--", "deb/lintian-overrides"},
	{"/usr/share/doc/wlproj/changelog.gz", "-rw-r--r--", ""},
}

// TestDebPackage builds the package with `make deb`, lints it, reads its
// control data, unpacks it into a directory of its own and checks what
// landed there, runs its postinst against that directory, and verifies the
// unpacked unit. Nothing is installed on this machine: `dpkg -i` would add
// a user, a unit and files under /etc and /usr that a test must not leave
// behind, and would need a container to undo. `dpkg-deb -x` writes the
// same files into a temporary root instead, and the postinst's one change,
// the user, goes to that root's /etc/passwd (DPKG_ROOT, as dpkg sets it).
func TestDebPackage(t *testing.T) {
	t.Parallel()
	dpkgDeb := requireTool(t, "dpkg-deb")
	lintian := requireTool(t, "lintian")
	root := harness.Root(t)

	out := t.TempDir()
	make := exec.Command("make", "--no-print-directory", "deb", "DEB_DIR="+out)
	make.Dir = root
	b, err := make.CombinedOutput()
	require.NoError(t, err, "make deb:\n%s", b)

	version := scriptOutput(t, root, "scripts/version.sh")
	debVersion := scriptOutput(t, root, "scripts/version.sh", "--deb")
	pkg := filepath.Join(out, "wlproj_"+debVersion+"_"+runtime.GOARCH+".deb")
	entries, err := os.ReadDir(out)
	require.NoError(t, err)
	require.Len(t, entries, 1, "make deb leaves the package alone in DEB_DIR")
	require.FileExists(t, pkg)

	t.Run("lintian reports no errors", func(t *testing.T) {
		cmd := exec.Command(lintian, "--fail-on", "error", pkg)
		b, err := cmd.CombinedOutput()
		t.Logf("lintian:\n%s", b)
		require.NoError(t, err, "lintian fails on errors")
		for line := range strings.SplitSeq(string(b), "\n") {
			require.False(t, strings.HasPrefix(line, "E: "), "lintian error: %s", line)
		}
	})

	t.Run("control data", func(t *testing.T) {
		fields := run(t, dpkgDeb, "-f", pkg, "Package", "Version", "Architecture", "Depends", "Maintainer", "Description")
		require.Contains(t, fields, "Package: wlproj\n")
		require.Contains(t, fields, "Version: "+debVersion+"\n")
		require.Contains(t, fields, "Architecture: "+runtime.GOARCH+"\n")
		require.Contains(t, fields, "Depends: systemd-sysusers\n")

		require.Equal(t, "/etc/wlproj/wlproj.env.example\n", run(t, dpkgDeb, "-I", pkg, "conffiles"),
			"the env example is the one conffile: dpkg keeps an operator's edits to it")

		// Nothing is enabled or started by any maintainer script, and an
		// upgrade restarts nothing: the operator restarts one at a time.
		for _, script := range []string{"postinst", "prerm", "postrm"} {
			text := run(t, dpkgDeb, "-I", pkg, script)
			for _, verb := range []string{"enable", "start", "restart", "reload-or-restart", "try-restart"} {
				for _, tool := range []string{"systemctl", "deb-systemd-invoke", "deb-systemd-helper", "invoke-rc.d"} {
					require.NotRegexp(t, tool+`\b[^\n]*\s`+verb+`\b`, text, "%s: %s %s", script, tool, verb)
				}
			}
		}
	})

	t.Run("file list", func(t *testing.T) {
		listing := run(t, dpkgDeb, "-c", pkg)
		got := map[string]string{}
		sc := bufio.NewScanner(strings.NewReader(listing))
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			require.GreaterOrEqual(t, len(f), 6, "dpkg-deb -c line %q", sc.Text())
			if strings.HasPrefix(f[0], "d") {
				if f[5] == "./etc/wlproj/" {
					// It will hold the replicas' credentials: no one but root
					// (and, after postinst, group wlproj) may list it.
					require.Equal(t, "drwxr-x---", f[0], "/etc/wlproj")
				}
				continue
			}
			require.Equal(t, "root/root", f[1], "%s is owned by root", f[5])
			got[strings.TrimPrefix(f[5], ".")] = f[0]
		}
		want := map[string]string{}
		for _, f := range debFiles {
			want[f.path] = f.mode
		}
		require.Equal(t, want, got)
	})

	dest := t.TempDir()
	run(t, dpkgDeb, "-x", pkg, dest)

	t.Run("unpacked files", func(t *testing.T) {
		for _, f := range debFiles {
			if f.source == "" {
				continue
			}
			want, err := os.ReadFile(f.source)
			require.NoError(t, err)
			have, err := os.ReadFile(filepath.Join(dest, f.path))
			require.NoError(t, err)
			require.Equal(t, string(want), string(have), "%s is %s as in the checkout", f.path, f.source)
		}

		zr, err := os.Open(filepath.Join(dest, "/usr/share/doc/wlproj/changelog.gz"))
		require.NoError(t, err)
		defer zr.Close()
		gz, err := gzip.NewReader(zr)
		require.NoError(t, err)
		changelog, err := io.ReadAll(gz)
		require.NoError(t, err)
		want, err := os.ReadFile("deb/changelog")
		require.NoError(t, err)
		require.Equal(t, string(want), string(changelog))

		unit := string(mustRead(t, filepath.Join(dest, "/usr/lib/systemd/system/wlproj@.service")))
		require.Contains(t, unit, "\nExecStart=/usr/bin/wlproj run\n", "the unit starts the packaged binary")
		require.Contains(t, unit, "\nUser=wlproj\n", "the unit runs as the user postinst creates")
	})

	t.Run("Apache-2.0, in the copyright file and the checkout", func(t *testing.T) {
		copyright := string(mustRead(t, filepath.Join(dest, "/usr/share/doc/wlproj/copyright")))
		require.Contains(t, copyright, "\nFiles: *\nCopyright: 2026 the wlproj authors\nLicense: Apache-2.0\n")
		require.Contains(t, copyright, "/usr/share/common-licenses/Apache-2.0")
		require.NotContains(t, strings.ToLower(copyright), "all rights")
		license := string(mustRead(t, filepath.Join(root, "LICENSE")))
		require.Contains(t, license, "Apache License\n                           Version 2.0, January 2004")
		require.Contains(t, license, "END OF TERMS AND CONDITIONS")
		if common, err := os.ReadFile("/usr/share/common-licenses/Apache-2.0"); err == nil {
			require.Equal(t, string(common), license, "LICENSE is the license's full text")
		}
		require.Contains(t, string(mustRead(t, filepath.Join(root, "README.md"))), "Apache License, Version 2.0: see [LICENSE](LICENSE)")
	})

	t.Run("the packaged binary says its version", func(t *testing.T) {
		bin := filepath.Join(dest, "/usr/bin/wlproj")
		var info buildinfo.Info
		require.NoError(t, json.Unmarshal([]byte(run(t, bin, "version", "--json")), &info))
		require.Equal(t, version, info.Version, "the version make deb stamped")
		require.Equal(t, strings.TrimSpace(run(t, "git", "-C", root, "rev-parse", "HEAD")), info.Revision)
		require.Equal(t, runtime.Version(), info.GoVersion)
		require.NotEqual(t, "unknown", info.BuildDate)
		require.Equal(t, info.String()+"\n", run(t, bin, "--version"))
	})

	t.Run("postinst creates the wlproj user in the root it is given", func(t *testing.T) {
		if _, err := exec.LookPath("systemd-sysusers"); err != nil {
			t.Skip("systemd-sysusers is not installed (scripts/tools.sh installs systemd); the postinst needs it")
		}
		postinst := filepath.Join(t.TempDir(), "postinst")
		require.NoError(t, os.WriteFile(postinst, []byte(run(t, dpkgDeb, "-I", pkg, "postinst")), 0o755))
		require.NoError(t, os.MkdirAll(filepath.Join(dest, "etc"), 0o755))
		cmd := exec.Command(postinst, "configure", "")
		cmd.Env = append(os.Environ(), "DPKG_ROOT="+dest, "DPKG_MAINTSCRIPT_NAME=postinst", "DPKG_MAINTSCRIPT_PACKAGE=wlproj")
		b, err := cmd.CombinedOutput()
		require.NoError(t, err, "postinst configure:\n%s", b)

		user := passwdEntry(t, filepath.Join(dest, "etc/passwd"), "wlproj")
		require.NotNil(t, user, "postinst made no wlproj user in %s/etc/passwd", dest)
		require.Equal(t, "/nonexistent", user[5])
		require.Equal(t, "/usr/sbin/nologin", user[6])
		group := passwdEntry(t, filepath.Join(dest, "etc/group"), "wlproj")
		require.NotNil(t, group, "no wlproj group")
		requireOwner(t, filepath.Join(dest, "etc/wlproj"), 0o750, 0, group[2])

		// A second configure (an upgrade from this version) keeps the one user.
		cmd = exec.Command(postinst, "configure", debVersion)
		cmd.Env = append(os.Environ(), "DPKG_ROOT="+dest)
		b, err = cmd.CombinedOutput()
		require.NoError(t, err, "postinst configure again:\n%s", b)
		users := 0
		for line := range strings.SplitSeq(string(mustRead(t, filepath.Join(dest, "etc/passwd"))), "\n") {
			if strings.HasPrefix(line, "wlproj:") {
				users++
			}
		}
		require.Equal(t, 1, users)
	})

	// A root of its own for each of the next cases, the package unpacked
	// in it, and a maintainer script run against it as dpkg runs it.
	unpacked := func(t *testing.T, passwd, group string) string {
		t.Helper()
		dir := t.TempDir()
		run(t, dpkgDeb, "-x", pkg, dir)
		require.NoError(t, os.WriteFile(filepath.Join(dir, "etc/passwd"), []byte("root:x:0:0:root:/root:/bin/sh\n"+passwd), 0o644))
		require.NoError(t, os.WriteFile(filepath.Join(dir, "etc/group"), []byte("root:x:0:\n"+group), 0o644))
		return dir
	}
	script := func(t *testing.T, dir, name string, args ...string) (string, error) {
		t.Helper()
		path := filepath.Join(t.TempDir(), name)
		require.NoError(t, os.WriteFile(path, []byte(run(t, dpkgDeb, "-I", pkg, name)), 0o755))
		cmd := exec.Command(path, args...)
		cmd.Env = append(os.Environ(), "DPKG_ROOT="+dir)
		b, err := cmd.CombinedOutput()
		return string(b), err
	}

	// A wlproj account that is someone's login would run the daemon and
	// could read its passwords from /proc: refused, nothing changed.
	// Before, systemd-sysusers took it as it was, without a word.
	t.Run("postinst refuses a wlproj account that is not a system account", func(t *testing.T) {
		const login = "wlproj:x:1001:1001:Wl Person:/home/wlproj:/bin/bash\n"
		dir := unpacked(t, login, "wlproj:x:1001:\n")
		out, err := script(t, dir, "postinst", "configure", "")
		require.Error(t, err, "postinst configure:\n%s", out)
		require.Contains(t, out, "a user named wlproj already exists with uid 1001, which is not a\nsystem account")
		require.Contains(t, out, "sudo dpkg --configure wlproj")
		require.Equal(t, "root:x:0:0:root:/root:/bin/sh\n"+login, string(mustRead(t, filepath.Join(dir, "etc/passwd"))))
		requireOwner(t, filepath.Join(dir, "etc/wlproj"), 0o750, 0, "0")

		// An upgrade refuses it too: an earlier version took it silently.
		out, err = script(t, dir, "postinst", "configure", "0.1.0")
		require.Error(t, err, "postinst configure 0.1.0:\n%s", out)
	})

	t.Run("postinst names the existing system account it uses", func(t *testing.T) {
		if _, err := exec.LookPath("systemd-sysusers"); err != nil {
			t.Skip("systemd-sysusers is not installed (scripts/tools.sh installs systemd); the postinst needs it")
		}
		const system = "wlproj:x:998:998::/nonexistent:/usr/sbin/nologin\n"
		dir := unpacked(t, system, "wlproj:x:998:\n")
		out, err := script(t, dir, "postinst", "configure", "")
		require.NoError(t, err, "postinst configure:\n%s", out)
		require.Contains(t, out, "wlproj: using the existing system user wlproj (uid 998)")
		require.Equal(t, "root:x:0:0:root:/root:/bin/sh\n"+system, string(mustRead(t, filepath.Join(dir, "etc/passwd"))))
		requireOwner(t, filepath.Join(dir, "etc/wlproj"), 0o750, 0, "998")

		out, err = script(t, dir, "postinst", "configure", "0.1.0")
		require.NoError(t, err, "postinst configure 0.1.0:\n%s", out)
		require.NotContains(t, out, "using the existing", "an upgrade says nothing of the user it made")
	})

	// Purge removes the conffile (dpkg does, before postrm); the env files
	// an operator made hold credentials and are theirs: kept, and named.
	t.Run("postrm purge names the files it leaves in /etc/wlproj", func(t *testing.T) {
		dir := unpacked(t, "", "")
		require.NoError(t, os.Remove(filepath.Join(dir, "etc/wlproj/wlproj.env.example")))
		for _, name := range []string{"a.env", "console.key"} {
			require.NoError(t, os.WriteFile(filepath.Join(dir, "etc/wlproj", name), []byte("DATABASE_URL=postgres://x:pw@h/db\n"), 0o600))
		}
		out, err := script(t, dir, "postrm", "purge")
		require.NoError(t, err, "postrm purge:\n%s", out)
		require.Contains(t, out, "purge left these files")
		require.Contains(t, out, "\n  /etc/wlproj/a.env\n  /etc/wlproj/console.key\n")
		require.NotContains(t, out, "pw@", "it names the files, never what is in them")
		require.FileExists(t, filepath.Join(dir, "etc/wlproj/a.env"))

		require.NoError(t, os.RemoveAll(filepath.Join(dir, "etc/wlproj")))
		out, err = script(t, dir, "postrm", "purge")
		require.NoError(t, err)
		require.Empty(t, out, "nothing left, nothing said")
	})

	t.Run("systemd-analyze verify on the unpacked unit", func(t *testing.T) {
		if _, err := exec.LookPath("systemd-analyze"); err != nil {
			t.Skip("systemd-analyze is not installed (scripts/tools.sh installs systemd); the unit is not verified")
		}
		// verify wants ExecStart's binary to exist; it is in the temporary
		// root, so a copy of the unit points there. The rest is as shipped.
		unit := string(mustRead(t, filepath.Join(dest, "/usr/lib/systemd/system/wlproj@.service")))
		const execStart = "ExecStart=/usr/bin/wlproj run"
		require.Contains(t, unit, execStart)
		mapped := strings.Replace(unit, execStart, "ExecStart="+filepath.Join(dest, "/usr/bin/wlproj")+" run", 1)
		require.Empty(t, verifyUnit(t, mapped), "systemd-analyze verify complains about the packaged unit")
	})
}

// scriptOutput runs a checkout script and returns its one line.
func scriptOutput(t *testing.T, root, script string, args ...string) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(root, script), args...)
	b, err := cmd.Output()
	require.NoError(t, err, "%s %v", script, args)
	return strings.TrimSpace(string(b))
}

// run runs a command and returns its standard output; it fails the test,
// with standard error, if the command does.
func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "%s %v: %s", name, args, stderr.String())
	return stdout.String()
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return b
}

// passwdEntry returns the colon-separated fields of name's line in a
// passwd or group file, or nil.
func passwdEntry(t *testing.T, path, name string) []string {
	t.Helper()
	for line := range strings.SplitSeq(string(mustRead(t, path)), "\n") {
		if f := strings.Split(line, ":"); f[0] == name {
			return f
		}
	}
	return nil
}

// requireOwner checks path's mode, owner uid and group id (as written in
// a group file).
func requireOwner(t *testing.T, path string, mode os.FileMode, uid uint32, gid string) {
	t.Helper()
	info, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, mode, info.Mode().Perm(), "%s mode", path)
	st, ok := info.Sys().(*syscall.Stat_t)
	require.True(t, ok)
	require.Equal(t, uid, st.Uid, "%s owner", path)
	require.Equal(t, gid, strconv.Itoa(int(st.Gid)), "%s group", path)
}
