package state

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/scope"
)

// A List page token is taken only exactly as issued: the same bytes
// spelled otherwise (line breaks, padding, unused bits set) are
// INVALID_ARGUMENT, on every backend.
func TestPageTokensCanonical(t *testing.T) {
	for name, open := range map[string]opener{"memory": openMemory, "bolt": openBoltTemp} {
		t.Run(name, func(t *testing.T) {
			b := open(t)
			s := scope.Session("s")
			for i := range 5 {
				write(t, b, s, fmt.Sprint("k", i), str("v"))
			}
			page, err := b.List(ctx, s, "k", "", 2)
			if err != nil || page.NextPageToken == "" {
				t.Fatalf("List = %+v, %v", page, err)
			}
			tok := page.NextPageToken
			if _, err := b.List(ctx, s, "k", tok, 2); err != nil {
				t.Fatalf("the token as issued: %v", err)
			}
			mid := len(tok) / 2
			bad := map[string]string{
				"line feed inside":       tok[:mid] + "\n" + tok[mid:],
				"crlf inside":            tok[:mid] + "\r\n" + tok[mid:],
				"line feeds throughout":  strings.Join(strings.Split(tok, ""), "\n"),
				"line feed at the end":   tok + "\n",
				"line feed at the start": "\r\n" + tok,
				"padding added":          tok + strings.Repeat("=", (4-len(tok)%4)%4+4),
			}
			for name, token := range bad {
				t.Run(name, func(t *testing.T) {
					_, err := b.List(ctx, s, "k", token, 2)
					if errs.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "malformed") {
						t.Errorf("List(%q) = %v, want INVALID_ARGUMENT, malformed", token, err)
					}
				})
			}
		})
	}
}
