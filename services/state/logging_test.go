package state

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// The call log's lines below WARN lose the status message; other lines
// and attributes pass.
func TestCallLogHandler(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(CallLogHandler(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))).With("service", "state")
	log.Info("finished call", "grpc.method", "/layer0.state.v1.StateService/Read", "grpc.code", "NotFound", "grpc.error", `key "secret-key" in session/s: not found`)
	log.Debug("finished call", "grpc.code", "NotFound", "grpc.error", `key "secret-key"`)
	log.Warn("finished call", "grpc.code", "Unavailable", "grpc.error", "store is closed")
	log.Info("SERVING", "addr", "127.0.0.1:1")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 4 {
		t.Fatalf("%d lines: %s", len(lines), buf.String())
	}
	for i, want := range []string{`"grpc.code":"NotFound"`, `"grpc.code":"NotFound"`, `"grpc.error":"store is closed"`, `"addr":"127.0.0.1:1"`} {
		if !strings.Contains(lines[i], want) || !strings.Contains(lines[i], `"service":"state"`) {
			t.Errorf("line %d %s lacks %s", i, lines[i], want)
		}
	}
	if strings.Contains(buf.String(), "secret-key") {
		t.Errorf("a key reached the log: %s", buf.String())
	}
}
