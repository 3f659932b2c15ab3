//go:build !linux

package projection

import "syscall"

// boundWrites sets nothing outside Linux, which alone has TCP_USER_TIMEOUT:
// there WriteLifetime does not hold. wlproj runs on Linux; this keeps the
// package building elsewhere for development.
func boundWrites(_, _ string, _ syscall.RawConn) error { return nil }
