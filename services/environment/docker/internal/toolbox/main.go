// Command toolbox stands in for the operator binary and for a shell's
// commands in the docker backend's sandbox session tests
// (services/environment/docker/sandbox_test.go): the test image is
// FROM scratch with this binary at /operator. As the sandbox's first
// process (/operator --one-shot ...) it waits on its standard input, as
// the real operator does; the tests' commands are /operator NAME ARGS.
//
// It is a test harness: no other program should import or ship it.
package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "toolbox: no command")
		os.Exit(2)
	}
	args := os.Args[2:]
	switch os.Args[1] {
	case "--one-shot":
		// The sandbox's keeper: wait on stdin, as the operator does.
		_, _ = io.Copy(io.Discard, os.Stdin)
	case "echo":
		fmt.Println(strings.Join(args, " "))
	case "err":
		fmt.Fprintln(os.Stderr, strings.Join(args, " "))
	case "exit":
		n, _ := strconv.Atoi(args[0])
		os.Exit(n)
	case "cat":
		_, _ = io.Copy(os.Stdout, os.Stdin)
	case "write":
		check(os.WriteFile(args[0], []byte(args[1]), 0o644))
	case "read":
		b, err := os.ReadFile(args[0])
		check(err)
		os.Stdout.Write(b)
	case "symlink":
		check(os.Symlink(args[0], args[1]))
	case "env":
		fmt.Printf("%s=%s\n", args[0], os.Getenv(args[0]))
	case "sleep":
		d, _ := time.ParseDuration(args[0])
		time.Sleep(d)
	case "prompt":
		// A prompt without a newline, then an answer.
		fmt.Print("name? ")
		line, _ := bufio.NewReader(os.Stdin).ReadString('\n')
		fmt.Printf("hello %s\n", strings.TrimSpace(line))
	case "trap":
		// Catches SIGTERM, says so and exits 0.
		c := make(chan os.Signal, 1)
		signal.Notify(c, syscall.SIGTERM)
		fmt.Println("ready")
		fmt.Printf("trapped %v\n", <-c)
	case "spawn":
		// Leaves a process behind in a session of its own, and exits.
		cmd := exec.Command("/operator", "sleep", "1h")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		check(cmd.Start())
		fmt.Println(cmd.Process.Pid)
	case "alive":
		pid, _ := strconv.Atoi(args[0])
		if err := syscall.Kill(pid, 0); err == nil {
			// A zombie is dead for this purpose.
			b, _ := os.ReadFile("/proc/" + args[0] + "/stat")
			if !strings.Contains(string(b), ") Z ") {
				fmt.Println("alive")
				return
			}
		}
		fmt.Println("gone")
	case "flood":
		// n bytes of numbered lines on stdout.
		n, _ := strconv.Atoi(args[0])
		w := bufio.NewWriterSize(os.Stdout, 32<<10)
		for i := 0; n > 0; i++ {
			line := fmt.Sprintf("%08d\n", i)
			if len(line) > n {
				line = line[:n]
			}
			w.WriteString(line)
			n -= len(line)
		}
		w.Flush()
	case "fill":
		// A file of n bytes in the workspace.
		n, _ := strconv.Atoi(args[1])
		check(os.WriteFile(args[0], make([]byte, n), 0o644))
	case "tty":
		for fd := 0; fd < 3; fd++ {
			_, err := unix.IoctlGetTermios(fd, unix.TCGETS)
			fmt.Printf("fd%d tty=%v\n", fd, err == nil)
		}
		// Watching for size changes before the first read: the engine
		// may apply the size asked for at the start only after the
		// command has started, and then it comes as a change.
		c := make(chan os.Signal, 1)
		signal.Notify(c, syscall.SIGWINCH)
		ws, err := unix.IoctlGetWinsize(0, unix.TIOCGWINSZ)
		check(err)
		fmt.Printf("size %d %d\n", ws.Row, ws.Col)
		if len(args) > 0 && args[0] == "wait" {
			// "tty wait ROWS COLS": prints each change until the size is
			// ROWS x COLS; "tty wait": until the first change.
			want := strings.Join(args[1:], " ")
			fmt.Println("waiting")
			for {
				<-c
				ws, err := unix.IoctlGetWinsize(0, unix.TIOCGWINSZ)
				check(err)
				got := fmt.Sprintf("%d %d", ws.Row, ws.Col)
				fmt.Printf("resized %s\n", got)
				if want == "" || got == want {
					break
				}
			}
		}
	case "probe":
		probe()
	case "egress":
		// A plain request for host through the egress proxy's socket;
		// prints the status line.
		c, err := net.Dial("unix", os.Getenv("NEURON_EGRESS_SOCKET"))
		check(err)
		defer c.Close()
		fmt.Fprintf(c, "GET http://%s/ HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", args[0], args[0])
		line, _ := bufio.NewReader(c).ReadString('\n')
		fmt.Println(strings.TrimSpace(line))
	default:
		fmt.Fprintf(os.Stderr, "toolbox: unknown command %q\n", os.Args[1])
		os.Exit(127)
	}
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "toolbox:", err)
		os.Exit(1)
	}
}

// probe prints, one per line, what an escaping command would try.
func probe() {
	fmt.Printf("uid=%d gid=%d\n", os.Getuid(), os.Getgid())
	status, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(status), "\n") {
		for _, k := range []string{"CapEff:", "CapPrm:", "CapBnd:", "NoNewPrivs:"} {
			if strings.HasPrefix(l, k) {
				fmt.Println(strings.Join(strings.Fields(l), " "))
			}
		}
	}
	try := func(name string, err error) {
		if err == nil {
			fmt.Printf("%s=ok\n", name)
		} else {
			fmt.Printf("%s=refused\n", name)
		}
	}
	_, err := os.ReadFile("/etc/shadow")
	try("read-shadow", err)
	try("write-root", os.WriteFile("/escape", []byte("x"), 0o644))
	try("write-operator", os.WriteFile("/operator", []byte("x"), 0o644))
	_, err = os.Stat("/var/run/docker.sock")
	try("docker-sock", err)
	_, err = os.Stat("/run/docker.sock")
	try("run-docker-sock", err)
	c, err := net.DialTimeout("tcp", "1.1.1.1:80", 2*time.Second)
	if err == nil {
		c.Close()
	}
	try("dial-internet", err)
	try("mount", syscall.Mount("tmpfs", "/tmp", "tmpfs", 0, ""))
	try("setuid-root", syscall.Setuid(0))
	try("unshare-user", syscall.Unshare(syscall.CLONE_NEWUSER))
	ifs, _ := net.Interfaces()
	var names []string
	for _, i := range ifs {
		names = append(names, i.Name)
	}
	fmt.Printf("interfaces=%s\n", strings.Join(names, ","))
	fmt.Printf("pid=%d\n", os.Getpid())
	hostname, _ := os.Hostname()
	fmt.Printf("hostname=%s\n", hostname)
}
