// Package zdsconn frames ZDS messages (docs/wire-contract.md §3.1) on a
// SOCK_SEQPACKET unix socket: one protobuf message per datagram, under 1 KiB,
// with a network namespace fd riding along as SCM_RIGHTS on AddWorkload only.
// Both ends use it: the CNI agent's server and the node proxy's client.
package zdsconn

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
)

// MaxMessage is the size both ends read into; anything longer is
// truncated, which is a protocol error.
const MaxMessage = 1024

// ErrProtocol is wrapped by every framing violation.
var ErrProtocol = errors.New("zds protocol error")

// Conn is one ZDS connection. It is not safe for concurrent use: the
// protocol is strictly request and ack.
type Conn struct {
	c *net.UnixConn
	// limit is the read buffer's size.
	limit int
}

// New wraps a "unixpacket" connection that reads datagrams of up to
// MaxMessage bytes.
func New(c *net.UnixConn) *Conn { return &Conn{c: c, limit: MaxMessage} }

// SetReadLimit sets the size of the read buffer; a datagram that does not
// fit is still a protocol error. The CNI agent reads with a larger one:
// ztunnel sends a refusal's whole text in its Ack, however long, and that
// must be a refusal rather than a broken connection.
func (c *Conn) SetReadLimit(n int) { c.limit = max(n, MaxMessage) }

// Close closes the connection.
func (c *Conn) Close() error { return c.c.Close() }

// Send writes m, with fd (when non-nil) as SCM_RIGHTS, before deadline.
func (c *Conn) Send(m proto.Message, fd *os.File, deadline time.Time) error {
	b, err := proto.Marshal(m)
	if err != nil {
		return fmt.Errorf("marshal %T: %w", m, err)
	}
	if len(b) >= MaxMessage {
		return fmt.Errorf("%w: %T of %d bytes, limit %d", ErrProtocol, m, len(b), MaxMessage-1)
	}
	var oob []byte
	if fd != nil {
		oob = unix.UnixRights(int(fd.Fd()))
	}
	if err := c.c.SetWriteDeadline(deadline); err != nil {
		return err
	}
	if _, _, err := c.c.WriteMsgUnix(b, oob, nil); err != nil {
		return fmt.Errorf("send %T: %w", m, err)
	}
	return nil
}

// Recv reads one message into m before deadline. It returns the fds that
// came with it (the caller owns them); a truncated message or ancillary
// data is an error, and any fds received with it are closed.
func (c *Conn) Recv(m proto.Message, deadline time.Time) ([]*os.File, error) {
	if err := c.c.SetReadDeadline(deadline); err != nil {
		return nil, err
	}
	buf := make([]byte, c.limit)
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, flags, _, err := c.c.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, err
	}
	fds, ferr := parseRights(oob[:oobn])
	if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
		closeAll(fds)
		return nil, fmt.Errorf("%w: truncated message (flags 0x%x)", ErrProtocol, flags)
	}
	if ferr != nil {
		closeAll(fds)
		return nil, ferr
	}
	if n == 0 {
		closeAll(fds)
		return nil, fmt.Errorf("%w: empty message (peer closed?)", ErrProtocol)
	}
	if err := proto.Unmarshal(buf[:n], m); err != nil {
		closeAll(fds)
		return nil, fmt.Errorf("%w: decode %T: %w", ErrProtocol, m, err)
	}
	return fds, nil
}

func parseRights(oob []byte) ([]*os.File, error) {
	if len(oob) == 0 {
		return nil, nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("%w: ancillary data: %w", ErrProtocol, err)
	}
	var files []*os.File
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			closeAll(files)
			return nil, fmt.Errorf("%w: ancillary data: %w", ErrProtocol, err)
		}
		for _, fd := range fds {
			unix.CloseOnExec(fd)
			files = append(files, os.NewFile(uintptr(fd), "zds-fd"))
		}
	}
	return files, nil
}

func closeAll(fs []*os.File) {
	for _, f := range fs {
		f.Close()
	}
}

// IsNetns reports whether f is a network namespace handle, as the node
// proxy checks before entering it.
func IsNetns(f *os.File) bool {
	t, err := unix.IoctlRetInt(int(f.Fd()), unix.NS_GET_NSTYPE)
	return err == nil && t == unix.CLONE_NEWNET
}

// MaxAckError is the longest Ack error text, in bytes, whose
// WorkloadResponse still fits one datagram: the response is the text plus
// 6 bytes of framing (two tags and two 2-byte lengths).
const MaxAckError = MaxMessage - 1 - 6

// truncated ends an error text AckError had to cut.
const truncated = " [truncated]"

// AckError returns s as an Ack's error text: valid UTF-8 (invalid bytes
// become U+FFFD; proto3 strings must be valid, or the Ack would not
// marshal) and at most MaxAckError bytes, cut at a rune boundary and
// marked when longer, so that the Ack always fits one datagram and a
// refusal never ends the session.
func AckError(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= MaxAckError {
		return s
	}
	cut := MaxAckError - len(truncated)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + truncated
}
