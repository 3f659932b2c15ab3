package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCmdPolicyCheck(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "policy.yaml")
	require.NoError(t, os.WriteFile(path, []byte(`
roles:
  lib3:
    actions: [replay]
    projections: [search]
    scopes: [library-3, "library_3*"]
  pauser:
    actions: [pause]
    projections: [chronicle]
    scopes: ["*"]
users:
  ada: [lib3]
groups:
  ops: [pauser]
`), 0o600))
	run := func(args ...string) (int, string, string) {
		var out, errOut bytes.Buffer
		code := Run(args, &out, &errOut)
		return code, out.String(), errOut.String()
	}
	code, out, errOut := run("policy", "check", "--policy-file", path, "--user", "ada", "--group", "ops")
	require.Zero(t, code, errOut)
	require.Equal(t, path+`: valid for projections chronicle, search
ada: roles lib3, pauser
  view     search/library-3, search/library_3*, chronicle/*
  replay   search/library-3, search/library_3*
  pause    chronicle/*
`, out)
	code, out, _ = run("policy", "check", "--policy-file", path, "--user", "eve")
	require.Zero(t, code)
	require.Contains(t, out, "eve: no role")

	bad := filepath.Join(t.TempDir(), "bad.yaml")
	require.NoError(t, os.WriteFile(bad, []byte("roles:\n  r:\n    actions: [view]\n    projections: [books]\n    scopes: [\"*\"]\nusers:\n  a: [r]\n"), 0o600))
	code, _, errOut = run("policy", "check", "--policy-file", bad)
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, bad+`:4: roles.r.projections: names projection "books", which this replica does not run (it runs: chronicle, search)`)
}
