package lifecycle

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/grpcserver"
)

// harness is a real grpcserver (the standard chain, dev mode) on a
// loopback listener serving NewServer(bus).
type harness struct {
	bus    *Bus
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
}

func start(t *testing.T, bus *Bus, ho harnessOptions) *harness {
	t.Helper()
	noLeaks(t)
	h := &harness{bus: bus, ended: make(chan error, 16), done: make(chan error, 1)}
	record := func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if ho.wrap != nil {
			ss = ho.wrap(ss)
		}
		err := handler(srv, ss)
		h.ended <- err
		return err
	}
	gs, err := grpcserver.New(grpcserver.Config{Name: "t", Addr: "127.0.0.1:0", Dev: true, ShutdownTimeout: 4 * hangGuard}, nil,
		grpcserver.WithInterceptors(nil, []grpc.StreamServerInterceptor{record}))
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
	lifecyclev1.RegisterLifecycleServiceServer(gs, NewServer(bus, opts...))
	lis, err := gs.Listen()
	if err != nil {
		t.Fatal(err)
	}
	go func() { h.done <- gs.Serve(ctx, lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	h.client = lifecyclev1.NewLifecycleServiceClient(conn)
	t.Cleanup(func() {
		_ = conn.Close() // ends the client's streams, so the graceful stop is quick
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
	return h
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

// gatedStream holds the handler's first Send until the gate opens, so the
// test can overrun the subscriber's buffer deterministically.
type gatedStream struct {
	grpc.ServerStream
	entered chan struct{}
	gate    chan struct{}
	once    *sync.Once
}

func (g gatedStream) SendMsg(m any) error {
	g.once.Do(func() {
		close(g.entered)
		select {
		case <-g.gate:
		case <-g.Context().Done():
		}
	})
	return g.ServerStream.SendMsg(m)
}

func TestServerReportsDropped(t *testing.T) {
	const buf = 4
	entered, gate := make(chan struct{}), make(chan struct{})
	var once sync.Once
	bus := NewBus(Options{SubscriberBuffer: buf})
	h := start(t, bus, harnessOptions{wrap: func(ss grpc.ServerStream) grpc.ServerStream {
		return gatedStream{ServerStream: ss, entered: entered, gate: gate, once: &once}
	}})
	ctx := testCtx(t)
	first := bus.Publish(obs("wf"))
	stream, err := h.client.Subscribe(ctx, &lifecyclev1.SubscribeRequest{AfterSequence: seqp(0)})
	if err != nil {
		t.Fatal(err)
	}
	// The handler took the replayed first event and is stuck sending it.
	select {
	case <-entered:
	case <-time.After(hangGuard):
		t.Fatal("the handler never sent")
	}
	for range 10 * buf {
		bus.Publish(obs("wf"))
	}
	close(gate)

	// The first event, then the channel's content (buf, plus one for the
	// replayed event), then the next event carries the count of the rest.
	const kept = buf + 1
	for i := range 1 + kept {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if seq := resp.GetEvent().GetSequence(); seq != first+uint64(i) || resp.GetDropped() != 0 {
			t.Fatalf("response %d: sequence %d dropped %d", i, seq, resp.GetDropped())
		}
	}
	next := bus.Publish(obs("wf"))
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetEvent().GetSequence() != next || resp.GetDropped() != 10*buf-kept {
		t.Fatalf("after the gap: sequence %d dropped %d, want %d and %d", resp.GetEvent().GetSequence(), resp.GetDropped(), next, 10*buf-kept)
	}
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
