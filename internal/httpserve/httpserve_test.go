package httpserve

import (
	"context"
	"io"
	"net"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// Listen binds at once (a taken port fails there); Start serves; Stop shuts
// down and frees the port; a server never started frees it on Stop too.
func TestListenStartStop(t *testing.T) {
	t.Parallel()
	h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	s, err := Listen("127.0.0.1", 0, &http.Server{Handler: h}, nil)
	require.NoError(t, err)
	_, port, err := net.SplitHostPort(s.Addr())
	require.NoError(t, err)

	_, err = net.Listen("tcp", s.Addr())
	require.Error(t, err, "the port is bound before Start")

	require.NoError(t, s.Start(context.Background()))
	resp, err := http.Get("http://" + s.Addr() + "/")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, "ok", string(body))

	s.Stop()
	_, err = http.Get("http://127.0.0.1:" + port + "/")
	require.Error(t, err, "stopped")

	unused, err := Listen("127.0.0.1", 0, &http.Server{Handler: h}, nil)
	require.NoError(t, err)
	addr := unused.Addr()
	unused.Stop()
	ln, err := net.Listen("tcp", addr)
	require.NoError(t, err, "a server never started frees its port on Stop")
	ln.Close()
}
