package harness

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// OtherEngine is the engine of the matrix a test runs beside the stack's
// own: OpenSearch 2 beside an Elasticsearch, Elasticsearch 7 beside an
// OpenSearch.
func OtherEngine(t testing.TB) string {
	if Engine(t).Distribution == "elasticsearch" {
		return "opensearch-2"
	}
	return "elasticsearch-7"
}

// SecondEngine starts a single node of engine (a name scripts/stack.sh
// knows) beside the stack under test, for the test, and stops it when the
// test ends; it returns the node's URL and what it is. stack.sh starts it
// as it starts any stack's (fetched from Maven Central once, as the stack's
// unprivileged user, on loopback, with the stack's JVM options), but with
// no Postgres of its own: the env file it writes names the stack's
// database and lives in the test's temporary directory.
func SecondEngine(t testing.TB, engine string) (string, EngineInfo) {
	t.Helper()
	envFile := filepath.Join(t.TempDir(), engine+".env")
	stack := func(verb string) ([]byte, error) {
		cmd := exec.Command(filepath.Join(Root(t), "scripts", "stack.sh"), verb)
		cmd.Env = append(os.Environ(), "ENGINE="+engine, "WLPROJ_STACK_ENV="+envFile,
			"WLPROJ_TEST_DATABASE_URL="+AdminDatabaseURL(t), "WLPROJ_TEST_ELASTIC_URL=",
			"ENGINE_VERSION=", "ES_VERSION=", "ENGINE_NODES=1", "ES_HEAP=384m", "PG_STANDBY=",
			"ENGINE_JAVA_OPTS="+StackEnv(t)["STACK_ENGINE_JAVA_OPTS"])
		return cmd.CombinedOutput()
	}
	t.Cleanup(func() {
		if out, err := stack("down"); err != nil {
			t.Errorf("stopping the second engine %s: %v\n%s", engine, err, out)
		}
	})
	out, err := stack("up")
	require.NoError(t, err, "starting the second engine %s:\n%s", engine, out)
	vars, err := readEnvFile(envFile)
	require.NoError(t, err)
	url := vars["ELASTIC_URL"]
	info, err := IdentifyEngine(context.Background(), url)
	require.NoError(t, err)
	return url, info
}
