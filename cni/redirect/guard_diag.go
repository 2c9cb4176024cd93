package redirect

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/canopy-mesh/canopy/cni/redirect/bpfprog"
)

// TCP states as sock_diag reports and selects them. A TCP socket that is
// bound and neither listens nor connects is reported in TCP_CLOSE, but a
// dump lists such sockets only when asked for the pseudo-state
// TCP_BOUND_INACTIVE (Linux 6.8), which the "all states" mask of
// netlink.SocketDiagTCP (0xfff) lacks: it would never show the attack of
// a socket bound before the guard that listens later.
const (
	tcpClose         = 7
	tcpListen        = 10
	tcpBoundInactive = 13
)

// inetDiagReqLen and inetDiagMsgLen are the sizes of struct
// inet_diag_req_v2 and of struct inet_diag_msg (linux/inet_diag.h).
const (
	inetDiagReqLen = 56
	inetDiagMsgLen = 72
)

// listGuardedTCP lists the calling thread's namespace's TCP sockets of
// family on guarded ports that listen or are bound only.
func listGuardedTCP(family uint8) ([]guardedSocket, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return nil, fmt.Errorf("sock_diag socket: %w", err)
	}
	defer unix.Close(fd)
	req := make([]byte, unix.NLMSG_HDRLEN+inetDiagReqLen)
	ne := binary.NativeEndian
	ne.PutUint32(req[0:], uint32(len(req)))
	ne.PutUint16(req[4:], unix.SOCK_DIAG_BY_FAMILY)
	ne.PutUint16(req[6:], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	ne.PutUint32(req[8:], 1) // sequence
	body := req[unix.NLMSG_HDRLEN:]
	body[0], body[1] = family, unix.IPPROTO_TCP
	ne.PutUint32(body[4:], 1<<tcpListen|1<<tcpBoundInactive)
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("sock_diag request: %w", err)
	}
	ports := bpfprog.GuardedPorts()
	var out []guardedSocket
	buf := make([]byte, 64<<10)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return nil, fmt.Errorf("sock_diag reply: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return nil, fmt.Errorf("sock_diag reply: %w", err)
		}
		for _, m := range msgs {
			switch m.Header.Type {
			case unix.NLMSG_DONE:
				return out, nil
			case unix.NLMSG_ERROR:
				if len(m.Data) >= 4 {
					if errno := -int32(ne.Uint32(m.Data)); errno != 0 {
						return nil, fmt.Errorf("sock_diag: %w", syscall.Errno(errno))
					}
				}
				return nil, errors.New("sock_diag: an error without a code")
			}
			if len(m.Data) < inetDiagMsgLen {
				continue
			}
			state := m.Data[1]
			port := binary.BigEndian.Uint16(m.Data[4:])
			inode := ne.Uint32(m.Data[68:])
			if inode == 0 || !slices.Contains(ports, port) || (state != tcpListen && state != tcpClose && state != tcpBoundInactive) {
				continue
			}
			out = append(out, guardedSocket{proto: "tcp", port: port, inode: inode})
		}
	}
}
