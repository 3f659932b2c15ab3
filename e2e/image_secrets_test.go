package e2e

// The runbook's podman section (Two replicas with podman), run as it says
// with Debian's podman against a Postgres that asks for passwords: the
// database password reaches the replicas only as a pgpass file on a
// mounted secret, the podman env files come from systemd env files with
// quoted values through the runbook's loop, and podman inspect shows no
// password.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// Passwords with what a shell or an env file could mangle: $ and ".
const (
	secretOwnerPassword   = `own$er "pw`
	secretRuntimePassword = `run$time "pw`
)

// podmanEnvLoop is the runbook's loop that writes a podman env file from a
// systemd one; %[1]s is the directory of the env files.
const podmanEnvLoop = `for r in a b; do ( set -a; . %[1]s/$r.env; umask 077
  for k in $(sed -n 's/^\([A-Za-z_][A-Za-z0-9_]*\)=.*/\1/p' %[1]s/$r.env); do printf '%%s=%%s\n' "$k" "${!k}"; done
  ) > %[1]s/$r.podman.env; done`

// passwordPostgres starts a Postgres of the test's own whose roles but the
// superuser log in with a password over TCP (scram-sha-256), with an empty
// database and roles.sql's roles; it returns the superuser's URL and the
// database's name.
func passwordPostgres(t *testing.T) (*harness.PGPair, string, string) {
	t.Helper()
	pg := harness.StartPGAlone(t)
	admin := pg.URL([]string{pg.Primary.Addr()})
	hba := "local all all trust\nhost all postgres 127.0.0.1/32 trust\nhost all all 127.0.0.1/32 scram-sha-256\n"
	require.NoError(t, os.WriteFile(filepath.Join(pg.Primary.Data, "pg_hba.conf"), []byte(hba), 0o600))
	_, err := exec.Command(psqlPath(t), "-X", "-q", "-c", "SELECT pg_reload_conf()", admin).CombinedOutput()
	require.NoError(t, err)
	name := harness.UniqueName("wlproj_t_")
	_, err = harness.CreateEmptyDatabase(context.Background(), admin, name)
	require.NoError(t, err)
	applyRolesWithPasswords(t, pg, admin, name)
	return pg, admin, name
}

// applyRolesWithPasswords runs roles.sql on name, as the runbook does
// before and after each migration.
func applyRolesWithPasswords(t *testing.T, pg *harness.PGPair, admin, name string) {
	t.Helper()
	u := strings.Replace(admin, "/postgres?", "/"+name+"?", 1)
	out, err := harness.RolesSQL{Psql: psqlPath(t), Root: harness.Root(t), AdminURL: u, DBName: name,
		Owner: "wlproj_owner", Runtime: "wlproj_runtime",
		OwnerPassword: secretOwnerPassword, RuntimePassword: secretRuntimePassword}.Apply(context.Background())
	require.NoError(t, err, "roles.sql: %s", out)
}

// psqlPath is the stack's psql.
func psqlPath(t *testing.T) string {
	t.Helper()
	return filepath.Join(harness.StackEnv(t)["STACK_PG_BINDIR"], "psql")
}

// secret creates a podman secret from a file holding content, removed when
// the test ends.
func (img image) secret(t *testing.T, dir, name, content string) {
	t.Helper()
	path := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
	out, err := img.podman("secret", "create", name, path).CombinedOutput()
	require.NoError(t, err, "podman secret create: %s", out)
	t.Cleanup(func() { _ = img.podman("secret", "rm", name).Run() })
}

// readyRole is the role /readyz on port gives when it says ready, else "".
func readyRole(port int) string {
	resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(port) + "/readyz")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	var b struct{ Role string }
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&b) != nil {
		return ""
	}
	return b.Role
}

