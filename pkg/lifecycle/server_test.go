package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/pkg/interceptor/auth"
)

// harness is a real grpcserver (the standard chain, dev mode) on a
// loopback listener serving NewServer(bus).
type harness struct {
	bus    *Bus
	addr   string // the server's listen address
	client lifecyclev1.LifecycleServiceClient
	// ended receives what each Subscribe handler returned, before the
	// chain maps it to a status.
	ended chan error
	stop  context.CancelFunc // starts the server's graceful stop
	done  chan error         // Serve's result
}

type harnessOptions struct {
	shutdown bool                                      // WithShutdown(the Serve context)
	wrap     func(grpc.ServerStream) grpc.ServerStream // wraps the handler's stream
	log      WorkflowLog                               // WithWorkflowLog(log, 20ms)
	policy   *auth.Policy                              // authentication on (plaintext), else dev mode
	server   []ServerOption                            // more options of NewServer
}

func start(t *testing.T, bus *Bus, ho harnessOptions) *harness {
	t.Helper()
	noLeaks(t)
	h := &harness{bus: bus, ended: make(chan error, 4096), done: make(chan error, 1)}
	record := func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if ho.wrap != nil {
			ss = ho.wrap(ss)
		}
		err := handler(srv, ss)
		h.ended <- err
		return err
	}
	cfg := grpcserver.Config{Name: "t", Addr: "127.0.0.1:0", Dev: ho.policy == nil, Plaintext: true, ShutdownTimeout: 4 * hangGuard}
	gs, err := grpcserver.New(cfg, nil, grpcserver.WithInterceptors(nil, []grpc.StreamServerInterceptor{record}), grpcserver.WithPolicy(ho.policy))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.stop = cancel
	var opts []ServerOption
	if ho.shutdown {
		opts = append(opts, WithShutdown(ctx))
	}
	if ho.log != nil {
		opts = append(opts, WithWorkflowLog(ho.log, 20*time.Millisecond))
	}
	opts = append(opts, ho.server...)
	lifecyclev1.RegisterLifecycleServiceServer(gs, NewServer(bus, opts...))
	lis, err := gs.Listen()
	if err != nil {
		t.Fatal(err)
	}
	h.addr = lis.Addr().String()
	go func() { h.done <- gs.Serve(ctx, lis) }()
	// Registered first, so it runs last: after the clients' connections
	// close, which ends their streams, so the graceful stop is quick.
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-h.done:
			if err != nil {
				t.Errorf("serve: %v", err)
			}
		case <-time.After(hangGuard):
			t.Error("server did not stop")
		}
	})
	h.client = h.clientFrom(t, "")
	return h
}

// clientFrom is a client on a connection of its own, from the local IP
// address ip ("": any). On Linux every 127.x.y.z address is the loopback,
// so clients from different addresses are different clients to the
// per-client cap.
func (h *harness) clientFrom(t *testing.T, ip string) lifecyclev1.LifecycleServiceClient {
	t.Helper()
	conn, err := dialFrom(h.addr, ip)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return lifecyclev1.NewLifecycleServiceClient(conn)
}

// dialFrom is a connection to addr from the local IP address ip ("":
// any).
func dialFrom(addr, ip string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	d := net.Dialer{}
	if ip != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(ip)}
	}
	opts = append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return d.DialContext(ctx, "tcp", a) }),
	}, opts...)
	return grpc.NewClient(addr, opts...)
}

// noLeaks checks, at the end of the test, that the goroutine count falls
// back to where it was (gRPC's goroutines end asynchronously after Close,
// so it waits for them, up to the hang guard).
func noLeaks(t *testing.T) {
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(hangGuard)
		for runtime.NumGoroutine() > before {
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				t.Errorf("goroutines: %d before, %d after\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
				return
			}
			runtime.Gosched()
			time.Sleep(time.Millisecond)
		}
	})
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	t.Cleanup(cancel)
	return ctx
}

// handlerEnded returns the error the Subscribe handler returned.
func (h *harness) handlerEnded(t *testing.T) error {
	t.Helper()
	select {
	case err := <-h.ended:
		return err
	case <-time.After(hangGuard):
		t.Fatal("the Subscribe handler did not return")
		return nil
	}
}

