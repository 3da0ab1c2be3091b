package provider

import "testing"

func TestUsageFromTotals(t *testing.T) {
	tests := []struct {
		name                              string
		prompt, read, write, output       int64
		wantIn, wantOut, wantRead, wantWr uint64
	}{
		{"cached part of prompt", 1200, 200, 0, 300, 1000, 300, 200, 0},
		{"reads and writes", 1000, 100, 400, 5, 500, 5, 100, 400},
		{"inconsistent counts never go negative", 100, 150, 0, 1, 0, 1, 150, 0},
		{"negative counts are zero", -5, -1, -1, -2, 0, 0, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u := UsageFromTotals(tt.prompt, tt.read, tt.write, tt.output)
			want := Usage{InputTokens: tt.wantIn, OutputTokens: tt.wantOut, CacheReadTokens: tt.wantRead, CacheWriteTokens: tt.wantWr}
			if u != want {
				t.Fatalf("got %+v, want %+v", u, want)
			}
		})
	}
}