func TestImagePodmanSecretsAsTheRunbookSays(t *testing.T) {
	t.Parallel()
	img := buildImage(t)
	pg, admin, dbName := passwordPostgres(t)
	noPassword := "postgres://wlproj_runtime@" + pg.Primary.Addr() + "/" + dbName + "?sslmode=disable"
	_, err := exec.Command(psqlPath(t), "-X", "-c", "SELECT 1", noPassword).CombinedOutput()
	require.Error(t, err, "the runtime role needs its password")

	dir, prefix := t.TempDir(), harness.UniqueName("wlproj-t-")
	host, port, _ := strings.Cut(pg.Primary.Addr(), ":")
	img.secret(t, dir, prefix+"-owner-pgpass", fmt.Sprintf("%s:%s:%s:wlproj_owner:%s\n", host, port, dbName, secretOwnerPassword))
	img.secret(t, dir, prefix+"-runtime-pgpass", fmt.Sprintf("%s:%s:%s:wlproj_runtime:%s\n", host, port, dbName, secretRuntimePassword))
	index := harness.NewIndex(t)
	ports := map[string]int{}
	for _, r := range []string{"a", "b"} {
		ports[r] = harness.Port(t)
		systemd := fmt.Sprintf("# systemd's form\nDATABASE_URL=%q\nELASTIC_URL=%q\nELASTIC_INDEX='%s'\nOUTBOX_LEADER_NAME=%q\nOUTBOX_HTTP_PORT=%d\n# OUTBOX_BULK_SIZE=500\n",
			noPassword, harness.ElasticURL(t), index, index, ports[r])
		require.NoError(t, os.WriteFile(filepath.Join(dir, r+".env"), []byte(systemd), 0o600))
	}
	out, err := exec.Command("bash", "-euo", "pipefail", "-c", fmt.Sprintf(podmanEnvLoop, dir)).CombinedOutput()
	require.NoError(t, err, "the runbook's loop: %s", out)
	podmanEnv, err := os.ReadFile(filepath.Join(dir, "a.podman.env"))
	require.NoError(t, err)
	require.Contains(t, string(podmanEnv), "ELASTIC_INDEX="+index+"\n", "unquoted")

	run := []string{"run", "--network", "host", "--read-only", "--cap-drop", "all", "--security-opt", "no-new-privileges", "--stop-timeout", "45"}
	pgpass := func(secret string) []string {
		return []string{"--secret", secret + ",type=mount,target=/tmp/pgpass,uid=65532,mode=0400", "-e", "PGPASSFILE=/tmp/pgpass"}
	}
	migrate := append(append(append([]string{}, run...), "--rm", "--no-healthcheck"), pgpass(prefix+"-owner-pgpass")...)
	migrate = append(migrate, "-e", "DATABASE_URL=postgres://wlproj_owner@"+pg.Primary.Addr()+"/"+dbName+"?sslmode=disable",
		img.ref, "migrate", "--expect-db", dbName, "--expect-host", host, "--expect-port", port)
	out, err = img.podman(migrate...).CombinedOutput()
	require.NoError(t, err, "migrate: %s", out)
	applyRolesWithPasswords(t, pg, admin, dbName)

	for _, r := range []string{"a", "b"} {
		name := prefix + "-" + r
		t.Cleanup(func() { _ = img.podman("rm", "--force", "--time", "0", name).Run() })
		args := append(append(append([]string{}, run...), "-d", "--name", name), pgpass(prefix+"-runtime-pgpass")...)
		args = append(args, "--env-file", filepath.Join(dir, r+".podman.env"), "-e", "OUTBOX_WORKER_ID="+name, img.ref)
		out, err := img.podman(args...).CombinedOutput()
		require.NoError(t, err, "podman run: %s", out)
	}
	harness.Eventually(t, 30*time.Second, "a leader and a standby, both ready", func() bool {
		roles := map[string]int{}
		for _, r := range []string{"a", "b"} {
			roles[readyRole(ports[r])]++
		}
		return roles["leader"] == 1 && roles["standby"] == 1
	})

	inspect, err := img.podman("inspect", prefix+"-a", prefix+"-b").CombinedOutput()
	require.NoError(t, err)
	for _, pw := range []string{secretOwnerPassword, secretRuntimePassword} {
		quoted, err := json.Marshal(pw) // as inspect's JSON writes it: \" for "
		require.NoError(t, err)
		require.NotContains(t, string(inspect), strings.Trim(string(quoted), `"`), "podman inspect shows a password")
	}
	out, err = img.podman("exec", prefix+"-a", "wlproj", "status").CombinedOutput()
	require.NoError(t, err, "wlproj status in a container: %s", out)
}