func wantStatus(t *testing.T, err error, code codes.Code, msg string) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != code || !strings.Contains(st.Message(), msg) {
		t.Fatalf("got %v %q, want %v naming %q", st.Code(), st.Message(), code, msg)
	}
}

// subscribed opens a stream that replays from after_sequence 0 and reads
// the first event, published beforehand, so the handler is known to be
// subscribed when it returns.
func subscribed(t *testing.T, ctx context.Context, h *harness, req *lifecyclev1.SubscribeRequest) grpc.ServerStreamingClient[lifecyclev1.SubscribeResponse] {
	t.Helper()
	req.AfterSequence = seqp(h.bus.LastSequence())
	first := h.bus.Publish(Observable(srcEnv, "test.ready", req.GetWorkflowId(), req.GetAgentId(), nil))
	stream, err := h.client.Subscribe(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil || resp.GetEvent().GetSequence() != first {
		t.Fatalf("first event %v, %v; want sequence %d", resp, err, first)
	}
	return stream
}

func TestServerSubscribeFilterAndPublish(t *testing.T) {
	h := start(t, NewBus(Options{}), harnessOptions{})
	ctx := testCtx(t)
	stream := subscribed(t, ctx, h, &lifecyclev1.SubscribeRequest{
		Kinds:      []lifecyclev1.EventKind{kObservable},
		WorkflowId: "wf1",
		Sources:    []lifecyclev1.EventSource{srcEnv},
	})

	when := time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)
	stamped := Observable(srcEnv, "env.exec", "wf1", "a1", map[string]any{"exit": 0})
	stamped.Time = timestamppb.New(when)
	stamped.Sequence = 9999 // the server assigns sequences
	events := []struct {
		ev    *lifecyclev1.LifecycleEvent
		match bool
	}{
		{Observable(srcEnv, "env.start", "wf1", "", nil), true},
		{Observable(srcOrch, "orchestrator.step", "wf1", "", nil), false}, // source
		{Observable(srcEnv, "env.start", "wf2", "", nil), false},          // workflow
		{Budget("wf1", "a1", costEvent()), false},                         // kind
		{stamped, true},
		{Compaction("wf1", "a1", pressureEvent()), false},
	}
	var want []uint64
	last := h.bus.LastSequence()
	for i, e := range events {
		resp, err := h.client.Publish(ctx, &lifecyclev1.PublishRequest{Event: e.ev})
		if err != nil {
			t.Fatalf("Publish %d: %v", i, err)
		}
		if resp.GetSequence() != last+1 {
			t.Fatalf("Publish %d: sequence %d, want %d", i, resp.GetSequence(), last+1)
		}
		last = resp.GetSequence()
		if e.match {
			want = append(want, last)
		}
	}
	// A last matching event published in process marks the end.
	want = append(want, h.bus.Publish(Observable(srcEnv, "env.end", "wf1", "", nil)))

	for i, seq := range want {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		ev := resp.GetEvent()
		if ev.GetSequence() != seq || resp.GetDropped() != 0 {
			t.Fatalf("event %d: sequence %d dropped %d, want %d and 0", i, ev.GetSequence(), resp.GetDropped(), seq)
		}
		if i == 1 {
			if !ev.GetTime().AsTime().Equal(when) || ev.GetObservable().GetData().GetStructValue().GetFields()["exit"] == nil {
				t.Fatalf("published event arrived as %v; want its time %v and data kept", ev, when)
			}
		} else if ev.GetTime() == nil {
			t.Fatalf("event %d has no time", i)
		}
	}
}

