package projection

import (
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// boundWrites is the engine connections' net.Dialer.Control. TCP_USER_TIMEOUT
// makes the kernel give up on data unacknowledged for TCPUserTimeout instead
// of retransmitting it for ~15 minutes. SO_LINGER 0 makes every close
// abortive: a cancelled bulk, a lost leadership (the loop cancels its
// context), an exit, even kill -9 (the kernel closes the socket) send an RST
// and discard unsent data, which a normal close would keep delivering.
func boundWrites(_, _ string, c syscall.RawConn) error {
	var err error
	cerr := c.Control(func(fd uintptr) {
		err = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(TCPUserTimeout/time.Millisecond))
		if err == nil {
			err = unix.SetsockoptLinger(int(fd), unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
		}
	})
	if cerr != nil {
		return cerr
	}
	return os.NewSyscallError("setsockopt", err)
}
