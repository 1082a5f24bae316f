package egress

import (
	"errors"
	"fmt"
	"sync"
	"syscall"
	"unsafe"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
)

// netCaps are CAP_NET_ADMIN's (nftables, the log, the connection table)
// and CAP_NET_BIND_SERVICE's (the forwarder's port 53) bits in the first
// word of the capability sets.
const netCaps = 1<<unix.CAP_NET_ADMIN | 1<<unix.CAP_NET_BIND_SERVICE

var (
	raiseOnce sync.Once
	raiseErr  error
)

// newConn opens a netlink connection to nftables, with CAP_NET_ADMIN made
// effective first when the process holds it only as permitted.
func newConn() (*nftables.Conn, error) {
	raiseCaps()
	return nftables.New()
}

// raiseCaps makes the permitted network capabilities effective, once.
func raiseCaps() { raiseOnce.Do(func() { raiseErr = raiseNetAdmin() }) }

// raiseNetAdmin makes CAP_NET_ADMIN and CAP_NET_BIND_SERVICE effective on
// every thread of the process when they are permitted but not effective.
// The gateway image gives its binary both as a permitted-only file capability: a non-root
// gateway then holds it when the container is granted NET_ADMIN, and still
// starts when it is not (an effective file capability would make the exec
// fail there). The kernel checks the capability of the thread that sends
// each netlink message, and Go runs goroutines on many threads, hence all
// threads. Nothing to do (nil) when the capability is effective already or
// not permitted at all.
func raiseNetAdmin() error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("reading the process's capabilities: %w", err)
	}
	want := data[0].Permitted & netCaps
	if want == 0 || data[0].Effective&want == want {
		return nil
	}
	data[0].Effective |= want
	_, _, errno := syscall.AllThreadsSyscall(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0)
	if errno != 0 {
		if errors.Is(errno, syscall.ENOTSUP) {
			return errors.New("making the permitted CAP_NET_ADMIN effective needs a binary built without cgo (CGO_ENABLED=0)")
		}
		return fmt.Errorf("making the permitted CAP_NET_ADMIN effective: %w", errno)
	}
	return nil
}

// raiseFailed adds to a netlink refusal why a permitted CAP_NET_ADMIN
// could not be made effective, if that is what happened.
func raiseFailed(err error) error {
	if raiseErr != nil {
		return fmt.Errorf("%w; %w", err, raiseErr)
	}
	return err
}