func TestServerErrors(t *testing.T) {
	bus := NewBus(Options{BufferSize: 2})
	h := start(t, bus, harnessOptions{})
	ctx := testCtx(t)
	for range 5 {
		bus.Publish(obs("wf"))
	}
	recvErr := func(req *lifecyclev1.SubscribeRequest) error {
		stream, err := h.client.Subscribe(ctx, req)
		if err != nil {
			return err
		}
		_, err = stream.Recv()
		return err
	}
	t.Run("subscribe too old", func(t *testing.T) {
		wantStatus(t, recvErr(&lifecyclev1.SubscribeRequest{AfterSequence: seqp(1)}), codes.OutOfRange, "the oldest sequence kept is 4")
	})
	t.Run("subscribe unspecified kind", func(t *testing.T) {
		wantStatus(t, recvErr(&lifecyclev1.SubscribeRequest{Kinds: []lifecyclev1.EventKind{0}}), codes.InvalidArgument, "kinds")
	})
	t.Run("publish no kind", func(t *testing.T) {
		_, err := h.client.Publish(ctx, &lifecyclev1.PublishRequest{Event: &lifecyclev1.LifecycleEvent{WorkflowId: "wf"}})
		wantStatus(t, err, codes.InvalidArgument, "event")
	})
	t.Run("publish no event", func(t *testing.T) {
		_, err := h.client.Publish(ctx, &lifecyclev1.PublishRequest{})
		wantStatus(t, err, codes.InvalidArgument, "event")
	})
	if got := bus.LastSequence(); got != 5 {
		t.Fatalf("failed calls published: LastSequence %d, want 5", got)
	}
}

// TestServerNilFields calls the handler directly, as if validation were
// bypassed: INVALID_ARGUMENT, never a panic.
func TestServerNilFields(t *testing.T) {
	bus := NewBus(Options{})
	srv := NewServer(bus)
	for name, req := range map[string]*lifecyclev1.PublishRequest{
		"nil request": nil,
		"no event":    {},
		"no kind":     {Event: &lifecyclev1.LifecycleEvent{AgentId: "a"}},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := srv.Publish(context.Background(), req); !errors.Is(err, errs.InvalidArgument) {
				t.Fatalf("Publish = %v, want INVALID_ARGUMENT", err)
			}
		})
	}
	if bus.LastSequence() != 0 {
		t.Fatal("an invalid request was published")
	}
	bus.Close()
	_, err := srv.Publish(context.Background(), &lifecyclev1.PublishRequest{Event: obs("wf")})
	if !errors.Is(err, errs.Unavailable) {
		t.Fatalf("Publish on a closed bus = %v, want UNAVAILABLE", err)
	}
}

// gatedStream lets the handler's first pass sends through and holds the
// next one until the gate opens or the stream ends, so a test can
// overrun the subscriber's buffer deterministically.
type gatedStream struct {
	grpc.ServerStream
	pass    int
	sent    *int
	entered chan struct{}
	gate    chan struct{}
}

func (g gatedStream) SendMsg(m any) error {
	if *g.sent++; *g.sent == g.pass+1 {
		close(g.entered)
		select {
		case <-g.gate:
		case <-g.Context().Done():
		}
	}
	return g.ServerStream.SendMsg(m)
}

// gated is a harness option: the handler's first pass sends go through,
// the next waits for the returned gate (or the end of the stream); entered
// is closed when it starts waiting. For one stream at a time.
func gated(pass int) (wrap func(grpc.ServerStream) grpc.ServerStream, entered, gate chan struct{}) {
	entered, gate = make(chan struct{}), make(chan struct{})
	sent := 0
	return func(ss grpc.ServerStream) grpc.ServerStream {
		return gatedStream{ServerStream: ss, pass: pass, sent: &sent, entered: entered, gate: gate}
	}, entered, gate
}

func waitFor(t *testing.T, c <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(hangGuard):
		t.Fatalf("%s did not happen", what)
	}
}

