package environment

import (
	"fmt"
	"os"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
)

// Default pseudo-terminal size, when ExecStart.size is unset.
const (
	defaultRows = 24
	defaultCols = 80
)

// openTerminal makes a pseudo-terminal of size sz (nil: 24x80) for one
// command: the follower end is the command's stdin, stdout, stderr and
// controlling terminal (sandbox.Policy.Terminal); the service reads and
// writes the controller end. The follower is opened with O_NOCTTY, so it
// never becomes the service's own terminal, and it is the only terminal
// the command can reach: the sandbox's private root has no /dev/tty,
// /dev/pts or /dev/ptmx, and its seccomp filter refuses TIOCSTI and
// TIOCLINUX, so the command cannot type into any terminal, its own
// included.
//
// With raw, the terminal is set raw (no echo, no line editing, no
// signal characters, no output processing): it only carries bytes to a
// terminal of the backend's own (a container's), which does all that.
func openTerminal(sz *environmentv1.TerminalSize, raw bool) (*execPipes, error) {
	ctl, follower, err := pty.Open()
	if err != nil {
		return nil, fmt.Errorf("opening a pseudo-terminal: %w", err)
	}
	if raw {
		if err := makeRaw(follower); err != nil {
			ctl.Close()
			follower.Close()
			return nil, fmt.Errorf("setting the pseudo-terminal raw: %w", err)
		}
	}
	rows, cols := uint16(defaultRows), uint16(defaultCols)
	if sz != nil {
		rows, cols = uint16(sz.GetRows()), uint16(sz.GetCols())
	}
	if err := setSize(follower, rows, cols); err != nil {
		ctl.Close()
		follower.Close()
		return nil, fmt.Errorf("sizing the pseudo-terminal: %w", err)
	}
	// pty.Open leaves the controller in blocking mode (its ioctls use
	// Fd); a non-blocking duplicate is handled by the runtime's poller,
	// so reads take deadlines and Close ends a read or write in progress.
	fd, err := unix.FcntlInt(ctl.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	ctl.Close()
	if err == nil {
		err = unix.SetNonblock(fd, true)
	}
	if err != nil {
		follower.Close()
		return nil, fmt.Errorf("opening a pseudo-terminal: %w", err)
	}
	c := os.NewFile(uintptr(fd), "/dev/ptmx")
	return &execPipes{childIn: follower, childOut: follower, childErr: follower, stdin: c, stdout: c, tty: true}, nil
}

// resize sets the terminal's size; the kernel sends the command's
// foreground process group SIGWINCH.
func (p *execPipes) resize(sz *environmentv1.TerminalSize) error {
	if !p.tty {
		return fmt.Errorf("no pseudo-terminal")
	}
	return setSize(p.stdout, uint16(sz.GetRows()), uint16(sz.GetCols()))
}

// setSize sets the size of terminal f (either end) without taking its
// descriptor out of the file's hands (Fd would make it blocking, and a
// concurrent Close could hand its number to another file meanwhile).
func setSize(f *os.File, rows, cols uint16) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ioErr error
	if err := rc.Control(func(fd uintptr) {
		ioErr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols})
	}); err != nil {
		return err
	}
	return ioErr
}

// makeRaw sets terminal f raw, as cfmakeraw(3) does.
func makeRaw(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ioErr error
	if err := rc.Control(func(fd uintptr) {
		t, err := unix.IoctlGetTermios(int(fd), unix.TCGETS)
		if err != nil {
			ioErr = err
			return
		}
		t.Iflag &^= unix.IGNBRK | unix.BRKINT | unix.PARMRK | unix.ISTRIP | unix.INLCR | unix.IGNCR | unix.ICRNL | unix.IXON
		t.Oflag &^= unix.OPOST
		t.Lflag &^= unix.ECHO | unix.ECHONL | unix.ICANON | unix.ISIG | unix.IEXTEN
		t.Cflag &^= unix.CSIZE | unix.PARENB
		t.Cflag |= unix.CS8
		t.Cc[unix.VMIN], t.Cc[unix.VTIME] = 1, 0
		ioErr = unix.IoctlSetTermios(int(fd), unix.TCSETS, t)
	}); err != nil {
		return err
	}
	return ioErr
}
