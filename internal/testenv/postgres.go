package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Bounds of starting a PostgreSQL server and creating a database.
const (
	pgStartTimeout  = 2 * time.Minute
	pgCreateTimeout = time.Minute
)

// pgInstallHint is what a skipped test tells the reader to install.
const pgInstallHint = "apt-get install postgresql-15"

// pgServer is a PostgreSQL server started by this package.
type pgServer struct {
	bin  string // directory of initdb, pg_ctl, postgres
	dir  string // data directory, also the socket directory
	port int
	cred *syscall.Credential // nil: run as the current user
}

// pgShared is the server of a test binary whose TestMain runs
// PostgresMain. It is process-wide state by necessity: the point is one
// server per test binary, stopped when the binary's tests are done.
var pgShared struct {
	managed atomic.Bool // PostgresMain is running the tests
	once    sync.Once
	srv     *pgServer
	err     error
	skip    string // non-empty: why the server cannot start here
	dbs     atomic.Int64
}

// PostgresMain runs a test binary's tests (m.Run) with one PostgreSQL
// server shared by every Postgres call of the binary, and stops and
// removes that server when they are done. Use it as
//
//	func TestMain(m *testing.M) { os.Exit(testenv.PostgresMain(m)) }
//
// The server starts lazily, on the first Postgres call, so a run that
// selects no PostgreSQL test pays nothing. A test binary without it can
// still call Postgres, which then starts a private server per call
// (seconds each) and stops it when the calling test ends.
func PostgresMain(m *testing.M) int {
	pgShared.managed.Store(true)
	code := m.Run()
	if pgShared.srv != nil {
		pgShared.srv.stop()
	}
	return code
}

// Postgres returns the DSN (a postgres:// URL with sslmode=disable,
// trust authentication as user postgres) of a fresh, empty database
// created for the calling test and dropped when it ends.
//
// Under PostgresMain the database lives on the binary's shared server;
// otherwise Postgres starts a server for this call alone and stops it
// when the test ends. A server is initdb'd into a new directory under
// os.TempDir() (chowned to the postgres user when running as root,
// because PostgreSQL refuses to run as root), listens on 127.0.0.1 on a
// free port and on a unix socket in that directory, and runs with fsync
// off: it is for tests only.
//
// It skips the test when initdb and pg_ctl are not installed (apt-get
// install postgresql-15), or when running as root without a postgres
// user.
func Postgres(t testing.TB) string {
	t.Helper()
	var srv *pgServer
	if pgShared.managed.Load() {
		pgShared.once.Do(func() {
			pgShared.srv, pgShared.skip, pgShared.err = pgStart()
		})
		if pgShared.skip != "" {
			t.Skip(pgShared.skip)
		}
		if pgShared.err != nil {
			t.Fatalf("start postgres: %v", pgShared.err)
		}
		srv = pgShared.srv
	} else {
		s, skip, err := pgStart()
		if skip != "" {
			t.Skip(skip)
		}
		if err != nil {
			t.Fatalf("start postgres: %v", err)
		}
		t.Cleanup(s.stop)
		srv = s
	}
	name := fmt.Sprintf("test_%d_%d", os.Getpid(), pgShared.dbs.Add(1))
	if err := srv.admin(t.Context(), "CREATE DATABASE "+name+" STRATEGY FILE_COPY"); err != nil {
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() {
		// After the test's own cleanups (registered later, run earlier)
		// closed its pools; FORCE ends any connection left over.
		if err := srv.admin(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	return srv.dsn(name)
}

// dsn is the URL of database db on s.
func (s *pgServer) dsn(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.port, db)
}

// admin runs one statement in the postgres database of s.
func (s *pgServer) admin(ctx context.Context, sql string) error {
	ctx, cancel := context.WithTimeout(ctx, pgCreateTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.dsn("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, sql)
	return err
}

// pgBinDir finds the directory holding initdb and pg_ctl: from PATH, or
// the newest /usr/lib/postgresql/*/bin.
func pgBinDir() (string, bool) {
	if p, err := exec.LookPath("initdb"); err == nil {
		dir := filepath.Dir(p)
		if _, err := os.Stat(filepath.Join(dir, "pg_ctl")); err == nil {
			return dir, true
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return vi > vj
	})
	for _, d := range dirs {
		_, e1 := os.Stat(filepath.Join(d, "initdb"))
		_, e2 := os.Stat(filepath.Join(d, "pg_ctl"))
		if e1 == nil && e2 == nil {
			return d, true
		}
	}
	return "", false
}

// pgStart initdbs and starts a server. It returns a skip reason when the
// environment cannot run one, and an error when starting failed.
func pgStart() (*pgServer, string, error) {
	bin, ok := pgBinDir()
	if !ok {
		return nil, "PostgreSQL is not installed (initdb and pg_ctl not found in PATH or /usr/lib/postgresql/*/bin): " + pgInstallHint, nil
	}
	s := &pgServer{bin: bin}
	dir, err := os.MkdirTemp("", "neuron-pg-")
	if err != nil {
		return nil, "", err
	}
	s.dir = dir
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			_ = os.RemoveAll(dir)
			return nil, "running as root and there is no postgres user to run PostgreSQL as: " + pgInstallHint, nil
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			_ = os.RemoveAll(dir)
			return nil, "", err
		}
	}
	data := filepath.Join(dir, "data")
	if out, err := s.run("initdb", "-D", data, "-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C", "--no-sync"); err != nil {
		_ = os.RemoveAll(dir)
		return nil, "", fmt.Errorf("initdb: %v: %s", err, out)
	}
	// A free port can be taken between the probe and the start: retry.
	for attempt := 0; ; attempt++ {
		s.port, err = pgFreePort()
		if err != nil {
			_ = os.RemoveAll(dir)
			return nil, "", err
		}
		opts := fmt.Sprintf("-c listen_addresses=127.0.0.1 -p %d -k %s -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200", s.port, dir)
		out, err := s.run("pg_ctl", "-D", data, "-o", opts, "-l", filepath.Join(dir, "log"), "-t", strconv.Itoa(int(pgStartTimeout/time.Second)), "-w", "start")
		if err == nil {
			return s, "", nil
		}
		if attempt == 2 {
			log, _ := os.ReadFile(filepath.Join(dir, "log"))
			_ = os.RemoveAll(dir)
			return nil, "", fmt.Errorf("pg_ctl start: %v: %s\n%s", err, out, pgTail(log))
		}
	}
}

// stop stops the server at once and removes its directory.
func (s *pgServer) stop() {
	_, _ = s.run("pg_ctl", "-D", filepath.Join(s.dir, "data"), "-m", "immediate", "-w", "stop")
	_ = os.RemoveAll(s.dir)
}

// run runs one of the server's programs as the server's user.
func (s *pgServer) run(prog string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), pgStartTimeout+30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(s.bin, prog), args...)
	cmd.Dir = s.dir
	if s.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
		cmd.Env = append(os.Environ(), "HOME="+s.dir)
	}
	return cmd.CombinedOutput()
}

// pgFreePort asks the kernel for a free loopback port.
func pgFreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	addr, ok := l.Addr().(*net.TCPAddr)
	if !ok {
		return 0, errors.New("listener has no TCP address")
	}
	return addr.Port, nil
}

// pgTail is the end of a log, for an error message.
func pgTail(log []byte) string {
	const n = 2000
	s := string(log)
	if len(s) > n {
		s = "…" + s[len(s)-n:]
	}
	return strings.TrimSpace(s)
}
