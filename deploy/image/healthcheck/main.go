// Command healthcheck is the container image's HEALTHCHECK. The image holds
// no shell and no HTTP client, and `wlproj` has no probe subcommand, so
// this small static program asks the replica in its own container for
// /healthz and exits 0 on 200, 1 otherwise, as a container engine wants.
//
// Its arguments are a host, a port and a path. The image's HEALTHCHECK is
// in exec form, so no shell expands the variables in them: this program
// expands ${VAR} and ${VAR:-default} itself, so that the probe follows the
// replica's own bind address and port (the Containerfile names them; this
// program knows no setting of wlproj). A replica bound to every address
// (0.0.0.0, ::) is probed there, which Linux connects to the host itself.
package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"
)

// probeTimeout bounds one probe, below the HEALTHCHECK's own --timeout.
const probeTimeout = 3 * time.Second

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

// run probes the URL its three arguments make and returns the exit code.
func run(args []string, stderr io.Writer) int {
	if len(args) != 3 {
		fmt.Fprintln(stderr, "usage: healthcheck HOST PORT PATH (each may hold ${VAR} or ${VAR:-default})")
		return 2
	}
	url := probeURL(expand(args[0]), expand(args[1]), expand(args[2]))
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	if err := probe(ctx, url); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", url, err)
		return 1
	}
	return 0
}

// expand replaces ${VAR} with the variable's value and ${VAR:-default}
// with the default when the variable is unset or empty, as sh does.
func expand(s string) string {
	return os.Expand(s, func(name string) string {
		name, def, _ := strings.Cut(name, ":-")
		if v := os.Getenv(name); v != "" {
			return v
		}
		return def
	})
}

// probeURL is the http URL of path on host:port.
func probeURL(host, port, path string) string {
	return "http://" + net.JoinHostPort(host, port) + path
}

// probe is nil when url answers 200; otherwise it says what came back.
func probe(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}
