package main

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
)

// server answers /healthz with code and returns its host and port.
func server(t *testing.T, code int) (host, port string) {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(code)
		_, _ = io.WriteString(w, `{"status":"x"}`)
	}))
	t.Cleanup(srv.Close)
	host, port, err := net.SplitHostPort(srv.Listener.Addr().String())
	require.NoError(t, err)
	return host, port
}

func TestHealthcheckExitCodes(t *testing.T) {
	okHost, okPort := server(t, http.StatusOK)
	_, failPort := server(t, http.StatusServiceUnavailable)
	free := httptest.NewServer(http.NotFoundHandler())
	_, closedPort, _ := net.SplitHostPort(free.Listener.Addr().String())
	free.Close()

	require.Equal(t, 0, run([]string{okHost, okPort, "/healthz"}, io.Discard), "200 is healthy")
	require.Equal(t, 1, run([]string{okHost, failPort, "/healthz"}, io.Discard), "503 is unhealthy")
	require.Equal(t, 1, run([]string{okHost, okPort, "/nothing"}, io.Discard), "404 is unhealthy")
	require.Equal(t, 1, run([]string{okHost, closedPort, "/healthz"}, io.Discard), "no answer is unhealthy")
	require.Equal(t, 2, run([]string{okHost, okPort}, io.Discard), "a wrong call says how to call it")
}

// The image passes ${OUTBOX_HTTP_ADDR:-127.0.0.1} and ${OUTBOX_HTTP_PORT:-8080}
// unexpanded (exec form): the probe follows the replica's settings, a
// replica bound to every address too.
func TestHealthcheckFollowsTheReplicasSettings(t *testing.T) {
	_, port := server(t, http.StatusOK)
	args := []string{"${PROBE_ADDR:-127.0.0.2}", "${PROBE_PORT:-1}", "/healthz"}

	t.Setenv("PROBE_PORT", port)
	t.Setenv("PROBE_ADDR", "0.0.0.0")
	require.Equal(t, 0, run(args, io.Discard), "the port and the unspecified address from the environment")

	t.Setenv("PROBE_ADDR", "")
	require.Equal(t, "http://127.0.0.2:"+port+"/healthz", probeURL(expand(args[0]), expand(args[1]), expand(args[2])),
		"an empty variable takes the default, as in sh")
	require.Equal(t, "http://[::]:8080/healthz", probeURL("::", "8080", "/healthz"))
	require.Equal(t, "http://replica.example:8080/healthz", probeURL("replica.example", "8080", "/healthz"))
}