// TestServerEndsASubscriberThatFellBehind checks what a subscriber that
// does not keep up gets: once an event does not fit its buffer (by count
// or by bytes) while a Send is blocked, the stream ends at once with
// RESOURCE_EXHAUSTED naming the numbers, the flags and the after_sequence
// to resubscribe with; the events it received before are contiguous, and
// the resubscription replays the rest with no gap and no duplicate.
func TestServerEndsASubscriberThatFellBehind(t *testing.T) {
	size := proto.Size(mustPublished(t, padded("wf", 300)))
	for _, tt := range []struct {
		name string
		opts Options
	}{
		{"count", Options{SubscriberBuffer: 4}},
		{"bytes", Options{SubscriberBuffer: 100, SubscriberBufferBytes: 4 * size}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			wrap, entered, _ := gated(3)
			bus := NewBus(tt.opts)
			h := start(t, bus, harnessOptions{wrap: wrap})
			ctx := testCtx(t)
			for range 3 {
				bus.Publish(padded("wf", 300))
			}
			stream, err := h.client.Subscribe(ctx, &lifecyclev1.SubscribeRequest{AfterSequence: seqp(0)})
			if err != nil {
				t.Fatal(err)
			}
			var got []uint64
			for range 3 { // the replay
				resp, err := stream.Recv()
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, resp.GetEvent().GetSequence())
			}
			bus.Publish(padded("wf", 300)) // 4: its Send blocks
			waitFor(t, entered, "the fourth Send")
			for range 8 { // 5..8 fill the buffer, 9 does not fit
				bus.Publish(padded("wf", 300))
			}
			const msg = "the subscriber did not keep up: 4 events"
			const resume = "resubscribe with after_sequence=3 to resume (4 if event 4 reached you before this status)"
			err = h.handlerEnded(t)
			if !errors.Is(err, errs.ResourceExhausted) || !strings.Contains(err.Error(), msg) || !strings.Contains(err.Error(), resume) ||
				!strings.Contains(err.Error(), "event 9") || !strings.Contains(err.Error(), "(--subscriber-buffer, --subscriber-buffer-bytes)") {
				t.Fatalf("the handler returned %v; want RESOURCE_EXHAUSTED %q ... %q", err, msg, resume)
			}
			_, err = stream.Recv()
			wantStatus(t, err, codes.ResourceExhausted, resume)
			if bus.Subscribers() != 0 {
				t.Fatalf("Subscribers = %d after the stream ended", bus.Subscribers())
			}

			// Event 4 never reached the client: it resumes after 3.
			stream, err = h.client.Subscribe(ctx, &lifecyclev1.SubscribeRequest{AfterSequence: seqp(got[len(got)-1])})
			if err != nil {
				t.Fatal(err)
			}
			for len(got) < 12 {
				resp, err := stream.Recv()
				if err != nil {
					t.Fatalf("after %v: %v", got, err)
				}
				got = append(got, resp.GetEvent().GetSequence())
			}
			if !slices.Equal(got, span(1, 12)) {
				t.Fatalf("received %v across the two streams, want 1..12", got)
			}
		})
	}
}

// TestServerSendTimeout checks that a stream whose client does not read
// ends once a Send has waited for the send timeout, even with room in
// its buffer, naming the flag and where to resume: live streams and
// workflow-log streams alike.
func TestServerSendTimeout(t *testing.T) {
	const stalled = "the client has not read the stream for 1ms (--subscriber-send-timeout): event 2 is still waiting to be sent; "
	log := &memLog{}
	log.add("orchestrator.a", "x")
	log.add("orchestrator.b", "x")
	for _, tt := range []struct {
		name string
		req  *lifecyclev1.SubscribeRequest
		want string
	}{
		{"live", &lifecyclev1.SubscribeRequest{AfterSequence: seqp(0)},
			stalled + "resubscribe with after_sequence=1 to resume (2 if event 2 reached you before this status)"},
		{"workflow log", &lifecyclev1.SubscribeRequest{WorkflowId: "w1", AfterWorkflowSequence: proto.Uint64(0)},
			stalled + "resubscribe with after_workflow_sequence=1 to resume (2 if event 2 reached you before this status)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			wrap, entered, _ := gated(1)
			bus := NewBus(Options{})
			h := start(t, bus, harnessOptions{wrap: wrap, log: log, server: []ServerOption{WithSendTimeout(time.Millisecond)}})
			ctx := testCtx(t)
			bus.Publish(obs("wf"))
			bus.Publish(obs("wf"))
			stream, err := h.client.Subscribe(ctx, tt.req)
			if err != nil {
				t.Fatal(err)
			}
			waitFor(t, entered, "the second Send") // the first went through
			if err := h.handlerEnded(t); !errors.Is(err, errs.ResourceExhausted) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("the handler returned %v; want RESOURCE_EXHAUSTED %q", err, tt.want)
			}
			if _, err := stream.Recv(); err != nil {
				t.Fatalf("the first event: %v", err)
			}
			_, err = stream.Recv()
			wantStatus(t, err, codes.ResourceExhausted, tt.want)
		})
	}
}

