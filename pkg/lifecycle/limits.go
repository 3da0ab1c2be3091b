package lifecycle

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc/peer"

	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/interceptor/auth"
)

// Defaults of the Server's limits (WithStreamLimits, WithSendTimeout).
const (
	DefaultMaxStreams          = 1024
	DefaultMaxStreamsPerClient = 64
	DefaultSendTimeout         = time.Minute
)

// The orchestrator's flags for the bounds of the service, without their
// leading dashes. The errors a client gets when it meets a bound name the
// flag, so whoever reads them knows what to change; cmd/orchestrator
// registers its flags under these names.
const (
	FlagSubscriberBuffer      = "subscriber-buffer"
	FlagSubscriberBufferBytes = "subscriber-buffer-bytes"
	FlagSendTimeout           = "subscriber-send-timeout"
	FlagMaxStreams            = "lifecycle-max-streams"
	FlagMaxStreamsPerClient   = "lifecycle-max-streams-per-client"
)

// WithStreamLimits caps the Subscribe streams open at once: total over
// all clients, and perClient per client, a client being its
// authenticated principal (pkg/interceptor/auth) or, when there is none
// (dev mode), the IP address it connects from. A Subscribe beyond either
// cap fails at once with RESOURCE_EXHAUSTED naming the cap, its value and
// its flag. Values below 1 take the defaults, DefaultMaxStreams and
// DefaultMaxStreamsPerClient.
func WithStreamLimits(total, perClient int) ServerOption {
	return func(s *Server) {
		if total > 0 {
			s.limits.total = total
		}
		if perClient > 0 {
			s.limits.perClient = perClient
		}
	}
}

// streamLimits counts the open Subscribe streams, in all and by client.
type streamLimits struct {
	total, perClient int

	mu       sync.Mutex
	open     int
	byClient map[string]int
}

// admit counts one more stream of the caller of ctx, or says which cap
// it would exceed. release uncounts it.
func (l *streamLimits) admit(ctx context.Context) (release func(), err error) {
	client := clientOf(ctx)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byClient[client] >= l.perClient {
		return nil, fmt.Errorf("too many lifecycle subscriptions from %s: the most one client may hold open is %d (--%s=%d); close the streams it does not read, or raise the cap: %w",
			client, l.perClient, FlagMaxStreamsPerClient, l.perClient, errs.ResourceExhausted)
	}
	if l.open >= l.total {
		return nil, fmt.Errorf("too many lifecycle subscriptions: the most this server holds open is %d (--%s=%d); retry later, or raise the cap: %w",
			l.total, FlagMaxStreams, l.total, errs.ResourceExhausted)
	}
	if l.byClient == nil {
		l.byClient = make(map[string]int)
	}
	l.open++
	l.byClient[client]++
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.open--
		if l.byClient[client]--; l.byClient[client] == 0 {
			delete(l.byClient, client)
		}
	}, nil
}

// clientOf names the caller of ctx for the per-client cap: its principal
// when authenticated, else the IP address of its connection (the port
// differs between one client's connections), else "an unknown client".
func clientOf(ctx context.Context) string {
	if p := auth.PrincipalFrom(ctx); p != nil {
		return "principal " + strconv.Quote(p.Name)
	}
	if pe, ok := peer.FromContext(ctx); ok && pe.Addr != nil {
		if tcp, ok := pe.Addr.(*net.TCPAddr); ok {
			return "address " + tcp.IP.String()
		}
		a := pe.Addr.String()
		if host, _, err := net.SplitHostPort(a); err == nil {
			a = host
		}
		return "address " + a
	}
	return "an unknown client"
}
