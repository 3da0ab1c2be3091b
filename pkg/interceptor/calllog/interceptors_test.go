package calllog

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestLinesAndLevels(t *testing.T) {
	tests := []struct {
		name     string
		min      slog.Level
		err      error
		wantLine bool
		level    string
	}{
		{"ok at debug", slog.LevelDebug, nil, true, "DEBUG"},
		{"ok hidden at info", slog.LevelInfo, nil, false, ""},
		{"not found at info", slog.LevelInfo, status.Error(codes.NotFound, "no key"), true, "INFO"},
		{"unavailable warns", slog.LevelInfo, status.Error(codes.Unavailable, "down"), true, "WARN"},
		{"internal errors", slog.LevelWarn, status.Error(codes.Internal, "internal error"), true, "ERROR"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: tt.min}))
			ic := UnaryServerInterceptor(log, WithFields(func(context.Context) []slog.Attr {
				return []slog.Attr{slog.String("principal", "p1")}
			}))
			_, err := ic(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/s.v1.S/M"},
				func(context.Context, any) (any, error) { return nil, tt.err })
			if err != tt.err {
				t.Fatalf("error changed: %v", err)
			}
			if !tt.wantLine {
				if buf.Len() != 0 {
					t.Fatalf("unexpected line %s", buf.String())
				}
				return
			}
			var rec map[string]any
			if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
				t.Fatalf("want one JSON line, got %q", buf.String())
			}
			if rec["level"] != tt.level || rec["grpc.method"] != "/s.v1.S/M" || rec["principal"] != "p1" {
				t.Errorf("line %v", rec)
			}
			if rec["grpc.code"] != status.Code(tt.err).String() {
				t.Errorf("code %v", rec["grpc.code"])
			}
		})
	}
}