// open opens a Subscribe stream and waits for its headers: it returns
// the stream when it is subscribed, or the status it was refused with.
func open(t *testing.T, ctx context.Context, c lifecyclev1.LifecycleServiceClient, req *lifecyclev1.SubscribeRequest) (grpc.ServerStreamingClient[lifecyclev1.SubscribeResponse], error) {
	t.Helper()
	stream, err := c.Subscribe(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	md, err := stream.Header()
	if err != nil {
		t.Fatal(err)
	}
	if md != nil {
		return stream, nil
	}
	_, err = stream.Recv() // a refused stream ends without headers
	if err == nil {
		t.Fatal("a stream without headers sent an event")
	}
	return nil, err
}

// TestServerStreamLimits checks the caps on open Subscribe streams: per
// client (its IP address without credentials, its principal with them)
// and in total, counting both kinds of subscription; a stream over a cap
// is refused at once with RESOURCE_EXHAUSTED naming the cap, its value
// and its flag; a stream that ends frees its place.
func TestServerStreamLimits(t *testing.T) {
	perClient := "too many lifecycle subscriptions from %s: the most one client may hold open is %d (--lifecycle-max-streams-per-client=%[2]d); close the streams it does not read, or raise the cap"
	total := "too many lifecycle subscriptions: the most this server holds open is %d (--lifecycle-max-streams=%[1]d); retry later, or raise the cap"
	live := &lifecyclev1.SubscribeRequest{}
	logged := &lifecyclev1.SubscribeRequest{WorkflowId: "w1", AfterWorkflowSequence: proto.Uint64(0)}

	t.Run("by address", func(t *testing.T) {
		h := start(t, NewBus(Options{}), harnessOptions{log: &memLog{}, server: []ServerOption{WithStreamLimits(3, 2)}})
		ctx := testCtx(t)
		a1, a2, b, c := h.clientFrom(t, "127.0.1.1"), h.clientFrom(t, "127.0.1.1"), h.clientFrom(t, "127.0.1.2"), h.clientFrom(t, "127.0.1.3")
		ctx1, leave := context.WithCancel(ctx)
		for i, s := range []struct {
			ctx    context.Context
			client lifecyclev1.LifecycleServiceClient
			req    *lifecyclev1.SubscribeRequest
			want   string
		}{
			{ctx1, a1, live, ""},
			{ctx, a2, logged, ""}, // the same address, another connection
			{ctx, a1, live, fmt.Sprintf(perClient, "address 127.0.1.1", 2)},
			{ctx, b, logged, ""},
			{ctx, b, live, fmt.Sprintf(total, 3)},
			{ctx, c, logged, fmt.Sprintf(total, 3)},
		} {
			_, err := open(t, s.ctx, s.client, s.req)
			if s.want == "" {
				if err != nil {
					t.Fatalf("stream %d: %v; want it subscribed", i, err)
				}
				continue
			}
			wantStatus(t, err, codes.ResourceExhausted, s.want)
		}
		// One of 127.0.1.1's streams ends: both it and 127.0.1.3 may open one.
		leave()
		for {
			if err := h.handlerEnded(t); errors.Is(err, context.Canceled) {
				break
			}
		}
		if _, err := open(t, ctx, c, live); err != nil {
			t.Fatalf("after a stream ended: %v", err)
		}
		_, err := open(t, ctx, a1, live)
		wantStatus(t, err, codes.ResourceExhausted, fmt.Sprintf(total, 3))
	})
	t.Run("by principal", func(t *testing.T) {
		policy, err := auth.NewPolicy([]auth.Principal{
			{Name: "p1", Tokens: []string{"token-of-principal-1"}, Allow: []string{"*"}},
			{Name: "p2", Tokens: []string{"token-of-principal-2"}, Allow: []string{"*"}},
		})
		if err != nil {
			t.Fatal(err)
		}
		h := start(t, NewBus(Options{}), harnessOptions{policy: policy, server: []ServerOption{WithStreamLimits(10, 1)}})
		ctx := testCtx(t)
		as := func(token string) context.Context {
			return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
		}
		a, b := h.clientFrom(t, "127.0.1.1"), h.clientFrom(t, "127.0.1.2")
		if _, err := open(t, as("token-of-principal-1"), a, live); err != nil {
			t.Fatal(err)
		}
		// The same principal from another address: the same client.
		_, err = open(t, as("token-of-principal-1"), b, live)
		wantStatus(t, err, codes.ResourceExhausted, fmt.Sprintf(perClient, `principal "p1"`, 1))
		// Another principal from the first address: another client.
		if _, err := open(t, as("token-of-principal-2"), a, live); err != nil {
			t.Fatal(err)
		}
	})
}

func TestServerClientCancelEndsStream(t *testing.T) {
	bus := NewBus(Options{})
	h := start(t, bus, harnessOptions{})
	ctx, cancel := context.WithCancel(testCtx(t))
	stream := subscribed(t, ctx, h, &lifecyclev1.SubscribeRequest{})
	if bus.Subscribers() != 1 {
		t.Fatalf("Subscribers = %d, want 1", bus.Subscribers())
	}
	cancel()
	if _, err := stream.Recv(); status.Code(err) != codes.Canceled {
		t.Fatalf("Recv after cancel = %v, want CANCELED", err)
	}
	if err := h.handlerEnded(t); !errors.Is(err, context.Canceled) {
		t.Fatalf("handler returned %v, want context.Canceled", err)
	}
	if errs.Code(context.Canceled) != codes.Canceled {
		t.Fatal("the chain would not map the handler's error to CANCELED")
	}
	if bus.Subscribers() != 0 {
		t.Fatalf("Subscribers = %d after the client left, want 0", bus.Subscribers())
	}
}

func TestServerShutdownIsUnavailable(t *testing.T) {
	t.Run("bus closed", func(t *testing.T) {
		bus := NewBus(Options{})
		h := start(t, bus, harnessOptions{})
		ctx := testCtx(t)
		stream := subscribed(t, ctx, h, &lifecyclev1.SubscribeRequest{})
		bus.Close()
		_, err := stream.Recv()
		wantStatus(t, err, codes.Unavailable, "the lifecycle service is shutting down")
		if err := h.handlerEnded(t); !errors.Is(err, errs.Unavailable) {
			t.Fatalf("handler returned %v", err)
		}
		stream, err = h.client.Subscribe(ctx, &lifecyclev1.SubscribeRequest{})
		if err == nil {
			_, err = stream.Recv()
		}
		wantStatus(t, err, codes.Unavailable, "closed")
		_, err = h.client.Publish(ctx, &lifecyclev1.PublishRequest{Event: obs("wf")})
		wantStatus(t, err, codes.Unavailable, "shutting down")
	})
	t.Run("server stops", func(t *testing.T) {
		bus := NewBus(Options{})
		h := start(t, bus, harnessOptions{shutdown: true})
		ctx := testCtx(t)
		streams := []grpc.ServerStreamingClient[lifecyclev1.SubscribeResponse]{
			subscribed(t, ctx, h, &lifecyclev1.SubscribeRequest{WorkflowId: "a"}),
			subscribed(t, ctx, h, &lifecyclev1.SubscribeRequest{WorkflowId: "b"}),
		}
		h.stop()
		for _, s := range streams {
			_, err := s.Recv()
			wantStatus(t, err, codes.Unavailable, "the lifecycle service is shutting down")
		}
		// The graceful stop did not wait for the subscribers.
		select {
		case err := <-h.done:
			h.done <- err // for the cleanup
		case <-time.After(hangGuard):
			t.Fatal("graceful stop waits on subscribe streams")
		}
		if bus.Subscribers() != 0 {
			t.Fatalf("Subscribers = %d", bus.Subscribers())
		}
		// The bus itself stays open for in-process publishers.
		if bus.Publish(obs("wf")) == 0 {
			t.Fatal("the bus closed with the server")
		}
	})
}
