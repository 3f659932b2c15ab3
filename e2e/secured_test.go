package e2e

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// TestTLS runs the tests of an engine behind TLS with credentials beside
// each other, on one node of the engine's own security where the stack's
// engine has one (Elasticsearch): each such node is a JVM of its own, 15 to
// 25 s to start on a two-core machine, and one serves both.
func TestTLS(t *testing.T) {
	t.Parallel()
	ca, err := harness.NewCA("wlproj test CA")
	require.NoError(t, err)
	node := startSharedSecuredNode(t, ca)
	t.Run("WithCredentials", func(t *testing.T) {
		t.Parallel()
		testTLSWithCredentials(t, ca, node)
	})
	t.Run("WithAPIKey", func(t *testing.T) {
		t.Parallel()
		testTLSWithAPIKey(t, ca, node)
	})
}

// sharedSecuredNode is a secured node started in the background, so that a
// test that needs none does not wait for it.
type sharedSecuredNode struct {
	user, password string
	done           chan struct{}
	node           *harness.SecuredNode
	err            error
}

// startSharedSecuredNode starts a secured node able to create API keys, its
// one user a superuser, and closes it when t and its subtests end. On an
// engine without one, get says so.
func startSharedSecuredNode(t *testing.T, ca *harness.CA) *sharedSecuredNode {
	s := &sharedSecuredNode{user: "wlproj", password: harness.UniqueName("pw-"), done: make(chan struct{})}
	engine, env := harness.Engine(t), harness.StackEnv(t)
	go func() {
		defer close(s.done)
		s.node, s.err = harness.StartSecuredNode(context.Background(), env, engine,
			harness.SecuredConfig{CA: ca, User: s.user, Password: s.password, APIKeys: true})
	}()
	t.Cleanup(func() {
		<-s.done
		if s.node != nil {
			s.node.Close()
		}
	})
	return s
}

// get waits for the node; nil when the engine has none (harness.ErrNoSecuredNode).
func (s *sharedSecuredNode) get(t *testing.T) *harness.SecuredNode {
	t.Helper()
	<-s.done
	if errors.Is(s.err, harness.ErrNoSecuredNode) {
		return nil
	}
	require.NoError(t, s.err)
	return s.node
}
